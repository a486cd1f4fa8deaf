"""One inventory machine as the SSH provider uses it: its connection, its state (reachable,
unreachable and being reconnected, lost), its setup. :class:`provisioning.ssh.provider.SshProvider`
owns the machines; :class:`provisioning.ssh.host_runner.SshHostRunner` runs roles on one."""

from __future__ import annotations

import itertools
import logging
import posixpath
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from provisioning.base import HostState, ProvisionError
from provisioning.ssh.config import SshHostConfig, SshProviderConfig
from provisioning.ssh.connection import (
    ByteCounter,
    SshConnection,
    SshTarget,
    SshTimeouts,
    SshUnreachableError,
    end_session_command,
)
from provisioning.ssh.runner import sftp_makedirs
from provisioning.ssh.setup import Environment

log = logging.getLogger(__name__)

#: Longest pause between two reconnection attempts to an unreachable machine: after a drop
#: ends, every machine is reconnected within this (plus one handshake).
RECONNECT_MAX_DELAY_S = 10.0


class MachineOwner(Protocol):
    """What a machine needs of the provider that owns it (SshProvider, and the GCE provider
    through it): its settings, and the run-wide steps a machine's events start."""

    config: SshProviderConfig
    timeouts: SshTimeouts

    def record_pin(self, hostname: str, fingerprint: str) -> None:
        """Record a host key pinned on first use (the run's pinned-keys file)."""

    def judge_unreachable(self) -> None:
        """Decide, by the provider's graces, which unreachable machines are lost."""

    def setup_machines(self, machines: Sequence[Machine]) -> None:
        """Set up these machines' environments (in parallel)."""

    def setup_all_placed(self) -> None:
        """Set up every machine placed for the run."""


class Machine:
    """One inventory machine as this provider uses it: its connection, state and setup.

    A dropped connection (a missed heartbeat, a closed transport) makes the machine
    *unreachable*, not lost: it is reconnected in the background with backoff (at most
    RECONNECT_MAX_DELAY_S between tries) while its roles run on, and only the provider
    declares it lost (`declare_lost`: SshProvider's graces, or the cloud's word on a VM).
    Everything that needs its connection meanwhile waits (`await_connection`)."""

    def __init__(self, inventory: SshHostConfig, provider: MachineOwner,
                 reconnect: bool = True) -> None:
        self.inventory = inventory
        self.provider = provider
        self.connection: SshConnection | None = None
        self.root = ""  # absolute host path of inventory.root, known once connected
        self.state = HostState.PENDING
        self.environment: Environment | None = None
        self.setup_future: Future[Environment] | None = None
        self.ports = itertools.count(provider.config.first_port)
        self.lock = threading.Lock()
        self.reconnect = reconnect
        self.unreachable_since: float | None = None  # monotonic time of the drop
        self.alone_since: float | None = None  # unreachable while another machine answered
        self.lost_reason = ""
        self.reconnects = 0  # connections re-established after a drop
        self.sent = ByteCounter()  # bytes sent to it over every connection (bytes_sent)
        self._link = threading.Condition()
        self._closing = False
        self._opening: SshConnection | None = None  # the connection being made (`connect`)

    @property
    def name(self) -> str:
        return self.inventory.name

    def target(self) -> SshTarget:
        inv = self.inventory
        return SshTarget(inv.name, inv.address, inv.port, inv.login(), str(inv.key_file()))

    def connect(self, timeouts: SshTimeouts | None = None) -> SshConnection:
        cfg = self.provider.config
        connection = SshConnection(self.target(), Path(cfg.known_hosts).expanduser(),
                                   cfg.trust_on_first_use, timeouts or self.provider.timeouts,
                                   on_pin=self.provider.record_pin, on_lost=self._dropped,
                                   sent=self.sent)
        with self._link:
            self._opening = connection  # closed by declare_lost while it waits for a boot
        connection.connect()
        return connection

    def open(self) -> None:
        self.connection = self.connect()
        # Over SFTP, not a command: each command starts the login shell, whose rc files can be
        # slow (conda or pyenv init), and the session is needed anyway. A relative root is
        # taken from the home directory, where SFTP starts.
        with self.connection.sftp() as sftp:
            root = self.inventory.root
            if not root.startswith("/"):
                root = posixpath.join(sftp.normalize("."), root)
            sftp_makedirs(sftp, root)
            try:
                sftp.stat(root)
            except OSError as error:
                raise ProvisionError(f"ssh host {self.name}: cannot create its root {root}: "
                                     f"{error}") from None
        self.root = root
        self.connection.session_process()  # known while it lives (`_end_stale_session`)
        with self._link:
            if self.state == HostState.REVOKED:  # declared lost while it was opened
                self.connection.close()
                raise SshUnreachableError(f"ssh host {self.name}: {self.lost_reason}")
            self.state = HostState.RUNNING

    # --- losing and regaining contact ---------------------------------------------------------

    def _dropped(self, connection: SshConnection) -> None:
        """A connection of this machine was lost: unreachable (reconnecting) or, for a machine
        that is not reconnected, revoked."""
        with self._link:
            if connection is not self.connection or self.state != HostState.RUNNING \
                    or self._closing:
                return
            if not self.reconnect:
                self._set_lost(connection.lost_reason)
                return
            if self.unreachable_since is not None:
                return
            self.unreachable_since = time.monotonic()
        log.warning("ssh host %s unreachable (%s): reconnecting; its roles run on",
                    self.name, connection.lost_reason)
        threading.Thread(target=self._reconnect, daemon=True,
                         name=f"ssh-reconnect-{self.name}").start()

    def _reconnect(self) -> None:
        """Connect again with backoff until it works or the machine is lost or released."""
        delay = 1.0
        timeouts = replace(self.provider.timeouts, connect_attempts=1, boot_timeout_s=0.0)
        while True:
            with self._link:
                if self.state != HostState.RUNNING or self._closing:
                    return
            try:
                connection = self.connect(timeouts)
            except ProvisionError as error:
                log.info("ssh host %s still unreachable: %s", self.name, error)
                with self._link:
                    self._link.wait(delay)
                delay = min(delay * 1.5, RECONNECT_MAX_DELAY_S)
                continue
            connection.session_process()
            with self._link:
                if self.state != HostState.RUNNING or self._closing:
                    connection.close()
                    return
                since = self.unreachable_since or time.monotonic()
                stale, self.connection = self.connection, connection
                self.unreachable_since = self.alone_since = None
                self.reconnects += 1
                self._link.notify_all()
            log.warning("ssh host %s reachable again after %.0f s", self.name,
                        time.monotonic() - since)
            self._end_stale_session(stale, connection)
            return

    def _end_stale_session(self, stale: SshConnection | None, live: SshConnection) -> None:
        """End, over `live`, the host's side of the dropped connection `stale`: its sshd still
        holds that session (and its SFTP server) until its own keepalive gives up, since our
        side vanished without a goodbye. Best effort: a failure leaves only that session."""
        session = stale.session_process() if stale is not None else None
        if session is None or session == live.session_process():
            return
        try:
            live.run(end_session_command(*session), check=False)
        except ProvisionError as error:
            log.info("ssh host %s: the dropped connection's session was not ended: %s",
                     self.name, error)

    def declare_lost(self, reason: str) -> None:
        """The machine is gone for this run (its provider's decision): waiters get None, its
        roles' handles report their loss."""
        with self._link:
            if self.state == HostState.RUNNING:
                self._set_lost(reason)
        self.abort_open(reason)

    def abort_open(self, reason: str) -> None:
        """Give up the first connection while it still waits for the machine to boot (a VM
        taken, or released, before it ever answered): `open` raises SshUnreachableError."""
        with self._link:
            if self.state == HostState.PENDING and self._opening is not None:
                self.state, self.lost_reason = HostState.REVOKED, reason
                self._opening.close()
                self._link.notify_all()

    def _set_lost(self, reason: str) -> None:
        self.state = HostState.REVOKED
        self.lost_reason = reason
        self._link.notify_all()
        if self.connection is not None:
            self.connection.close()

    def await_connection(self, old: SshConnection | None,
                         timeout_s: float | None = None) -> SshConnection | None:
        """A live connection other than `old` (`runner.Link`): None once the machine is lost or
        released; SshUnreachableError after `timeout_s` (None: no limit). While waiting, the
        provider's graces are applied, so a machine that never comes back is declared lost
        even where nobody polls."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._notice()
            self.provider.judge_unreachable()
            with self._link:
                if self.state != HostState.RUNNING or self._closing:
                    return None
                connection = self.connection
                if connection is not None and connection is not old \
                        and self.unreachable_since is None and not connection.lost.is_set():
                    return connection
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise SshUnreachableError(
                        f"ssh host {self.name} unreachable for {timeout_s:g} s (reconnecting)")
                self._link.wait(1.0 if left is None else min(1.0, left))

    def alive(self) -> bool:
        """Not lost: connected, or unreachable and being reconnected (its roles run on)."""
        if self.state != HostState.RUNNING or self.connection is None:
            return False
        self._notice()
        return self.state == HostState.RUNNING

    def _notice(self) -> None:
        """A dead transport starts the reconnection at once (also one that died before this
        machine adopted it, whose own report found nobody listening)."""
        connection = self.connection
        if connection is not None and self.unreachable_since is None \
                and (not connection.check_alive() or connection.lost.is_set()):
            self._dropped(connection)

    def reachable(self) -> bool:
        """Alive and connected now (no drop being waited out)."""
        return self.alive() and self.unreachable_since is None

    def close(self) -> None:
        with self._link:
            self._closing = True
            self._link.notify_all()
        if self.connection is not None:
            self.connection.close()
