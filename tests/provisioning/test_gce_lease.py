"""A lease, so nothing bills after the orchestrator is gone (audit row 7): every VM carries
a lease in its metadata that the orchestrator renews, a watcher on the VM ends the VM when the
lease has passed, and `maxRunDuration` bounds every VM's life (the PS's too). Against the fake,
which runs GCE's side (maxRunDuration) and emulates the guests' watchers; the watcher's bash is
also run for real against the fake's metadata server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioning.gce.api import ComputeApi
from provisioning.gce.body import (
    LEASE_KEY,
    LEASE_S_KEY,
    VmRequest,
    instance_body,
    lease_value,
    lease_watcher_script,
)
from provisioning.gce.config import GceConfig
from tests.fakes.gce_server import FakeGce
from tests.fakes.keys import write_ssh_key
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    PROJECT,
    ZONES,
    fake_fixture,
    make_provider_fixture,
    small_request,
)

ZONE = ZONES[0]
REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_every_vm_the_ps_too_gets_a_cloud_enforced_life_and_a_lease() -> None:
    cfg = GceConfig(max_run_duration_s=7200)
    ps = VmRequest(name="tp-r-ps-0-1", zone=ZONE, machine_type="n1-standard-4", gpu=None,
                   transient=False, labels={}, host_ids=["r-ps-0-1"])
    body = instance_body(cfg, "proj", ps, "r", "ssh-ed25519 AAAA", lease_expires=1234.5)
    assert body["scheduling"] == {"maxRunDuration": {"seconds": "7200"},
                                  "instanceTerminationAction": "DELETE"}
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}  # type: ignore[index]
    assert items[LEASE_KEY] == "1235"  # rounded up: rounding never shortens a lease
    assert items[LEASE_S_KEY] == "900"  # what the VM times on its own clock
    assert "transient-lease-watcher" in items["startup-script"]


def test_gce_ends_a_vm_at_its_max_run_duration(fake: FakeGce) -> None:
    fake.insert(ZONE, {"name": "vm-1", "scheduling": {"maxRunDuration": {"seconds": "1"},
                                                      "instanceTerminationAction": "DELETE"}},
                None)
    assert wait_until(lambda: fake.live_instances() == [], 30)
    assert fake.instances[(ZONE, "vm-1")].ended_by == "maxRunDuration"


@pytest.mark.skipif(shutil.which("curl") is None,
                    reason="LEASE WATCHER NOT RUN: the VM-side watcher uses curl, missing here")
def test_the_vm_side_watcher_deletes_its_vm_once_the_lease_has_passed(fake: FakeGce,
                                                                      tmp_path: Path) -> None:
    fake.guest_lease_watch = False  # the real script does it here
    expires = int(time.time()) + 2
    fake.insert(ZONE, {"name": "vm-1", "metadata": {"items": [
        {"key": LEASE_KEY, "value": str(expires)}, {"key": LEASE_S_KEY, "value": "2"}]}}, None)
    marker = tmp_path / "powered-off"
    proc = start_lease_watcher(fake, tmp_path, "vm-1", marker)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert time.time() >= expires  # not before the lease had passed
    assert not marker.exists(), "powered off: the delete through the API failed"
    assert wait_until(lambda: fake.live_instances() == [], 30)  # deleted through the API
    assert fake.calls["instances.delete"] == 1


def start_lease_watcher(fake: FakeGce, tmp_path: Path, name: str,
                        marker: Path) -> subprocess.Popen[bytes]:
    """The VM-side lease watcher's real bash, run here against `name`'s fake metadata server,
    polling every second; its power-off only touches `marker`."""
    script = tmp_path / "lease.sh"
    script.write_text(lease_watcher_script(poll_s=1))
    env = {"PATH": "/usr/bin:/bin", "TRANSIENT_METADATA_URL": fake.metadata_url(ZONE, name),
           "TRANSIENT_COMPUTE_URL": f"{fake.endpoint}/compute/v1",
           "TRANSIENT_POWEROFF": f"touch {marker}"}  # never the test machine's shutdown
    return subprocess.Popen(["bash", str(script)], env=env)


@pytest.mark.skipif(shutil.which("curl") is None,
                    reason="LEASE WATCHER NOT RUN: the VM-side watcher uses curl, missing here")
def test_an_orchestrator_clock_an_hour_behind_neither_ends_nor_keeps_vms(
        fake: FakeGce, tmp_path: Path) -> None:
    """Audit D7: the orchestrator's stamps are an hour in the past (a laptop clock after
    sleep), so comparing them with the VM's clock would end the VM at once. The watcher times
    the lease from the stamp's last change on the VM's own clock: the VM lives while renewals
    come, and ends `lease_s` after the last one."""
    fake.guest_lease_watch = False  # the real script does it here
    lease_s, skew_s = 3, -3600.0
    fake.insert(ZONE, {"name": "vm-1", "metadata": {"items": [
        {"key": LEASE_KEY, "value": lease_value(time.time() + skew_s + lease_s)},
        {"key": LEASE_S_KEY, "value": str(lease_s)}]}}, None)
    api = ComputeApi(GceConfig(project=PROJECT, api_endpoint=fake.endpoint,
                               credentials="anonymous", retry_backoff_s=0.01))
    marker = tmp_path / "powered-off"
    proc = start_lease_watcher(fake, tmp_path, "vm-1", marker)
    try:
        renewals_until = time.time() + 3 * lease_s
        stamp = time.time() + skew_s
        while time.time() < renewals_until:  # renew every second, the stamps an hour old
            stamp = max(time.time() + skew_s + lease_s, stamp + 1)
            api.set_metadata_value(ZONE, "vm-1", LEASE_KEY, lease_value(stamp))
            last_renewal = time.time()
            assert proc.poll() is None and len(fake.live_instances()) == 1
            time.sleep(1.0)
        assert fake.calls["instances.delete"] == 0  # renewed for 3 x lease_s: still there
        assert proc.wait(timeout=60) == 0  # renewals stopped: the watcher deletes the VM
        assert time.time() >= last_renewal + lease_s  # not before lease_s of silence
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not marker.exists(), "powered off: the delete through the API failed"
    assert wait_until(lambda: fake.live_instances() == [], 30)
    assert fake.calls["instances.delete"] == 1


def test_the_orchestrator_renews_every_lease_and_stops_at_release(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    # Short, yet three renewal rounds (one each lease_s / 3) long: a loaded machine's round
    # may take a second, and a lease that passes deletes the VMs the test looks at.
    provider = make_provider(lease_s=3.0)
    cluster = provider.acquire(small_request("lease", tmp_path, workers=1))
    try:
        first = {i.name: float(i.metadata()[LEASE_KEY]) for i in fake.live_instances()}
        assert wait_until(lambda: provider.lease_renewals >= 2, 30)
        now = {i.name: float(i.metadata()[LEASE_KEY]) for i in fake.live_instances()}
        assert set(now) == set(first) and len(now) == 2
        # Renewed: lease_s ahead of a renewal, no longer the first lease (boot included).
        assert all(now[name] < first[name] for name in now)
    finally:
        provider.release(cluster)
    assert provider._lease_thread is None


ORCHESTRATOR = """
import sys, time
from pathlib import Path
from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from tests.provisioning.gce_fixtures import small_request
endpoint, key, workdir, lease = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
cfg = GceConfig(project="test-project", zones=["us-central1-a"], api_endpoint=endpoint,
                credentials="anonymous", ssh_key=key, poll_interval_s=0.0, ready_poll_s=0.05,
                host_key_timeout_s=2.0, retry_backoff_s=0.01, lease_s=lease)
provider = GceProvider(cfg)
provider.acquire(small_request("orphan", workdir, workers=2))
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_sigkilled_orchestrators_vms_end_within_the_lease_without_gc(
        fake: FakeGce, tmp_path: Path) -> None:
    lease_s = 6.0
    key = write_ssh_key(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    proc = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, fake.endpoint, str(key),
                             str(tmp_path / "run"), str(lease_s)],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert len(fake.live_instances()) == 3
        time.sleep(1.5 * lease_s)  # renewals keep the VMs past their first lease period
        assert len(fake.live_instances()) == 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        killed = time.time()
        # No orchestrator.gc, no release: the lease ends every VM, the PS's too.
        assert wait_until(lambda: fake.live_instances() == [], 4 * lease_s)
        ended = list(fake.instances.values())
        assert {i.ended_by for i in ended} == {"lease"}
        last = max(i.deleting_at for i in ended if i.deleting_at is not None)
        assert last - killed <= lease_s + 1.0  # its deadline: lease_s after the last renewal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_vms_get_an_account_for_their_lease_or_storage_or_when_configured() -> None:
    vm = VmRequest(name="tp-r-worker-0-1", zone=ZONE, machine_type="n1-standard-4", gpu=None,
                   transient=True, labels={}, host_ids=["r-worker-0-1"])
    assert "serviceAccounts" not in instance_body(GceConfig(), "p", vm, "r", "ssh-ed25519 A")
    with_lease = instance_body(GceConfig(), "p", vm, "r", "ssh-ed25519 A", lease_expires=9.0)
    assert with_lease["serviceAccounts"] == [
        {"email": "default", "scopes": ["https://www.googleapis.com/auth/compute"]}]
    mine = GceConfig(service_account="vm@p.iam.gserviceaccount.com")
    assert instance_body(mine, "p", vm, "r", "ssh-ed25519 A")["serviceAccounts"] == [
        {"email": "vm@p.iam.gserviceaccount.com", "scopes": list(mine.scopes)}]
    # with a bucket the VMs download a staged dataset from it: read-only storage, no more
    stored = GceConfig(storage="gs://b/p")
    read = "https://www.googleapis.com/auth/devstorage.read_only"
    assert instance_body(stored, "p", vm, "r", "ssh-ed25519 A")["serviceAccounts"] == [
        {"email": "default", "scopes": [read]}]
    assert instance_body(stored, "p", vm, "r", "ssh-ed25519 A", lease_expires=9.0)[
        "serviceAccounts"] == [{"email": "default", "scopes": [
            "https://www.googleapis.com/auth/compute", read]}]


def test_internal_ips_only_is_refused_unless_the_orchestrator_is_inside_the_vpc() -> None:
    from orchestrator.config.errors import ConfigError
    from orchestrator.validate import compose_experiment

    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider.external_ip=false"])
    line = info.value.line()
    assert line.startswith("config error: provider.external_ip: false leaves the VMs with "
                           "internal IPs only") and "\n" not in line
    compose_experiment("cifar10_res32", ["provider.external_ip=false",
                                         "provider.inside_vpc=true"])


def test_a_cut_orchestrator_link_keeps_vms_briefly_and_ends_them_after_the_lease(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """The orchestrator's own link is cut (every API call fails, the VMs run on): a short cut
    changes nothing (poll keeps GCE's last word, no VM is revoked or deleted); a cut longer than
    the lease ends every VM on its own, so nothing bills while the orchestrator is cut off."""
    from provisioning.base import HostState

    lease_s = 6.0
    provider = make_provider(lease_s=lease_s, retries=0)
    cluster = provider.acquire(small_request("cut", tmp_path, workers=2))
    try:
        assert set(provider.poll(cluster).values()) == {HostState.RUNNING}
        fake.api_down = True
        assert set(provider.poll(cluster).values()) == {HostState.RUNNING}  # last word kept
        time.sleep(lease_s / 3)
        assert set(provider.poll(cluster).values()) == {HostState.RUNNING}
        fake.api_down = False
        renewed = provider.lease_renewals
        assert wait_until(lambda: provider.lease_renewals > renewed + 1, 30)
        assert len(fake.live_instances()) == 3  # the short cut cost nothing

        fake.api_down = True  # now for longer than the lease
        assert wait_until(lambda: fake.live_instances() == [], 4 * lease_s)
        fake.api_down = False
        assert {i.ended_by for i in fake.instances.values()} == {"lease"}
        assert set(provider.poll(cluster).values()) == {HostState.REVOKED}
    finally:
        fake.api_down = False
        provider.release(cluster)
    assert fake.live_instances() == []
