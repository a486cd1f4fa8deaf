"""Roles on GCE VMs run through the SSH backend (`provisioning.ssh`): one connection per VM.

Each VM becomes a one-machine SSH inventory entry (its external IP, `provider.ssh_user` and
`provider.ssh_key` or the tool's own key) checked against `<run dir>/known_hosts`, which the GCE backend filled from the
VM's guest attributes; RejectPolicy stays on, and only a VM that published no keys is pinned on
first use (recorded by the SSH backend). The connection is opened on the first `runner()` call
for a host on the VM, so watching and releasing VMs never needs SSH.

Setup is the SSH backend's (`provisioning/ssh/setup.py`): this project's wheel into a cached
environment on the VM, with the `gpu` extra on VMs with a GPU (TensorFlow with CUDA) and `cpu`
elsewhere (or the one `provider.extra` names), installed by the VM from `provider.index_url` (or from `provider.wheelhouse`), or only
the wheel when `provider.python` names an interpreter that already has the dependencies.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from provisioning.base import Host, HostLostError, HostState, ResourceJournal
from provisioning.gce.config import GceConfig

log = logging.getLogger(__name__)


def trainer_extra(has_gpu: bool, setting: str = "auto") -> str:
    """The optional-dependency group a VM installs the trainer with: `provider.extra` when it
    names one, else by the VM's GPU (auto)."""
    if setting != "auto":
        return setting
    return "gpu" if has_gpu else "cpu"


class VmSsh:
    """The SSH side of one VM: its connection (opened lazily) and the runners of its hosts."""

    def __init__(self, cfg: GceConfig, vm_name: str, address: str, has_gpu: bool,
                 known_hosts: Path, pinned: bool, journal: ResourceJournal | None,
                 user: str | None = None) -> None:
        self.cfg, self.vm_name, self.address = cfg, vm_name, address
        self.user = user or cfg.ssh_user  # OS Login's POSIX user where the project uses it
        self.has_gpu, self.known_hosts, self.pinned = has_gpu, known_hosts, pinned
        self.journal = journal
        self._machine = None
        self._runners: dict[str, object] = {}
        self._lock = threading.Lock()
        self._unreachable_since: float | None = None  # heartbeat lost, reconnecting
        self._reconnected = threading.Condition(self._lock)
        self._reconnecting: threading.Thread | None = None
        self._closed = False
        self.reconnects = 0  # connections re-established after a lost heartbeat

    def _open(self, booting: bool = True):  # type: ignore[no-untyped-def]
        from provisioning.ssh.config import SshHostConfig, SshProviderConfig
        from provisioning.ssh.provider import Machine, SshProvider

        cfg = self.cfg
        inventory = SshHostConfig(name=self.vm_name, address=self.address, port=22,
                                  user=self.user, key_path=cfg.ssh_key_path(), root=cfg.remote_root,
                                  python=cfg.python)
        ssh_config = SshProviderConfig(
            hosts=[inventory], known_hosts=str(self.known_hosts),
            trust_on_first_use=not self.pinned, first_port=cfg.trainer_port,
            wheelhouse=cfg.wheelhouse, index_url=cfg.index_url, extra=trainer_extra(self.has_gpu, cfg.extra),
            ready_timeout_s=cfg.ready_timeout_s)
        provider = SshProvider(ssh_config, journal=self.journal)
        if booting:  # a fresh VM is RUNNING before it takes logins: wait for it
            provider.timeouts = replace(provider.timeouts, boot_timeout_s=cfg.boot_timeout_s,
                                        login_grace_s=cfg.login_grace_s)
        machine = Machine(inventory, provider)
        try:
            machine.open()
        except Exception as error:
            raise HostLostError(self.vm_name, f"VM {self.vm_name} ({self.address}) cannot be "
                                f"reached over SSH: {error}") from error
        return machine

    def runner(self, host: Host):  # type: ignore[no-untyped-def]
        """The SSH runner of `host` (a host on this VM); the same object on every call until
        the connection is re-established after a lost heartbeat (then a fresh one). While the
        VM is unreachable this waits for the reconnection, at most until the grace ends."""
        from provisioning.ssh.provider import SshHostRunner
        from provisioning.ssh.runner import RoleLauncher

        with self._lock:
            if self._unreachable_since is not None:
                deadline = self._unreachable_since + self.cfg.unreachable_grace_s
                self._reconnected.wait_for(lambda: self._unreachable_since is None
                                           or self._closed,
                                           timeout=max(0.0, deadline - time.monotonic()))
                if self._unreachable_since is not None or self._closed:
                    raise HostLostError(host.id, f"VM {self.vm_name} ({self.address}) is "
                                        "unreachable over SSH")
            if host.id not in self._runners:
                if self._machine is None:
                    self._machine = self._open()
                runner = SshHostRunner(host, self._machine, self.journal)
                # Journal the roles as this backend's: its clean-up (deleting the VM) owns them.
                runner.launcher = RoleLauncher(self._machine.connection, host,
                                               runner.launcher.python, self.journal, "gce")
                self._runners[host.id] = runner
            return self._runners[host.id]

    def state(self) -> HostState | None:
        """None while the connection is fine (or not opened). A lost heartbeat while GCE says
        RUNNING is OUR network, not a preemption: the VM is *unreachable*, reconnected with
        backoff in the background, and REVOKED only after `provider.unreachable_grace_s`."""
        machine = self._machine
        if machine is None or machine.alive():
            return None
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return None
            if self._unreachable_since is None:
                self._unreachable_since = now
                log.warning("gce: VM %s unreachable over SSH (GCE says RUNNING): reconnecting "
                            "for up to %g s", self.vm_name, self.cfg.unreachable_grace_s)
                self._reconnecting = threading.Thread(target=self._reconnect, daemon=True,
                                                      name=f"gce-reconnect-{self.vm_name}")
                self._reconnecting.start()
            if now - self._unreachable_since >= self.cfg.unreachable_grace_s:
                return HostState.REVOKED
        return None

    def _reconnect(self) -> None:
        """Open a new connection with backoff until the grace ends; then stop what the roles
        of the old connection may still run (their output streams died with it, so the
        orchestrator starts them again) and hand out fresh runners."""
        from provisioning.ssh.runner import kill_groups_command

        since = self._unreachable_since or time.monotonic()
        delay = 1.0
        while not self._closed and time.monotonic() - since < self.cfg.unreachable_grace_s:
            try:
                machine = self._open(booting=False)
            except HostLostError as error:
                log.info("gce: VM %s still unreachable: %s", self.vm_name, error)
                time.sleep(min(delay, max(0.0, since + self.cfg.unreachable_grace_s
                                          - time.monotonic())))
                delay = min(delay * 1.5, 10.0)
                continue
            with self._lock:
                old_machine, self._machine = self._machine, machine
                old_runners, self._runners = list(self._runners.values()), {}
            for runner in old_runners:
                runner.mark_gone()  # type: ignore[attr-defined]
                groups = runner.launcher.maybe_running()  # type: ignore[attr-defined]
                if groups and machine.connection is not None:
                    with contextlib.suppress(Exception):
                        machine.connection.run(kill_groups_command("KILL", groups), check=False)
                        runner.launcher.forget([g for g, _ in groups])  # type: ignore[attr-defined]
            if old_machine is not None:
                with contextlib.suppress(Exception):
                    old_machine.close()
            with self._lock:
                self._unreachable_since = None
                self.reconnects += 1
                self._reconnected.notify_all()
            log.warning("gce: VM %s reachable again", self.vm_name)
            return
        with self._lock:
            self._reconnected.notify_all()

    def mark_gone(self) -> None:
        """The VM was revoked: its runners refuse new work (HostLostError) from now on."""
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.mark_gone()  # type: ignore[attr-defined]

    def close(self, hosts: Sequence[Host] = ()) -> None:
        """Stop the runners' roles and close the connection (idempotent)."""
        with self._lock:
            self._closed = True
            self._reconnected.notify_all()
            runners, self._runners = list(self._runners.values()), {}
            machine, self._machine = self._machine, None
        for runner in runners:
            with contextlib.suppress(Exception):  # a lost VM: its processes go with it
                runner.stop_all()  # type: ignore[attr-defined]
        if machine is not None:
            machine.close()
