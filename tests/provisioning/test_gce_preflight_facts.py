"""What the real cloud does that a permissive fake would hide, modelled in the fake Compute API
and handled before any VM (real-cloud-audit B1, B2, D2, D3, D5): image families retire
(getFromFamily answers 404 once every image is deprecated), boot disks count against the
region's SSD_TOTAL_GB / DISKS_TOTAL_GB quota, guest attributes may be off by organisation
policy, the firewall may not let SSH or the trainer ports through, and Cloud Storage is used
with `provider.credentials` and a role that may not read bucket metadata. Through the real
google-cloud-compute / google-cloud-storage clients against the fake and gcp-storage-emulator;
no namespaces."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning.base import ProvisionError
from provisioning.gce.api import ComputeApi
from provisioning.gce.config import DEFAULT_IMAGE_FAMILY, GceConfig
from provisioning.gce.preflight import PreflightError
from tests.fakes.gce_server import DLVM_PROJECT, FakeGce, catalogue_image
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    BUCKET,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    small_request,
    storage_emulator,
)

RETIRED = "common-cu128-ubuntu-2404-nvidia-570"


def nothing_created(fake: FakeGce) -> bool:
    return fake.calls["instances.insert"] == 0 and fake.live_instances() == []


# --- B1: image families age out ---------------------------------------------------------------


def test_a_family_resolves_to_its_newest_image_that_is_not_deprecated(
        fake: FakeGce, tmp_path: Path) -> None:
    api = ComputeApi(gce_config(fake, tmp_path))
    assert api.image_from_family(DLVM_PROJECT, DEFAULT_IMAGE_FAMILY).name == \
        f"{DEFAULT_IMAGE_FAMILY}-v20260909"
    newest = next(i for i in fake.image_catalogue[DLVM_PROJECT]
                  if i["name"] == f"{DEFAULT_IMAGE_FAMILY}-v20260909")
    newest["deprecated"] = {"state": "DEPRECATED"}  # a bad release, pulled
    image = api.image_from_family(DLVM_PROJECT, DEFAULT_IMAGE_FAMILY)
    assert image.name == f"{DEFAULT_IMAGE_FAMILY}-v20260819" and image.disk_gb == 50


def test_a_retired_family_is_one_line_naming_the_newest_of_its_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """The old default: every image deprecated, so getFromFamily answers 404; one images.list
    finds the newest live family with the same product and OS release (not the newer PyTorch
    image, not Ubuntu 22.04)."""
    fake.image_catalogue[DLVM_PROJECT].append(catalogue_image(  # newer, but another OS release
        DLVM_PROJECT, "common-cu129-ubuntu-2204-nvidia-580-v20261001",
        "common-cu129-ubuntu-2204-nvidia-580", "2026-10-01"))
    provider = make_provider(image_family=RETIRED)
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("retired", tmp_path, workers=1))
    [line] = info.value.problems
    assert line == (
        f"provider.image_family: image family {RETIRED} not found in project {DLVM_PROJECT} "
        "(retired: every image of it is deprecated; the newest family of its line is "
        f"{DEFAULT_IMAGE_FAMILY} (image {DEFAULT_IMAGE_FAMILY}-v20260909): set "
        f"provider.image_family={DEFAULT_IMAGE_FAMILY})")
    assert fake.calls["images.list"] == 1 and nothing_created(fake)


def test_a_family_never_published_without_a_line_gets_the_listing_hint(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.image_families = set()  # families outside the catalogue do not resolve either
    provider = make_provider(image_family="common-cu130-ubuntu-2604-nvidia-590")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("unknown", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith("provider.image_family: image family "
                           "common-cu130-ubuntu-2604-nvidia-590 not found")
    assert line.endswith(f"(list the families with gcloud compute images list --project "
                         f"{DLVM_PROJECT} --no-standard-images)")
    assert nothing_created(fake)


def test_a_boot_disk_smaller_than_the_image_is_refused_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    provider = make_provider(boot_disk_gb=30)
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("small-disk", tmp_path, workers=1))
    assert info.value.problems == [
        f"provider.boot_disk_gb: 30 GB is smaller than image {DEFAULT_IMAGE_FAMILY}-v20260909 "
        "(50 GB), which GCE refuses: set it to at least 50"]
    assert nothing_created(fake)


# --- B2: disk quota ---------------------------------------------------------------------------


def test_boot_disks_are_counted_against_ssd_total_gb_in_the_preflight(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """3 VMs x 50 GB pd-balanced = 150 GB of SSD_TOTAL_GB; the regions of provider.zones grant
    100 and 120 (free trials get 250, most projects 500)."""
    fake.set_quota("SSD_TOTAL_GB", 100, region="us-central1")
    fake.set_quota("SSD_TOTAL_GB", 120, region="us-east1")
    provider = make_provider()
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("ssd", tmp_path, workers=2))
    [line] = info.value.problems
    assert line.startswith("quota SSD_TOTAL_GB in region us-central1: the plan needs 150, "
                           "100 free (limit 100, 0 in use)")
    assert nothing_created(fake)


def test_pd_standard_counts_against_disks_total_gb_and_is_created_as_such(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.set_quota("SSD_TOTAL_GB", 100, region="us-central1")  # not what pd-standard uses
    fake.set_quota("DISKS_TOTAL_GB", 4096, region="us-central1")
    provider = make_provider(boot_disk_type="pd-standard", boot_disk_gb=60)
    cluster = provider.acquire(small_request("hdd", tmp_path, workers=2))
    try:
        disks = [i.body["disks"][0]["initializeParams"] for i in fake.live_instances()]
        assert {d["diskType"] for d in disks} == {"zones/us-central1-a/diskTypes/pd-standard"}
        assert {d["diskSizeGb"] for d in disks} == {"60"}
        quotas = provider.api.region_quotas("us-central1")  # regions.get, as the API reports it
        assert quotas["DISKS_TOTAL_GB"] == (4096.0, 180.0)
        assert quotas["SSD_TOTAL_GB"] == (100.0, 0.0)
    finally:
        provider.release(cluster)


def test_the_fake_enforces_the_disk_quota_at_insert(fake: FakeGce, make_provider,
                                                     tmp_path: Path) -> None:
    """Without the pre-flight, GCE's own QUOTA_EXCEEDED for SSD_TOTAL_GB arrives in the insert
    operation; no region holds the cluster and nothing stays."""
    for region in ("us-central1", "us-east1"):
        fake.set_quota("SSD_TOTAL_GB", 100, region=region)
    provider = make_provider(preflight_checks=False)
    with pytest.raises(ProvisionError, match="SSD_TOTAL_GB"):
        provider.acquire(small_request("ssd-insert", tmp_path, workers=2))
    assert fake.live_instances() == []


def test_a_boot_disk_type_that_does_not_exist_is_refused_by_name() -> None:
    problems = dict(GceConfig(boot_disk_type="pd-extreme").check())
    assert problems["provider.boot_disk_type"] == ("'pd-extreme': must be one of pd-balanced, "
                                                   "pd-ssd, pd-standard")


# --- D3: guest attributes disabled by policy ------------------------------------------------


@pytest.mark.parametrize("code", [403, 412])
def test_guest_attributes_refused_fall_back_to_pinning_on_first_use_with_one_warning(
        fake: FakeGce, make_provider, tmp_path: Path, code: int,
        caplog: pytest.LogCaptureFixture) -> None:
    """An organisation with compute.disableGuestAttributesAccess: neither the host keys nor the
    T4 workers' GPU check can be read. The cluster comes up anyway: host keys are taken on
    first use (placement.json says so for each VM), the GPU is left to the trainer's own
    check, and one warning line says it."""
    fake.guest_attributes_denied = code
    provider = make_provider()  # gpu_check on: the Spot T4 workers would be checked
    with caplog.at_level(logging.WARNING, logger="provisioning.gce"):
        cluster = provider.acquire(small_request("no-attrs", tmp_path, workers=2))
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "\n" not in warnings[0] and f"HTTP {code}" in warnings[0]
        assert "pinned on first use" in warnings[0] and "trainer" in warnings[0]
        vms = [provider.vm_of(h.id) for h in cluster.hosts]
        assert all(vm.host_keys is None and vm.ssh is not None and not vm.ssh.pinned
                   for vm in vms)
        placement = json.loads((tmp_path / "placement.json").read_text())
        assert {vm["host_key"] for vm in placement["vms"]} == {"trust on first use"}
        assert "compute.disableGuestAttributesAccess" in placement["guest_attributes_off"]
        assert fake.calls["instances.getGuestAttributes"] == 3  # one refusal per VM, no wait
    finally:
        provider.release(cluster)


def test_with_guest_attributes_on_the_keys_are_pinned_from_them(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    cluster = provider.acquire(small_request("attrs", tmp_path, workers=1))
    try:
        placement = json.loads((tmp_path / "placement.json").read_text())
        assert {vm["host_key"] for vm in placement["vms"]} == {"guest attributes"}
        assert "guest_attributes_off" not in placement
    finally:
        provider.release(cluster)


# --- D2: firewall -----------------------------------------------------------------------------


def rule(name: str, allowed: list[dict[str, object]], priority: int = 1000,
         **fields: object) -> dict[str, object]:
    return {"kind": "compute#firewall", "name": name, "direction": "INGRESS",
            "priority": priority, "allowed": allowed, **fields}


SSH_RULE = rule("lab-ssh", [{"IPProtocol": "tcp", "ports": ["22"]}],
                sourceRanges=["203.0.113.7/32"], targetTags=["transient-ps"])
GRPC_RULE = rule("lab-grpc", [{"IPProtocol": "tcp", "ports": ["2222-2224"]}],
                 sourceTags=["transient-ps"], targetTags=["transient-ps"])


def test_the_default_network_passes_and_names_the_rules(fake: FakeGce, tmp_path: Path) -> None:
    from provisioning.gce.preflight import check

    cfg = gce_config(fake, tmp_path)
    vms = make_provider_vms(fake, tmp_path, cfg)
    result = check(ComputeApi(cfg), cfg, vms)
    assert result.problems == []
    assert ("firewall of network default: tcp:22 to tags transient-ps allowed by rule "
            "default-allow-ssh from 0.0.0.0/0") in result.passed
    assert "firewall of network default: tcp:2222-2224 between VMs tagged transient-ps " \
           "allowed" in result.passed
    assert fake.calls["networks.getEffectiveFirewalls"] == 1


def make_provider_vms(fake: FakeGce, tmp_path: Path, cfg: GceConfig) -> list:
    """The first-zone VM requests of `small_request` (the PS's VM carries 3 roles)."""
    from provisioning.gce.provider import GceProvider

    provider = GceProvider(cfg)
    return provider._first_zone_requests(provider._plan_vms(
        "fw", small_request("fw", tmp_path, workers=1).hosts))


def test_a_network_without_an_ssh_rule_is_one_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.firewalls["default"] = [r for r in fake.firewalls["default"]
                                 if r["name"] != "default-allow-ssh"]  # deleted, as is common
    provider = make_provider()
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("no-ssh", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith("provider.tags: the firewall of network default does not let SSH "
                           "(tcp:22) from the orchestrator reach VMs tagged transient-ps (no rule "
                           "allows it); add one: gcloud compute firewall-rules create")
    assert nothing_created(fake)


def test_a_custom_network_without_the_trainer_ports_is_refused_naming_them(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """A custom-mode network with only an SSH rule: the PS's VM carries ps, chief and
    evaluator on 2222-2224, which the workers could not reach."""
    fake.firewalls["lab-net"] = [SSH_RULE]
    provider = make_provider(network="global/networks/lab-net")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("no-grpc", tmp_path, workers=1))
    [line] = info.value.problems
    assert line == (
        "provider.trainer_port: the firewall of network lab-net does not let the trainer's "
        "gRPC ports between VMs tagged transient-ps through (tcp 2222, 2223, 2224); add one: "
        "gcloud compute firewall-rules create transient-ps-grpc --network lab-net --allow "
        "tcp:2222-2224 --target-tags transient-ps --source-tags transient-ps")
    assert nothing_created(fake)


def test_a_higher_priority_deny_wins_over_the_allow_and_is_named(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    deny = {**rule("block-2223", [], priority=900, sourceRanges=["0.0.0.0/0"]),
            "denied": [{"IPProtocol": "tcp", "ports": ["2223"]}]}
    fake.firewalls["lab-net"] = [SSH_RULE, GRPC_RULE, deny]
    provider = make_provider(network="global/networks/lab-net")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("deny", tmp_path, workers=1))
    [line] = info.value.problems
    assert "(tcp 2223 (rule block-2223 denies it))" in line
    fake.firewalls["lab-net"] = [SSH_RULE, GRPC_RULE]  # without it, the cluster comes up
    cluster = provider.acquire(small_request("allowed", tmp_path, workers=1))
    provider.release(cluster)


def test_ssh_from_tags_only_reaches_the_vms_only_from_inside_the_vpc(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """Source tags match VMs' internal traffic, never the orchestrator's laptop."""
    internal_ssh = rule("vm-ssh", [{"IPProtocol": "tcp", "ports": ["22"]}],
                        sourceTags=["transient-ps"])
    fake.firewalls["lab-net"] = [internal_ssh, GRPC_RULE]
    with pytest.raises(PreflightError, match="does not let SSH"):
        make_provider(network="global/networks/lab-net").acquire(
            small_request("outside", tmp_path, workers=1))
    provider = make_provider(network="global/networks/lab-net", inside_vpc=True)
    cluster = provider.acquire(small_request("inside", tmp_path, workers=1))
    provider.release(cluster)


# --- D5: Cloud Storage with provider.credentials and the Storage Object Admin role ----------

ACCOUNT = "runner@test-project.iam.gserviceaccount.com"


class ObjectAdminFront:
    """An HTTP front to gcp-storage-emulator that speaks for Google's side of a service
    account with only Storage Object Admin: its token endpoint (`token_uri` of the key file)
    issues a token for the JWT's `iss`, every Storage call needs that bearer token (401
    otherwise), and reading a bucket's metadata is 403 (`storage.buckets.get` is not in the
    role); object calls are forwarded. `calls` lists (method, path) in order."""

    def __init__(self, emulator: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        front = self
        self.calls: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes,
                       headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {"Content-Type": "application/json"}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status: int, message: str) -> None:
                self._reply(status, json.dumps({"error": {"code": status,
                                                          "message": message}}).encode())

            def _handle(self) -> None:
                import base64
                import re
                import urllib.error
                import urllib.parse
                import urllib.request

                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urllib.parse.urlsplit(self.path).path
                if path == "/token":
                    form = urllib.parse.parse_qs(raw.decode())
                    payload = form["assertion"][0].split(".")[1]
                    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                    self._reply(200, json.dumps({"access_token": f"tok-{claims['iss']}",
                                                 "expires_in": 3600,
                                                 "token_type": "Bearer"}).encode())
                    return
                front.calls.append((self.command, path))
                if self.headers.get("Authorization") != f"Bearer tok-{ACCOUNT}":
                    self._error(401, "Anonymous caller does not have storage.objects.create "
                                     "access to the Google Cloud Storage object.")
                    return
                if self.command == "GET" and re.fullmatch(r"/storage/v1/b/[^/]+/?", path):
                    self._error(403, f"{ACCOUNT} does not have storage.buckets.get access to "
                                     "the Google Cloud Storage bucket.")
                    return
                request = urllib.request.Request(
                    emulator + self.path, data=raw or None, method=self.command,
                    headers={k: v for k, v in self.headers.items()
                             if k.lower() in ("content-type", "x-upload-content-type")})
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, body = response.status, response.read()
                        headers = {"Content-Type": response.headers.get(
                            "Content-Type", "application/json")}
                except urllib.error.HTTPError as error:
                    status, body = error.code, error.read()
                    headers = {"Content-Type": "application/json"}
                self._reply(status, body, headers)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def service_account_key(path: Path, token_uri: str) -> Path:
    """A service-account key file (a fresh RSA key) whose tokens come from `token_uri`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "test-project", "private_key_id": "k1",
        "private_key": pem, "client_email": ACCOUNT, "client_id": "1",
        "token_uri": token_uri}))
    return path


@pytest.fixture(name="object_admin")
def object_admin_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectAdminFront]:
    """gcp-storage-emulator behind `ObjectAdminFront`, STORAGE_EMULATOR_HOST pointing at it."""
    with storage_emulator() as emulator:
        front = ObjectAdminFront(emulator)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", front.url)
        try:
            yield front
        finally:
            front.close()


def test_the_bucket_probe_uses_provider_credentials_and_needs_only_object_calls(
        object_admin: ObjectAdminFront, fake: FakeGce, tmp_path: Path) -> None:
    """A key file as provider.credentials and no ADC: the probe writes and deletes an object
    as that account and passes although the bucket's metadata is refused to it (403, not in
    the role; the client library's own background read of it tolerates that)."""
    from provisioning.gce.storage import bucket_problem

    key = service_account_key(tmp_path / "key.json", f"{object_admin.url}/token")
    cfg = gce_config(fake, tmp_path, credentials=str(key), storage=f"gs://{BUCKET}/runs")
    assert bucket_problem(cfg.storage, cfg=cfg) is None
    calls = set(object_admin.calls)
    assert ("POST", f"/upload/storage/v1/b/{BUCKET}/o") in calls  # the probe's write
    assert any(m == "DELETE" and ".transient-write-probe-" in p for m, p in calls)  # and delete
    # the same front refuses a caller without the account's token: the credentials mattered
    assert "cannot write to" in (bucket_problem(cfg.storage) or "")


def test_checkpoints_go_to_the_bucket_as_provider_credentials(
        object_admin: ObjectAdminFront, fake: FakeGce, make_provider, tmp_path: Path) -> None:
    key = service_account_key(tmp_path / "key.json", f"{object_admin.url}/token")
    provider = make_provider(credentials=str(key), storage=f"gs://{BUCKET}/runs")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "ckpt-1.index").write_bytes(b"index")
    store = provider.checkpoint_store("run-7", folder)
    store.gcs.upload(folder, store.mirror.url)  # type: ignore[attr-defined]
    assert store.gcs.list(store.mirror.url) == {"ckpt-1.index": 5}  # type: ignore[attr-defined]


def test_a_missing_bucket_is_named_from_the_write_probe(
        object_admin: ObjectAdminFront, fake: FakeGce, tmp_path: Path) -> None:
    from provisioning.gce.storage import bucket_problem

    key = service_account_key(tmp_path / "key.json", f"{object_admin.url}/token")
    cfg = gce_config(fake, tmp_path, credentials=str(key))
    assert bucket_problem("gs://no-such-bucket/runs", cfg=cfg) == (
        "bucket no-such-bucket does not exist (gcloud storage buckets create "
        "gs://no-such-bucket)")


def test_a_resume_reads_the_bucket_with_the_runs_saved_credentials(
        object_admin: ObjectAdminFront, fake: FakeGce, tmp_path: Path) -> None:
    from orchestrator.resume import ResumeRefused, bucket_checkpoint_step
    from provisioning.gce.storage import GcsStore, checkpoint_url

    key = service_account_key(tmp_path / "key.json", f"{object_admin.url}/token")
    saved = {"name": "gce", "credentials": str(key), "project": "test-project",
             "storage": f"gs://{BUCKET}/runs", "not_a_gce_field": 1}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ckpt-300.index").write_bytes(b"i")
    GcsStore(cfg=gce_config(fake, tmp_path, credentials=str(key))).upload(
        tmp_path / "ckpt", checkpoint_url(saved["storage"], "run-9"))
    assert bucket_checkpoint_step(saved["storage"], "run-9", tmp_path, provider=saved) == 300
    with pytest.raises(ResumeRefused, match="cannot be read"):  # ADC-only: refused by the front
        bucket_checkpoint_step(saved["storage"], "run-9", tmp_path)
