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
    """The SSH side of one VM: its connection (opened lazily) and the runners of its hosts.

    A dropped connection while GCE says RUNNING is OUR network, not a preemption: the SSH
    backend's machine reconnects in the background and its roles' handles re-attach to the
    roles, which run on (`provisioning/ssh/runner.py`); the VM is REVOKED only after
    `provider.unreachable_grace_s` without a connection, or when GCE says it is gone."""

    def __init__(self, cfg: GceConfig, vm_name: str, address: str, has_gpu: bool,
                 known_hosts: Path, pinned: bool, journal: ResourceJournal | None,
                 user: str | None = None) -> None:
        self.cfg, self.vm_name, self.address = cfg, vm_name, address
        self.user = user or cfg.ssh_user  # OS Login's POSIX user where the project uses it
        self.has_gpu, self.known_hosts, self.pinned = has_gpu, known_hosts, pinned
        self.journal = journal
        self._machine = None
        self._opening = None  # the machine while its first login runs (under `_lock`)
        self._runners: dict[str, object] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def reconnects(self) -> int:
        """Connections re-established after a drop."""
        return 0 if self._machine is None else self._machine.reconnects

    @property
    def opened(self) -> bool:
        """Whether a connection was ever opened (a runner was asked for)."""
        return self._machine is not None

    @property
    def unreachable_since(self) -> float | None:
        """When the connection dropped (monotonic), while it is being re-established."""
        return None if self._machine is None else self._machine.unreachable_since

    def _open(self):  # type: ignore[no-untyped-def]
        from provisioning.ssh.config import SshHostConfig, SshProviderConfig
        from provisioning.ssh.machine import Machine
        from provisioning.ssh.provider import SshProvider

        cfg = self.cfg
        inventory = SshHostConfig(name=self.vm_name, address=self.address, port=22,
                                  user=self.user, key_path=cfg.ssh_key_path(), root=cfg.remote_root,
                                  python=cfg.python)
        # One machine per provider: the graces are this VM's (GCE decides the rest).
        ssh_config = SshProviderConfig(
            hosts=[inventory], known_hosts=str(self.known_hosts),
            trust_on_first_use=not self.pinned, first_port=cfg.trainer_port,
            wheelhouse=cfg.wheelhouse, index_url=cfg.index_url, extra=trainer_extra(self.has_gpu, cfg.extra),
            ready_timeout_s=cfg.ready_timeout_s, unreachable_grace_s=cfg.unreachable_grace_s,
            outage_grace_s=cfg.unreachable_grace_s)
        provider = SshProvider(ssh_config, journal=self.journal)
        provider._run_dir = self.known_hosts.parent  # a key pinned on first use is recorded there
        # a fresh VM is RUNNING before it takes logins: the first connection waits for it
        provider.timeouts = replace(provider.timeouts, boot_timeout_s=cfg.boot_timeout_s,
                                    login_grace_s=cfg.login_grace_s)
        machine = Machine(inventory, provider)
        with provider._lock:
            provider._machines[inventory.name] = machine
        self._opening = machine
        try:
            machine.open()
        except Exception as error:
            raise HostLostError(self.vm_name, f"VM {self.vm_name} ({self.address}) cannot be "
                                f"reached over SSH: {error}") from error
        provider.timeouts = replace(provider.timeouts, boot_timeout_s=0.0)  # reconnections
        return machine

    def runner(self, host: Host):  # type: ignore[no-untyped-def]
        """The SSH runner of `host` (a host on this VM), the same object on every call. While
        the VM is unreachable its calls wait for the connection to come back."""
        from provisioning.ssh.host_runner import SshHostRunner

        with self._lock:
            if self._closed:
                raise HostLostError(host.id, f"VM {self.vm_name} was released")
            if host.id not in self._runners:
                if self._machine is None:
                    self._machine = self._open()
                # Journal the roles as this backend's: its clean-up (deleting the VM) owns them.
                self._runners[host.id] = SshHostRunner(host, self._machine, self.journal,
                                                       backend="gce")
            return self._runners[host.id]

    def state(self) -> HostState | None:
        """None while the connection is fine, not opened, or dropped and being re-established
        (unknown: the VM's roles run on); REVOKED once it stayed dropped for
        `provider.unreachable_grace_s` (the SSH backend's grace, applied here)."""
        machine = self._machine
        if machine is None or self._closed:
            return None
        machine.provider.judge_unreachable()
        return None if machine.alive() else HostState.REVOKED

    def contact_lost(self) -> bool:
        """Whether this VM was declared lost for want of a connection (not by GCE)."""
        machine = self._machine
        return machine is not None and machine.provider.contact_lost is not None

    def mark_gone(self) -> None:
        """The VM was revoked: its runners refuse new work (HostLostError) from now on, and
        its roles' handles report their loss; a first login still waiting for it gives up."""
        opening = self._opening
        if opening is not None:  # before the lock, which a waiting first login holds
            opening.declare_lost("the VM is gone")
        with self._lock:
            runners = list(self._runners.values())
            machine = self._machine
        for runner in runners:
            runner.mark_gone()  # type: ignore[attr-defined]
        if machine is not None:
            machine.declare_lost("the VM is gone")

    def close(self, hosts: Sequence[Host] = ()) -> None:
        """Stop the runners' roles and close the connection (idempotent)."""
        opening = self._opening
        if opening is not None:  # a first login still waiting for the VM: given up
            opening.abort_open("released")
        with self._lock:
            self._closed = True
            runners, self._runners = list(self._runners.values()), {}
            machine, self._machine = self._machine, None
        if machine is not None and not machine.reachable():
            machine.declare_lost("released while unreachable")  # its VM is deleted anyway
        for runner in runners:
            with contextlib.suppress(Exception):  # a lost VM: its processes go with it
                runner.stop_all()  # type: ignore[attr-defined]
        if machine is not None:
            machine.close()
