"""Roles of one host run on its machine over the machine's SSH connection (the HostRunner of
the SSH provider, and of the GCE provider, whose VMs are reached the same way)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paramiko

from provisioning.base import (
    PREEMPTION_NOTICE_FILE,
    STOP_GRACE_S,
    Host,
    HostLostError,
    HostRunner,
    RemoteProcess,
    ResourceJournal,
)
from provisioning.ssh.connection import SshConnection, SshUnreachableError
from provisioning.ssh.runner import RoleLauncher, sftp_get, sftp_put

if TYPE_CHECKING:
    from provisioning.ssh.machine import Machine

DATASETS_DIR = "datasets"  # under a machine's root: datasets kept across runs (dataset_cache)
#: Tries of one file transfer cut short by dropped connections.
TRANSFER_ATTEMPTS = 3


class SshHostRunner(HostRunner):
    """Runs roles of one host on its machine over the machine's connection. While the machine
    is unreachable, a call waits for it to be back (at most `command_timeout_s`, then
    SshUnreachableError); only a lost machine is HostLostError."""

    shares_orchestrator_fs = False

    def __init__(self, host: Host, machine: Machine, journal: ResourceJournal | None,
                 backend: str = "ssh") -> None:
        self.host = host
        self.machine = machine
        assert machine.connection is not None
        python = machine.inventory.python or "python3"
        self.launcher = RoleLauncher(machine, host, python, journal, backend,
                                     wait_s=machine.provider.config.command_timeout_s)
        self._gone = False

    @property
    def notice_path(self) -> Path:
        return self.host.workdir / PREEMPTION_NOTICE_FILE

    def _check(self) -> SshConnection:
        if not self._gone and self.machine.alive():
            connection = self.machine.await_connection(  # SshUnreachableError after the wait
                None, self.machine.provider.config.command_timeout_s)
            if connection is not None:
                return connection
        reason = self.machine.lost_reason or (
            self.machine.connection.lost_reason if self.machine.connection else "")
        raise HostLostError(self.host.id, f"host {self.host.id} on ssh machine "
                            f"{self.machine.name} is gone {reason}".strip())

    def _path(self, remote: Path | str) -> str:
        return posixpath.join(str(self.host.workdir), str(remote))  # absolute stays absolute

    def dataset_cache(self) -> Path | None:
        return Path(posixpath.join(self.machine.root, DATASETS_DIR)) if self.machine.root else None

    def bytes_sent(self) -> int | None:
        return self.machine.sent.total

    def setup(self) -> None:
        self._check()
        self.machine.provider.setup_machines([self.machine])
        self.machine.provider.setup_all_placed()
        assert self.machine.setup_future is not None
        try:
            self.machine.environment = self.machine.setup_future.result()
        except SshUnreachableError as error:
            raise HostLostError(self.host.id, str(error)) from None

    def trainer_command(self) -> list[str]:
        if self.machine.environment is None:
            self.setup()
        assert self.machine.environment is not None
        return list(self.machine.environment.command)

    def trainer_env(self) -> dict[str, str]:
        if self.machine.environment is None:
            self.setup()
        assert self.machine.environment is not None
        return dict(self.machine.environment.env)

    def _launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
                log_path: Path | None) -> RemoteProcess:
        self._check()
        try:
            return self.launcher.launch(argv, env, self._path(cwd or "."), log_path)
        except SshUnreachableError as error:
            raise HostLostError(self.host.id, str(error)) from None

    def copy(self, local: Path, remote: Path) -> None:
        self._transfer(lambda sftp: sftp_put(sftp, Path(local), self._path(remote)))

    def fetch(self, remote: Path, local: Path) -> bool:
        return self._transfer(lambda sftp: sftp_get(sftp, self._path(remote), Path(local)))

    def _transfer(self, move: Callable[[paramiko.SFTPClient], Any]) -> Any:
        """Run one SFTP transfer (idempotent: files land atomically); one cut short by a
        dropped connection runs again once the machine is back (`TRANSFER_ATTEMPTS` in all).
        A lost machine is HostLostError."""
        for attempt in range(1, TRANSFER_ATTEMPTS + 1):
            connection = self._check()
            try:
                with connection.sftp() as sftp:
                    return move(sftp)
            except (OSError, EOFError, paramiko.SSHException, SshUnreachableError) as error:
                if isinstance(error, paramiko.SSHException) and "connection dropped" in str(error):
                    connection.mark_lost(str(error))
                connection.check_alive()
                if not self.machine.alive():
                    raise HostLostError(self.host.id, str(error)) from None
                if not connection.lost.is_set() or attempt == TRANSFER_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def alive(self) -> bool:
        return not self._gone and self.machine.alive()

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        self.launcher.stop_all(grace_s)

    def mark_gone(self) -> None:
        self._gone = True
