"""The fake Compute API's VMs as isolated hosts (gce_fixtures.IsolatedFakeGce): a VM boots the
root filesystem its image family names, the guest agent makes the `ssh-keys` account, the host
key made at first boot is published as guest attributes, logins are refused while it boots,
deleting or preempting it powers the host off, and a stopped VM's disk becomes a custom image
that new VMs boot. The provider's own use of such VMs is tested with the provider (host-runtime).
"""
# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioning.gce import body as gce_body
from tests.fakes.gce_server import FakeHttpError
from tests.provisioning.gce_fixtures import PROJECT, ZONES, IsolatedFakeGce
from tests.testbed import isolated
from tests.testbed.isolated import IsolatedHost, IsolatedTestBed
from tests.testbed.isolated_fixtures import module_isolated_bed  # noqa: F401

pytestmark = pytest.mark.slow

ZONE = ZONES[0]
USER = "transient"
FAST = dict(project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
            insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2)


@pytest.fixture(name="bed")
def bed_fixture(module_isolated_bed: IsolatedTestBed) -> IsolatedTestBed:
    return module_isolated_bed


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def vm_body(bed: IsolatedTestBed, name: str, source: str,
            startup_script: str | None = None) -> dict[str, Any]:
    key = bed.client_key.with_suffix(".pub").read_text().strip()
    items = [{"key": "ssh-keys", "value": f"{USER}:{key}"},
             {"key": "enable-guest-attributes", "value": "TRUE"}]
    if startup_script:
        items.append({"key": "startup-script", "value": startup_script})
    return {"name": name, "machineType": f"zones/{ZONE}/machineTypes/n1-standard-4",
            "disks": [{"boot": True, "autoDelete": True,
                       "initializeParams": {"sourceImage": source}}],
            "networkInterfaces": [{}],
            "metadata": {"items": items},
            "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}}


def family(name: str) -> str:
    return f"projects/debian-cloud/global/images/family/{name}"


def create(fake: IsolatedFakeGce, bed: IsolatedTestBed, name: str, source: str,
           tmp_path: Path, startup_script: str | None = None) -> tuple[IsolatedHost, list[str]]:
    """Insert a VM and wait for its guest attributes; returns its host and an ssh command
    prefix that trusts only the published host key."""
    fake.insert(ZONE, vm_body(bed, name, source, startup_script), None)
    deadline = time.monotonic() + 60
    while True:
        try:
            items = fake.guest_attributes(ZONE, name, "hostkeys/")["queryValue"]["items"]
            break
        except FakeHttpError:
            assert not fake.boot_errors, fake.boot_errors
            assert time.monotonic() < deadline, f"{name} published no host key"
            time.sleep(0.05)
    host = fake.host_of(ZONE, name)
    known = tmp_path / f"known_hosts-{name}"
    known.write_text("".join(f"{host.address} {i['key']} {i['value']}\n" for i in items))
    return host, ["ssh", "-i", str(bed.client_key), "-o", f"UserKnownHostsFile={known}",
                  "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o",
                  "LogLevel=ERROR", f"{USER}@{host.address}"]


def ssh(prefix: list[str], command: str, retry_s: float = 0.0) -> str:
    """`command`'s stdout; retried for `retry_s` while logins are refused (a booting VM)."""
    deadline = time.monotonic() + retry_s
    while True:
        done = subprocess.run([*prefix, command], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        if done.returncode == 0:
            return done.stdout
        assert time.monotonic() < deadline, f"{command!r} -> {done.returncode} {done.stderr}"
        time.sleep(0.2)


def test_a_vm_boots_its_image_family_with_its_metadata_account(
        bed: IsolatedTestBed, tmp_path: Path) -> None:
    with IsolatedFakeGce(bed, vms=1, login_refused_s=3600, **FAST) as fake:
        with pytest.raises(FakeHttpError) as unknown:
            fake.insert(ZONE, vm_body(bed, "nope", family("ubuntu-2204-lts")), None)
        assert unknown.value.code == 404 and not fake.live_instances()

        host, prefix = create(fake, bed, "vm-a", family("debian-13"), tmp_path)
        assert fake.instances[(ZONE, "vm-a")].status(time.time(), fake.stop_s) == "RUNNING"
        with pytest.raises(AssertionError):  # still booting: pam_nologin refuses the login
            ssh(prefix, "true")
        bed.finish_boot(host)
        assert ssh(prefix, "id -un; sudo -n id -un").split() == [USER, "root"]
        assert ssh(prefix, "python3 --version").startswith("Python 3.13.")

        pidns = host.pidns
        fake.delete(ZONE, "vm-a", None)  # the VM's end: every process of its host dies
        wait_for(lambda: not isolated.live_processes([pidns]))
        assert not host.running


def test_a_stopped_vms_disk_becomes_an_image_that_new_vms_boot(
        bed: IsolatedTestBed, tmp_path: Path) -> None:
    with IsolatedFakeGce(bed, vms=2, login_refused_s=0.5, **FAST) as fake:
        source, prefix = create(fake, bed, "baker", family("debian-12"), tmp_path)
        ssh(prefix, "sudo mkdir -p /opt/runtime && echo ready | sudo tee /opt/runtime/marker",
            retry_s=60)
        with pytest.raises(FakeHttpError):  # its disk is in use while it runs
            fake.image_from_instance(ZONE, "baker", "runtime-1")
        fake.preempt(ZONE, "baker")  # STOP: STOPPING, then TERMINATED: off, disk kept
        inst = fake.instances[(ZONE, "baker")]
        wait_for(lambda: inst.status(time.time(), fake.stop_s) == "TERMINATED")
        url = fake.image_from_instance(ZONE, "baker", "runtime-1")
        assert not source.running
        assert url == f"projects/{PROJECT}/global/images/runtime-1"
        made, prefix2 = create(fake, bed, "from-image", url, tmp_path)
        assert made is not source
        assert ssh(prefix2, "cat /opt/runtime/marker", retry_s=60).strip() == "ready"
        assert ssh(prefix2, "python3 --version").startswith("Python 3.11.")
        assert made.host_key != source.host_key
        pidns = made.pidns
        fake.delete(ZONE, "from-image", None)
        fake.delete(ZONE, "baker", None)
        wait_for(lambda: not isolated.live_processes([pidns]))


def test_the_startup_script_runs_and_the_watcher_sees_a_preemption(
        bed: IsolatedTestBed, tmp_path: Path) -> None:
    """A startup-script runs at boot as root and starts the provider's real preemption
    watcher, which long-polls the VM's metadata server (metadata.google.internal, as on GCE)
    and writes the notice file when the VM is preempted, inside the STOPPING window (GCE's
    30 s). The script is the provider's own: its systemd-run fails on a host without systemd
    as PID 1 (an isolated host), and its fallback starts the watcher detached."""
    notice = "/var/tmp/transient/run-1/hosts/worker-0/preemption-notice.json"
    script = gce_body.startup_script(gce_body.watcher_script({"worker-0": notice}, USER),
                                 "/var/tmp/transient")
    with IsolatedFakeGce(bed, vms=1, login_refused_s=0, **{**FAST, "stop_s": 30.0}) as fake:
        host, prefix = create(fake, bed, "spot", family("debian-13"), tmp_path, script)
        # the metadata server answers this VM, and only with the header
        assert ssh(prefix, "curl -sf -H 'Metadata-Flavor: Google' http://metadata.google."
                           "internal/computeMetadata/v1/instance/preempted", retry_s=60) == "FALSE"
        assert ssh(prefix, "curl -s -o /dev/null -w '%{http_code}' http://metadata.google."
                           "internal/computeMetadata/v1/instance/preempted") == "403"
        wait_for(lambda: "preemption-watcher.sh" in ssh(prefix, "ps -e -o args="))
        assert ssh(prefix, f"test -e {notice} || echo absent").strip() == "absent"
        fake.preempt(ZONE, "spot")
        wait_for(lambda: (host.upper / notice.lstrip("/")).exists())
        body = (host.upper / notice.lstrip("/")).read_text()
        assert '"host_id": "worker-0"' in body
        assert host.running  # STOPPING: still up, as for GCE's 30 s
        fake.delete(ZONE, "spot", None)
        bed.stop(host)
