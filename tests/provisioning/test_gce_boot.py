# ruff: noqa: F811  (the isolated bed fixture is imported, then requested by name)
"""A VM that is RUNNING but not yet taking logins (real-cloud-audit.md row 6): the SSH
connection waits for it with backoff up to `boot_timeout_s`, and still reports a wrong key
once the VM is clearly up. Against a real SSH server on loopback that boots like a VM
(`tests/fakes/booting_sshd.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioning.ssh.connection import (
    AuthRefusedError,
    SshConnection,
    SshTarget,
    SshTimeouts,
    SshUnreachableError,
)
from tests.fakes.booting_sshd import BootingSshd
from tests.fakes.keys import write_ssh_key
from tests.testbed.isolated_fixtures import module_isolated_bed  # noqa: F401

FAST = dict(connect_s=2.0, command_s=5.0, heartbeat_interval_s=60.0, heartbeat_timeout_s=30.0,
            connect_attempts=2, boot_retry_max_s=0.3)


def connection(server: BootingSshd, key: Path, tmp_path: Path, user: str = "transient",
               **timeouts: float) -> SshConnection:
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line() + "\n")
    target = SshTarget("vm-1", server.address, server.port, user, str(key))
    return SshConnection(target, known, False, SshTimeouts(**{**FAST, **timeouts}))


def test_a_booting_vm_is_waited_for_through_refusals_until_it_takes_the_login(
        tmp_path: Path) -> None:
    key = write_ssh_key(tmp_path)
    with BootingSshd(key.with_suffix(".pub"), refuse_s=0.5, banner_s=1.0, login_s=2.0) as vm:
        conn = connection(vm, key, tmp_path, boot_timeout_s=60.0)
        vm.start()
        try:
            conn.connect()
            assert conn.check_alive()
        finally:
            conn.close()
        assert vm.logins == 1
        assert conn.attempts > 1  # refused, no banner, login refused: each retried


def test_without_a_boot_timeout_a_refusal_fails_at_once(tmp_path: Path) -> None:
    """provider=ssh keeps no-retry: its machines are up, a refusal is the answer."""
    key = write_ssh_key(tmp_path)
    with BootingSshd(key.with_suffix(".pub"), login_s=3600.0) as vm:
        vm.start()
        conn = connection(vm, key, tmp_path)
        with pytest.raises(AuthRefusedError, match="was refused"):
            conn.connect()


def test_a_vm_that_never_boots_fails_in_one_line_naming_it_and_the_last_error(
        tmp_path: Path) -> None:
    key = write_ssh_key(tmp_path)
    with BootingSshd(key.with_suffix(".pub"), refuse_s=3600.0) as vm:
        vm.start()
        conn = connection(vm, key, tmp_path, boot_timeout_s=1.5)
        with pytest.raises(SshUnreachableError) as info:
            conn.connect()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("ssh host vm-1 (transient@127.0.0.1:")
    assert "no login within 1.5 s of boot" in message and "last error" in message
    assert "refused" in message.lower()


def test_a_wrong_key_on_a_vm_that_is_up_is_reported_as_a_wrong_key(tmp_path: Path) -> None:
    (tmp_path / "right").mkdir()
    (tmp_path / "wrong").mkdir()
    right, wrong = write_ssh_key(tmp_path / "right"), write_ssh_key(tmp_path / "wrong")
    with BootingSshd(right.with_suffix(".pub")) as vm:
        vm.start()
        conn = connection(vm, wrong, tmp_path, boot_timeout_s=3600.0, login_grace_s=1.0)
        with pytest.raises(AuthRefusedError) as info:
            conn.connect()
    message = str(info.value)
    assert "\n" not in message and f"key {wrong} was refused" in message
    assert "the VM is up: check the key and user" in message
    assert vm.logins == 0


@pytest.mark.slow
def test_the_provider_waits_for_isolated_vms_that_refuse_logins_after_running(
        module_isolated_bed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The issue's case on real booting guests: isolated hosts (their own root filesystem and
    sshd, pam_nologin "System is booting up" for 20 s after RUNNING, the account made by the
    guest agent from ssh-keys, a non-root user): a role starts there once logins are taken."""
    import time

    from provisioning.base import ClusterRequest, HostSpec, Role
    from provisioning.gce.provider import GceProvider
    from tests.provisioning.gce_fixtures import PROJECT, ZONES, IsolatedFakeGce, gce_config

    bed = module_isolated_bed
    refused_s = 20.0
    with IsolatedFakeGce(bed, vms=2, default_image="trixie", login_refused_s=refused_s,
                         project=PROJECT, zones=tuple(ZONES), provision_s=0.05,
                         staging_s=0.05, insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05,
                         wait_cap_s=0.2) as fake:
        cfg = gce_config(fake, tmp_path, ssh_key=str(bed.client_key), python="/usr/bin/python3",
                         host_key_timeout_s=30.0, boot_timeout_s=60.0, login_grace_s=60.0)
        provider = GceProvider(cfg)
        hosts = [HostSpec("ps-0", Role.PS, "n1-standard-4", None, ZONES[0], False),
                 HostSpec("worker-0", Role.WORKER, "n1-standard-4", None, ZONES[0], True)]
        cluster = provider.acquire(ClusterRequest("iso-boot", hosts, tmp_path / "run"))
        try:
            assert not fake.boot_errors, fake.boot_errors
            worker = cluster.hosts_for(Role.WORKER)[0]
            vm = provider.vm_of(worker.id)
            running_at = fake.instances[(vm.zone, vm.name)].running_since()
            proc = provider.runner(worker).start(["sh", "-c", "id -un"])
            logged_in = time.time()
            assert proc.readline().strip() == "transient" and proc.wait(60) == 0
            assert vm.ssh._machine.connection.attempts > 1  # refused while booting, retried
            assert logged_in - running_at >= refused_s  # not before the guest took logins
            print(f"RUNNING to first login on an isolated host: {logged_in - running_at:.1f} s")
        finally:
            provider.release(cluster)
        assert fake.live_instances() == []
