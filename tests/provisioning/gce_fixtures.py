"""Fixtures for the GCE backend's tests: the fake Compute API and a provider wired to it, the
fake's VMs as isolated hosts (`IsolatedFakeGce`), and gcp-storage-emulator for Cloud Storage."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provisioning.base import ClusterRequest, HostSpec, Role
from provisioning.gce.config import CREDENTIALS_ANONYMOUS, GceConfig
from provisioning.gce.provider import GceProvider
from provisioning.journal import Journal
from tests.fakes.gce_server import FakeGce, FakeHttpError, FakeInstance, FakeOperation
from tests.fakes.keys import write_ssh_key
from tests.testbed.isolated import Disk, IsolatedHost, IsolatedTestBed

PROJECT = "test-project"
ZONES = ["us-central1-a", "us-central1-b", "us-east1-c"]
BUCKET = "lab-bucket"


@contextlib.contextmanager
def storage_emulator(bucket: str = BUCKET) -> Iterator[str]:
    """gcp-storage-emulator in memory on 127.0.0.1 (a free port) with `bucket`, and
    STORAGE_EMULATOR_HOST / GOOGLE_CLOUD_PROJECT set for the real client while it runs (both
    restored after). Yields the emulator's URL. Skips loudly when the emulator is missing."""
    server_module = pytest.importorskip("gcp_storage_emulator.server",
                                        reason="gcp-storage-emulator (dev extra) not installed")
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = server_module.create_server("127.0.0.1", 0, in_memory=True, default_bucket=bucket)
    server.start()
    url = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}
    os.environ.update(STORAGE_EMULATOR_HOST=url, GOOGLE_CLOUD_PROJECT=PROJECT)
    try:
        yield url
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def gce_config(fake: FakeGce, tmp_path: Path, **overrides: Any) -> GceConfig:
    values: dict[str, Any] = dict(
        project=PROJECT, zones=list(ZONES), api_endpoint=fake.endpoint,
        credentials=CREDENTIALS_ANONYMOUS, ssh_key=str(write_ssh_key(tmp_path)),
        poll_interval_s=0.0, ready_poll_s=0.05, host_key_timeout_s=2.0,
        operation_timeout_s=20.0, vm_ready_timeout_s=20.0, retry_backoff_s=0.01,
        labels={"team": "lab"})
    values.update(overrides)
    return GceConfig(**values)


def small_request(run_id: str, workdir: Path, workers: int = 2, gpu: str | None = "t4",
                  zone: str | None = "us-central1-a") -> ClusterRequest:
    """1 on-demand PS with the chief and evaluator on its VM, `workers` Spot GPU workers."""
    hosts = [HostSpec("ps-0", Role.PS, "n1-standard-4", None, zone, False)]
    hosts += [HostSpec(f"worker-{i}", Role.WORKER, "n1-standard-4", gpu, zone, True)
              for i in range(workers)]
    hosts += [HostSpec("chief-0", Role.CHIEF, "n1-standard-4", None, zone, False,
                       colocate_with="ps-0"),
              HostSpec("evaluator-0", Role.EVALUATOR, "n1-standard-4", None, zone, False,
                       colocate_with="ps-0")]
    return ClusterRequest(run_id=run_id, hosts=hosts, workdir=workdir)


def processes_die_with_vm(testbed: Any) -> Callable[[str], None]:
    """The fake's `on_gone` for VMs backed by the namespace hosts of `testbed` (an
    `SshTestBed`): a VM that is deleted or preempted takes every process on its host with it
    (its sshd stays, as the next VM at that address needs it)."""
    by_address = {h.address: h for h in testbed.hosts}

    def gone(ip: str) -> None:
        for pid in testbed.role_pids(by_address[ip]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return gone


@pytest.fixture(name="fake")
def fake_fixture() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
                 insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2) as server:
        yield server


@pytest.fixture(name="make_provider")
def make_provider_fixture(fake: FakeGce, tmp_path: Path) -> Iterator[Any]:
    """`make_provider(**config_overrides)`; every provider's VMs are gone after the test."""
    made: list[GceProvider] = []

    def build(**overrides: Any) -> GceProvider:
        cfg = gce_config(fake, tmp_path, **overrides)
        provider = GceProvider(cfg, journal=Journal(tmp_path / "journal.jsonl"))
        made.append(provider)
        return provider

    yield build
    for provider in made:  # tests release themselves; this only guards against leaks
        for vm in list(provider._vms.values()):
            if not vm.deleted:
                provider._delete([vm])


# --- the fake's VMs as isolated hosts ---------------------------------------------------------

#: Image families the fake's isolated VMs boot: an image family names a root filesystem of
#: tests/testbed/images.py (as `debian-cloud`'s families name Debian releases).
IMAGE_FAMILIES = {"debian-12": "bookworm", "debian-13": "trixie"}


class IsolatedFakeGce(FakeGce):
    """The fake Compute API whose VMs are isolated hosts of `bed` (tests/testbed/isolated.py):
    a created VM boots a host with a fresh disk from the image its boot disk names; at boot
    the guest agent makes the accounts of its `ssh-keys` metadata and runs its
    `startup-script` as root; it publishes the host key the host made at first boot as guest
    attributes once booted, and refuses logins (pam_nologin) until `login_refused_s` after
    RUNNING. Its metadata server is `http://metadata.google.internal/computeMetadata/v1`, as on
    GCE (the bridge's address, port 80, answering for the VM by its source address, with
    `Metadata-Flavor: Google` required). A deleted or preempted VM's host is powered off when
    it leaves STOPPING (`stop_s` later: a preempted VM's watcher has that long to see the
    flag); a preempted VM with the STOP action keeps its disk, which `image_from_instance`
    turns into a custom image (`images.insert` from a VM's disk), bootable by `sourceImage`.

    `vms` hosts are made (stopped) up front, one per address the fake hands out. Image families
    not in `families` are refused with the cloud's 404, unless `default_image` names an image
    for them (e.g. the provider's default Deep Learning VM family in a test). Errors while a
    VM boots are kept in `boot_errors` (ip -> message); such a VM never publishes host keys."""

    def __init__(self, bed: IsolatedTestBed, vms: int, families: dict[str, str] | None = None,
                 default_image: str | None = None, login_refused_s: float = 2.0,
                 **options: Any) -> None:
        self.bed = bed
        self.families = dict(IMAGE_FAMILIES if families is None else families)
        self.default_image = default_image
        self.custom_images: dict[str, Disk] = {}  # "projects/P/global/images/NAME" -> disk
        self.boot_errors: dict[str, str] = {}
        self.slots: dict[str, IsolatedHost] = {}
        for _ in range(vms):
            host = bed.add_host(start=False)
            self.slots[host.address] = host
        self._slot_locks = {ip: threading.Lock() for ip in self.slots}
        self._booted: dict[str, FakeInstance] = {}  # ip -> the VM its host runs (or ran)
        self._metadata: ThreadingHTTPServer | None = None
        super().__init__(ip_pool=list(self.slots), on_gone=self._vm_leaving, **options)
        self.login_refused_s = login_refused_s

    def start(self) -> IsolatedFakeGce:
        super().start()
        handler = type("MetadataHandler", (_MetadataServer,), {"fake": self})
        self._metadata = ThreadingHTTPServer((self.bed.gateway, 80), handler)
        self._metadata.daemon_threads = True
        threading.Thread(target=self._metadata.serve_forever, name="fake-gce-metadata",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.shutdown()
            self._metadata.server_close()
            self._metadata = None
        super().stop()

    def __enter__(self) -> IsolatedFakeGce:
        return self.start()

    def host_of(self, zone: str, name: str) -> IsolatedHost:
        """The isolated host a live VM runs on."""
        return self.slots[self._instance(zone, name).ip]

    def assert_hosts_off(self, within_s: float = 10.0) -> None:
        """Every VM's host is powered off within `within_s` (deleting a VM stops its host a
        moment later)."""
        deadline = time.monotonic() + within_s
        while any(h.running for h in self.slots.values()):
            assert time.monotonic() < deadline, [h.name for h in self.slots.values()
                                                 if h.running]
            time.sleep(0.2)

    def disk_for(self, source_image: str) -> Disk:
        """The disk a VM created from `source_image` (a family or a custom image URL) boots."""
        path = source_image.split("/compute/v1/", 1)[-1]
        if "/images/family/" in path:
            family = path.rsplit("/", 1)[1]
            image = self.families.get(family, self.default_image)
            if image is not None:
                return Disk(image)
        else:
            name = path.rsplit("/", 1)[-1]
            for url, disk in self.custom_images.items():
                if url.rsplit("/", 1)[1] == name:
                    return disk
        raise FakeHttpError(404, f"The resource '{path}' was not found", "notFound",
                            "NOT_FOUND")

    def add_image(self, name: str, disk: Disk) -> str:
        """Make `disk` (e.g. a baked image cached on this machine, tests/testbed/baked.py) the
        project's custom image `name`, as if `images.insert` had made it here; its URL."""
        url = f"projects/{self.project}/global/images/{name}"
        with self._lock:
            self.custom_images[url] = disk
            self.images[name] = {"name": name, "status": "READY"}
        return url

    def image_from_instance(self, zone: str, instance: str, image: str) -> str:
        """A custom image from a stopped (TERMINATED) VM's disk; returns its URL
        (projects/P/global/images/NAME)."""
        inst = self._instance(zone, instance)
        if inst.status(time.time(), self.stop_s) != "TERMINATED":
            raise FakeHttpError(400, f"The disk of instance '{instance}' is in use: stop the "
                                "instance first", "resourceInUseByAnotherResource")
        url = f"projects/{self.project}/global/images/{image}"
        if url in self.custom_images:
            raise FakeHttpError(409, f"The resource '{url}' already exists", "alreadyExists",
                                "ALREADY_EXISTS")
        self._power_off(inst.ip, inst)  # TERMINATED: off, even if its timer has not fired yet
        with self._slot_locks[inst.ip]:
            self.custom_images[url] = self.bed.snapshot(self.slots[inst.ip])
        return url

    def import_image(self, url: str, disk: Disk) -> None:
        """Know a custom image another fake of the bed made (`images.insert` there), as if it
        had been made here: one bake serves a session's fakes (tests/provisioning/
        baked_image.py)."""
        path = url.split("/compute/v1/", 1)[-1]
        name = path.rsplit("/", 1)[1]
        with self._lock:
            self.custom_images[f"projects/{self.project}/global/images/{name}"] = disk
            self.images[name] = {"name": name, "status": "READY"}

    def insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> FakeOperation:
        disks = body.get("disks") or [{}]
        source = disks[0].get("initializeParams", {}).get("sourceImage", "")
        disk = self.disk_for(source)  # an unknown image: the cloud's synchronous 404
        op = super().insert(zone, body, request_id)
        inst = self.instances.get((zone, body.get("name", "")))
        if op.error is None and inst is not None and inst.ip not in self.slots:
            self.boot_errors[inst.ip] = f"no isolated host at {inst.ip} (networkIP not ours)"
        elif op.error is None and inst is not None and self._booted.get(inst.ip) is not inst:
            self._booted[inst.ip] = inst
            inst.host_keys = []  # published by the guest once the host has booted
            threading.Thread(target=self._boot, args=(inst, disk), daemon=True,
                             name=f"fake-vm-{inst.name}").start()
        return op

    def _boot(self, inst: FakeInstance, disk: Disk) -> None:
        host = self.slots[inst.ip]
        metadata = inst.metadata()
        accounts = {}
        for line in metadata.get("ssh-keys", "").splitlines():
            user, sep, key = line.partition(":")
            if sep and key.strip():
                accounts[user.strip()] = key.strip()
        with self._slot_locks[inst.ip]:
            if inst.deleting_at is not None or inst.stopped_at is not None:
                return  # deleted before it booted
            try:
                self.bed.stop(host)
                self.bed.reimage(host, disk, accounts or None,
                                 startup_script=metadata.get("startup-script"),
                                 names={"metadata.google.internal": self.bed.gateway})
                host.boot_s = max(0.0, inst.running_since() - time.time()) + self.login_refused_s
                self.bed.start(host)
            except Exception as err:  # reported through boot_errors
                self.boot_errors[inst.ip] = f"{type(err).__name__}: {err}"
                return
            kind, blob = host.host_key.split()[:2]
            inst.host_keys.append((kind, blob))

    def _vm_leaving(self, ip: str) -> None:
        """on_gone: the VM is STOPPING; its host goes off when that ends."""
        timer = threading.Timer(self.stop_s, self._power_off, args=(ip, self._booted.get(ip)))
        timer.daemon = True
        timer.start()

    def _power_off(self, ip: str, inst: FakeInstance | None) -> None:
        host = self.slots.get(ip)
        if host is None:
            return
        with self._slot_locks[ip]:
            if self._booted.get(ip) is inst:  # not a new VM at the same address since
                self.bed.stop(host)


class _MetadataServer(BaseHTTPRequestHandler):
    """GCE's metadata server as the isolated VMs see it: it knows the VM by the request's
    source address and answers from the fake's per-instance metadata endpoints."""

    fake: IsolatedFakeGce
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        inst = self.fake._booted.get(self.client_address[0])
        prefix = "/computeMetadata/v1"
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, b"Missing Metadata-Flavor:Google header.", {})
            return
        if inst is None or not self.path.startswith(prefix + "/"):
            self._reply(404, b"Not found", {})
            return
        url = self.fake.metadata_url(inst.zone, inst.name) + self.path[len(prefix):]
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                status, body, headers = reply.status, reply.read(), reply.headers
        except urllib.error.HTTPError as err:
            status, body, headers = err.code, err.read(), err.headers
        except OSError:
            status, body, headers = 503, b"metadata server unavailable", None
        self._reply(status, body, headers or {})

    def _reply(self, status: int, body: bytes, headers: Any) -> None:
        # A long poll's VM may be powered off before its answer: the asker is gone, as on GCE.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            for name in ("Content-Type", "ETag"):
                if headers.get(name):
                    self.send_header(name, headers[name])
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
