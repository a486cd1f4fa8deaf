"""The GCE backend end to end at the provider level: VMs from the fake Compute API, each backed by
a namespace sshd host of the SSH test bed, roles started over SSH with the host key pinned from
guest attributes, a preemption detected and the VM replaced at the same address, nothing left.

On the shared-filesystem bed on purpose: the subject is the provider's calls and their order,
not the VM; the CLI on VMs that share nothing with this machine is test_gce_e2e.py."""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from provisioning.base import PREEMPTION_NOTICE_FILE, HostState, Role
from provisioning.gce.provider import GceProvider
from provisioning.journal import (
    Journal,
    ResourceKind,
    clean_up,
    list_unreleased,
    read_journal,
)
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import PROJECT, ZONES, gce_config, small_request
from tests.testbed import SshTestBed
from tests.testbed.fixtures import host_python, ssh_testbed  # noqa: F401

pytestmark = pytest.mark.slow
#: The fake's delays for these tests: short, so the tests wait on SSH, not on the fake.
FAST: dict[str, object] = dict(project=PROJECT, zones=tuple(ZONES), provision_s=0.05,
                               staging_s=0.05, insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05,
                               wait_cap_s=0.2)


def fake_on_bed(bed: SshTestBed, vms: int, **options: object) -> FakeGce:
    """A fake Compute API whose VMs are the bed's first `vms` namespace hosts (their address is
    the VM's internal and external IP) publishing their sshd host keys as guest attributes."""
    keys = {}
    for host in bed.hosts:
        kind, blob = host.host_key.with_suffix(".pub").read_text().split()[:2]
        keys[host.address] = [(kind, blob)]
    return FakeGce(ip_pool=[h.address for h in bed.hosts[:vms]],
                   host_keys_for=lambda ip: keys[ip], **options)  # type: ignore[arg-type]


def test_vms_run_roles_over_ssh_survive_a_preemption_and_leave_nothing(
        ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    bed = ssh_testbed
    by_address = {h.address: h for h in bed.hosts}
    with fake_on_bed(bed, 2, **FAST) as fake:
        cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"))
        provider = GceProvider(cfg, journal=Journal(tmp_path / "run" / "journal.jsonl"))
        cluster = provider.acquire(small_request("gce-ssh", tmp_path / "run", workers=1))
        try:
            worker = cluster.hosts_for(Role.WORKER)[0]
            chief = cluster.hosts_for(Role.CHIEF)[0]
            # Known hosts come from guest attributes: the connection keeps RejectPolicy.
            assert provider.vm_of(worker.id).ssh.pinned
            proc = provider.runner(worker).start(
                ["sh", "-c", 'echo "$TRANSIENT_PREEMPTION_NOTICE"; exec sleep 60'])
            notice = proc.readline().strip()
            assert notice == f"{worker.workdir}/{PREEMPTION_NOTICE_FILE}"
            vm = provider.vm_of(worker.id)
            script = {i["key"]: i["value"] for i in
                      fake.instances[(vm.zone, vm.name)].body["metadata"]["items"]}
            assert notice in script["startup-script"]  # the VM's watcher writes that very file
            # The chief shares ps-0's VM: same address and work dir, its own port.
            ps = cluster.hosts_for(Role.PS)[0]
            assert (chief.address, chief.workdir) == (ps.address, ps.workdir)
            echo = provider.runner(chief).start(["sh", "-c", "pwd"])
            assert echo.readline().strip() == str(ps.workdir) and echo.wait(30) == 0

            # GCE preempts the worker's VM: its processes die with it, the VM goes away.
            bed_host = by_address[worker.address]
            fake.preempt(vm.zone, vm.name)
            for pid in bed.role_pids(bed_host):
                os.kill(pid, signal.SIGKILL)
            assert proc.wait(30) < 0
            deadline = time.monotonic() + 30
            while provider.poll(cluster)[worker.id] is not HostState.REVOKED:
                assert time.monotonic() < deadline, "preemption not noticed"
                time.sleep(0.1)
            new = provider.replace(cluster, [worker.id])
            replacement = new.hosts_for(Role.WORKER)[0]
            assert replacement.endpoint == worker.endpoint  # same slot, same address and port
            again = provider.runner(replacement).start(["sh", "-c", "echo back; sleep 60"])
            assert again.readline().strip() == "back"
            assert provider.poll(new)[replacement.id] is HostState.RUNNING
            groups = [e for e in read_journal(tmp_path / "run" / "journal.jsonl")
                      if e.kind is ResourceKind.PROCESS_GROUP]
            assert groups and {e.backend for e in groups} == {"gce"}
        finally:
            provider.release(cluster)
            provider.release(new if "new" in locals() else cluster)
        assert fake.live_instances() == []
        # What the preempted VM ran is still listed (it died with its VM, unobserved); the
        # journal's clean-up (`python -m orchestrator.release`) settles it: its VM is gone.
        journal = tmp_path / "run" / "journal.jsonl"
        assert {e.kind for e in list_unreleased(journal)} <= {ResourceKind.PROCESS_GROUP}
        clean_up(journal, configs={"gce": cfg})
        assert list_unreleased(journal) == []
        for host in bed.hosts[:2]:
            assert bed.role_pids(host) == [], f"processes left on {host.name}"


def test_vms_that_refuse_logins_after_running_are_waited_for(
        ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    """Each VM refuses SSH logins for a while after RUNNING, as a booting guest does (account
    not created yet, pam_nologin): the roles still start, after the connection's retries."""
    bed = ssh_testbed
    by_address = {h.address: h for h in bed.hosts}
    timers: list[threading.Timer] = []

    def boot(ip: str, seconds: float) -> None:  # withhold the login until `seconds` from now
        keys = by_address[ip].root.parent / "authorized_keys"
        held = keys.with_suffix(".booting")
        keys.replace(held)
        timer = threading.Timer(max(0.0, seconds), held.replace, args=(keys,))
        timers.append(timer)
        timer.start()

    with fake_on_bed(bed, 2, **FAST, login_refused_s=3.0, on_boot=boot) as fake:
        cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"),
                         boot_timeout_s=60.0, login_grace_s=30.0)
        provider = GceProvider(cfg, journal=Journal(tmp_path / "run" / "journal.jsonl"))
        cluster = provider.acquire(small_request("gce-boot", tmp_path / "run", workers=1))
        try:
            worker = cluster.hosts_for(Role.WORKER)[0]
            vm = provider.vm_of(worker.id)
            proc = provider.runner(worker).start(["sh", "-c", "echo up"])
            assert proc.readline().strip() == "up" and proc.wait(30) == 0
            connection = vm.ssh._machine.connection
            assert connection.attempts > 1  # the first logins were refused, then retried
        finally:
            provider.release(cluster)
            for timer in timers:
                timer.join()
        assert fake.live_instances() == []
        for host in bed.hosts[:2]:
            assert (host.root.parent / "authorized_keys").exists()


def test_a_cut_link_while_gce_says_running_is_unreachable_not_revoked(
        ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    """Our network is not their preemption: a cut of the link to a RUNNING VM loses the SSH
    heartbeat, but the VM is neither revoked nor deleted and its role runs on; once the
    connection is back, the same handle reads on (nothing lost, nothing killed). A VM that
    stays cut past the grace is revoked (other VMs answer) and its handle reports the loss."""
    bed = ssh_testbed
    by_address = {h.address: h for h in bed.hosts}
    with fake_on_bed(bed, 2, **FAST) as fake:
        cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"),
                         unreachable_grace_s=60.0)
        provider = GceProvider(cfg, journal=Journal(tmp_path / "run" / "journal.jsonl"))
        cluster = provider.acquire(small_request("gce-cut", tmp_path / "run", workers=1))
        try:
            worker = cluster.hosts_for(Role.WORKER)[0]
            worker_host = by_address[worker.address]
            vm = provider.vm_of(worker.id)
            provider.runner(cluster.hosts_for(Role.PS)[0])  # connected: a VM that answers
            counter = "echo up; i=0; while [ $i -lt 200 ]; do echo n-$i; i=$((i+1)); sleep 0.1; done"
            proc = provider.runner(worker).start(["sh", "-c", counter])
            assert proc.readline().strip() == "up"
            old_pids = bed.role_pids(worker_host)
            assert old_pids
            bed.cut(worker_host)
            try:
                deadline = time.monotonic() + 30
                while vm.ssh.unreachable_since is None:  # the heartbeat notices the cut
                    assert time.monotonic() < deadline, "the cut was not noticed"
                    assert provider.poll(cluster)[worker.id] is HostState.RUNNING
                    time.sleep(0.2)
                time.sleep(4)
                assert provider.poll(cluster)[worker.id] is HostState.RUNNING  # not revoked
                assert proc.poll() is None
            finally:
                bed.restore(worker_host)
            lines = [proc.readline().strip() for _ in range(200)]
            assert lines == [f"n-{i}" for i in range(200)]  # every line once, in order
            assert proc.wait(30) == 0
            assert vm.ssh.reconnects == 1
            assert (vm.zone, vm.name) in {(i.zone, i.name) for i in fake.live_instances()}
            again = provider.runner(worker)
            fresh = again.start(["sh", "-c", "echo back; exec sleep 300"])
            assert fresh.readline().strip() == "back"

            # Cut for good, with a short grace: then it is revoked, and the handle says so.
            vm.ssh._machine.provider.config.unreachable_grace_s = 3.0
            vm.ssh._machine.provider.config.outage_grace_s = 3.0
            bed.cut(worker_host)
            try:
                deadline = time.monotonic() + 60
                while provider.poll(cluster)[worker.id] is not HostState.REVOKED:
                    assert time.monotonic() < deadline, "never revoked"
                    time.sleep(0.2)
                assert fresh.wait(30) == -9
            finally:
                bed.restore(worker_host)
        finally:
            provider.release(cluster)
        assert fake.live_instances() == []
