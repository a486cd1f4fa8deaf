"""`SshProvider`: the launch contract on a static inventory of machines reached over SSH.

- acquire: place each machine-owning host spec on an inventory machine (explicit `placement`
  first, then inventory order; `labels.gpu` must match a role's GPU type when both are set;
  `spare` machines are kept for replacements), then connect to every machine in parallel (one
  connection each, handshakes capped). A machine that cannot be reached, refuses our key or
  shows an unexpected host key fails the acquire with one line; nothing is left connected.
- Colocated hosts (`HostSpec.colocate_with`) share their machine's connection, address and
  work dir, each with its own port.
- setup: the first `runner.setup()` of a run sets up every placed machine in parallel (wheel
  built once, environments cached on the hosts; `provisioning.ssh.setup`).
- poll: answered from the connections' heartbeats (no network call): a machine whose heartbeat
  went unanswered, or whose connection closed, is REVOKED, with every host on it.
- replace: a lost host on a machine that still answers is restarted there (same endpoint); a
  lost machine is swapped for a spare inventory machine, which has another address, so only
  when `keep_endpoints` is False (a restart); otherwise CapacityError (recovery shrinks).
- release: stop every role (TERM, grace, KILL) and close the connections; machines that were
  lost are tried once more, briefly, so their roles do not outlive the run when they come back.
- revoke: write the preemption notice on the host over SFTP, then after `notice_s` KILL every
  role on the machine and treat it as revoked.
- clean_up: connect to the machines a crashed run's journal names and stop what still runs
  there (guarded by each group's recorded start time).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import paramiko

from provisioning.base import (
    PREEMPTION_NOTICE_FILE,
    STOP_GRACE_S,
    BadRequestError,
    CapacityError,
    CleanUpResult,
    Cluster,
    ClusterRequest,
    ContactLostError,
    Host,
    HostId,
    HostLostError,
    HostRunner,
    HostSpec,
    HostState,
    Provider,
    ProvisionError,
    RemoteProcess,
    ResourceJournal,
)
from provisioning.ssh.config import SshHostConfig, SshProviderConfig, assign
from provisioning.ssh.connection import (
    ByteCounter,
    SshConnection,
    SshTarget,
    SshTimeouts,
    SshUnreachableError,
    end_session_command,
    set_handshake_limit,
)
from provisioning.ssh.runner import (
    RoleLauncher,
    group_alive_command,
    kill_groups_command,
    sftp_get,
    sftp_makedirs,
    sftp_put,
)
from provisioning.ssh.setup import Environment, WheelCache, ensure_environment, source_stamp

log = logging.getLogger(__name__)

#: File in the run directory recording host keys pinned on first use (public fingerprints).
PINNED_KEYS_FILE = "ssh_pinned_host_keys.jsonl"
DATASETS_DIR = "datasets"  # under a machine's root: datasets kept across runs (dataset_cache)
#: How long release() and clean_up() try to reach a machine that was lost.
RETRY_LOST_CONNECT_S = 3.0
#: Longest pause between two reconnection attempts to an unreachable machine: after a drop
#: ends, every machine is reconnected within this (plus one handshake).
RECONNECT_MAX_DELAY_S = 10.0
#: Tries of one file transfer cut short by dropped connections.
TRANSFER_ATTEMPTS = 3
KILL_CONFIRM_S = 5.0  # after KILL, how long a leftover group may take to be gone (reaped)

_wheel_caches: dict[tuple[str, str | None, str, str | None], WheelCache] = {}
_wheel_caches_lock = threading.Lock()


def _wheel_cache(wheelhouse: str | None, extra: str, index_url: str | None) -> WheelCache:
    """One wheel per state of the sources: built at most once per run, and kept in the user's
    cache (`$XDG_CACHE_HOME/transient-orchestrator/wheels/<source stamp>/`) for later runs."""
    stamp = source_stamp()
    key = (stamp, wheelhouse, extra, index_url)
    with _wheel_caches_lock:
        if key not in _wheel_caches:
            cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            work_dir = cache_root / "transient-orchestrator" / "wheels" / stamp[:24]
            work_dir.mkdir(parents=True, exist_ok=True)
            _wheel_caches[key] = WheelCache(
                work_dir, None if wheelhouse is None else Path(wheelhouse).expanduser(), extra,
                index_url)
        return _wheel_caches[key]


class Machine:
    """One inventory machine as this provider uses it: its connection, state and setup.

    A dropped connection (a missed heartbeat, a closed transport) makes the machine
    *unreachable*, not lost: it is reconnected in the background with backoff (at most
    RECONNECT_MAX_DELAY_S between tries) while its roles run on, and only the provider
    declares it lost (`declare_lost`: SshProvider's graces, or the cloud's word on a VM).
    Everything that needs its connection meanwhile waits (`await_connection`)."""

    def __init__(self, inventory: SshHostConfig, provider: SshProvider,
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
                                   on_pin=self.provider._record_pin, on_lost=self._dropped,
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
            self.provider._judge_unreachable()
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
        self.machine.provider._setup([self.machine])
        self.machine.provider._setup_all_placed()
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


class SshProvider(Provider):
    """See the module docstring."""

    name = "ssh"
    can_revoke = True

    def __init__(self, config: SshProviderConfig | None = None, *,
                 journal: ResourceJournal | None = None) -> None:
        self.config = config or SshProviderConfig()
        self._journal = journal
        self.timeouts = SshTimeouts(
            connect_s=self.config.connect_timeout_s, command_s=self.config.command_timeout_s,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s)
        set_handshake_limit(self.config.max_parallel_handshakes)
        self._machines: dict[str, Machine] = {}  # inventory name -> machine in use (or lost)
        self._host_machine: dict[HostId, Machine] = {}
        self._runners: dict[HostId, SshHostRunner] = {}
        self._states: dict[HostId, HostState] = {}  # hosts released or replaced by us
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._run_dir: Path | None = None
        self.contact_lost: str | None = None  # set once no machine answered for the grace
        self._setup_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="ssh-setup")

    # --- acquire ----------------------------------------------------------------------------

    def acquire(self, request: ClusterRequest) -> Cluster:
        problems = self.config.check()
        if problems:
            field_name, problem = problems[0]
            raise BadRequestError(f"{field_name}: {problem}")
        self._run_dir = request.workdir
        placed = self._place(request.hosts)
        machines = list({id(m): m for m in placed.values()}.values())
        try:
            self._open_all(machines)
        except BaseException:
            for machine in machines:
                machine.close()
                self._machines.pop(machine.name, None)
            raise
        hosts: list[Host] = []
        by_name: dict[str, Host] = {}
        for spec in request.hosts:
            if spec.colocate_with is None:
                host = self._new_host(request.run_id, spec, placed[spec.name])
            else:
                owner = by_name[spec.colocate_with]
                host = self._new_host(request.run_id, spec, self._host_machine[owner.id],
                                      owner=owner)
            by_name[spec.name] = host
            hosts.append(host)
        return Cluster(run_id=request.run_id, hosts=hosts)

    def _place(self, specs: Sequence[HostSpec], spare_ok: bool = False) -> dict[str, Machine]:
        """Inventory machine for every machine-owning spec; reserves them (self._machines)."""
        placed: dict[str, Machine] = {}
        inventory = {h.name: h for h in self.config.hosts}
        owners = [s for s in specs if s.colocate_with is None]
        with self._lock:
            for spec in owners:  # explicit placement first
                wanted = self.config.placement.get(spec.name)
                if wanted is None:
                    continue
                machine = self._machines.get(wanted)
                if machine is None:
                    machine = self._machines[wanted] = Machine(inventory[wanted], self)
                placed[spec.name] = machine
            chosen, need = assign(self.config.hosts, [(s.name, s.gpu) for s in owners
                                                      if s.name not in placed],
                                  set(self._machines), spare_ok)
            if need:
                for machine in placed.values():
                    self._machines.pop(machine.name, None)
                raise CapacityError(
                    f"provider.hosts: no free inventory machine for {', '.join(need)} "
                    f"({len(self.config.hosts)} in the inventory, "
                    f"{len(self._machines)} in use or lost)")
            for name, choice in chosen.items():
                placed[name] = self._machines[choice.name] = Machine(choice, self)
        return placed

    def _open_all(self, machines: Sequence[Machine]) -> None:
        """Connect to every machine in parallel; the first error (in inventory order) wins."""
        pending = [m for m in machines if m.connection is None]
        errors: dict[str, BaseException] = {}

        def open_one(machine: Machine) -> None:
            try:
                machine.open()
            except BaseException as error:  # reported below, in order
                errors[machine.name] = error

        threads = [threading.Thread(target=open_one, args=(m,), name=f"ssh-open-{m.name}")
                   for m in pending]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for machine in pending:
            if machine.name in errors:
                raise errors[machine.name]

    def _new_host(self, run_id: str, spec: HostSpec, machine: Machine,
                  owner: Host | None = None, port: int | None = None) -> Host:
        with self._lock:
            n = next(self._ids)
        host_id = f"{run_id}-{spec.name}-{n}"
        # A colocated host works in its machine's dir (the spec and notice are shared).
        workdir = (owner.workdir if owner is not None else
                   Path(posixpath.join(machine.root, "runs", run_id, f"{spec.name}-{n}")))
        host = Host(id=host_id, spec=spec, address=machine.inventory.address,
                    port=next(machine.ports) if port is None else port, workdir=workdir,
                    state=HostState.RUNNING, machine=host_id if owner is None else owner.id)
        self._host_machine[host_id] = machine
        self._runners[host_id] = SshHostRunner(host, machine, self._journal)
        return host

    def _record_pin(self, hostname: str, fingerprint: str) -> None:
        log.warning("ssh: pinned the host key of %s on first use: %s", hostname, fingerprint)
        if self._run_dir is not None:
            self._run_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError), open(self._run_dir / PINNED_KEYS_FILE, "a") as f:
                f.write(json.dumps({"host": hostname, "fingerprint": fingerprint,
                                    "known_hosts": self.config.known_hosts,
                                    "time": time.time()}) + "\n")

    # --- setup -------------------------------------------------------------------------------

    def _setup(self, machines: Sequence[Machine]) -> None:
        cache = None  # looked up (a scan of the sources) only when a machine needs it
        for machine in machines:
            with machine.lock:
                if machine.setup_future is None and machine.alive():
                    assert machine.connection is not None
                    cache = cache or _wheel_cache(self.config.wheelhouse, self.config.extra,
                                                  self.config.index_url)
                    machine.setup_future = self._setup_pool.submit(
                        ensure_environment, machine.connection, machine.root,
                        machine.inventory.python, cache, self.config.extra)

    def _setup_all_placed(self) -> None:
        """Set up every machine in use at once (the first setup() of a run pays for all)."""
        with self._lock:
            machines = [m for m in self._machines.values() if m.alive()]
        self._setup(machines)

    # --- the rest of the contract -----------------------------------------------------------

    def runner(self, host: Host) -> SshHostRunner:
        try:
            return self._runners[host.id]
        except KeyError:
            raise HostLostError(host.id, f"host {host.id} was not acquired here") from None

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        """A machine that dropped its connection stays RUNNING while it is reconnected (its
        roles run on) and is REVOKED once the graces say it is lost (`_judge_unreachable`);
        ContactLostError once no machine has answered for `outage_grace_s`."""
        self._judge_unreachable()
        if self.contact_lost is not None:
            raise ContactLostError(self.contact_lost)
        states = {}
        for host in cluster.hosts:
            known = self._states.get(host.id)
            machine = self._host_machine.get(host.id)
            if known is not None:
                states[host.id] = known
            elif machine is None:
                states[host.id] = HostState.REVOKED
            else:
                states[host.id] = (HostState.RUNNING if machine.alive() else
                                   HostState.REVOKED if machine.state != HostState.TERMINATED
                                   else HostState.TERMINATED)
        return states

    def _judge_unreachable(self) -> None:
        """Apply the graces to unreachable machines (docs/ssh.md, "Losing contact"): lost
        after `unreachable_grace_s` of being unreachable while another machine answers (that
        machine, not our network, is the problem), or after `outage_grace_s` while none
        answers (our own network is down: every machine is lost, and the run stops resumable
        rather than restarting on machines it cannot reach either)."""
        cfg, now = self.config, time.monotonic()
        with self._lock:
            machines = [m for m in self._machines.values()
                        if m.state == HostState.RUNNING and m.connection is not None]
        answering = [m for m in machines if m.unreachable_since is None]
        silent = [m for m in machines if m.unreachable_since is not None]
        for machine in silent:
            since = machine.unreachable_since
            if since is None:  # reconnected meanwhile
                continue
            if any(o is not machine for o in answering):
                machine.alone_since = machine.alone_since or now
            else:
                machine.alone_since = None
            if machine.alone_since is not None \
                    and now - machine.alone_since >= cfg.unreachable_grace_s:
                machine.declare_lost(f"unreachable for {now - since:.0f} s while other "
                                     f"machines answered (provider.unreachable_grace_s="
                                     f"{cfg.unreachable_grace_s:g})")
            elif now - since >= cfg.outage_grace_s and not answering:
                machine.declare_lost(f"unreachable for {now - since:.0f} s "
                                     f"(provider.outage_grace_s={cfg.outage_grace_s:g})")
                if self.contact_lost is None:
                    self.contact_lost = (
                        f"no machine has answered over SSH for {cfg.outage_grace_s:g} s "
                        f"(provider.outage_grace_s): the orchestrator's network is down, most "
                        f"likely; the roles end on their own within their lease")

    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        for host_id in lost:
            cluster.host(host_id)  # KeyError for a stranger
        lost_ids = set(cluster.same_machine(list(lost)))
        owners = [h for h in cluster.hosts if h.id in lost_ids and not h.colocated]
        # Where each lost machine-owning host goes: its machine if it still answers, else a spare.
        targets: dict[HostId, Machine] = {}
        dead = [h for h in owners if not self._host_machine[h.id].alive()]
        if dead and keep_endpoints:
            names = ", ".join(f"{h.spec.name} ({h.address})" for h in dead)
            raise CapacityError(f"ssh: machine of {names} is lost and no other inventory "
                                f"machine has its address; the endpoint cannot be kept")
        for host in owners:
            if host in dead:
                continue
            targets[host.id] = self._host_machine[host.id]
        if dead:
            spares = self._place([h.spec for h in dead], spare_ok=True)
            self._open_all(list(spares.values()))
            for host in dead:
                targets[host.id] = spares[host.spec.name]
        for host in cluster.hosts:
            if host.id in lost_ids:
                self._retire(host, HostState.REVOKED)
        hosts: list[Host] = []
        new_owner: dict[HostId, Host] = {}
        for host in cluster.hosts:
            if host.id not in lost_ids:
                hosts.append(host)
                continue
            if host.colocated:
                owner = new_owner[host.machine]
                same_port = keep_endpoints or owner.address == host.address
                new = self._new_host(cluster.run_id, host.spec, self._host_machine[owner.id],
                                     owner=owner, port=host.port if same_port else None)
            else:
                machine = targets[host.id]
                same_port = machine.inventory.address == host.address
                new = self._new_host(cluster.run_id, host.spec, machine,
                                     port=host.port if same_port else None)
                new_owner[host.id] = new
            hosts.append(new)
        return Cluster(run_id=cluster.run_id, hosts=hosts)

    def _retire(self, host: Host, state: HostState) -> None:
        runner = self._runners.get(host.id)
        if runner is not None:
            runner.mark_gone()
            with contextlib.suppress(ProvisionError):
                runner.stop_all(self.config.stop_grace_s)
        self._states[host.id] = state

    def release(self, cluster: Cluster) -> None:
        runners = [self._runners[h.id] for h in cluster.hosts if h.id in self._runners]
        for runner in runners:  # out of contact now: stopped below if it answers again
            if runner.machine.alive() and not runner.machine.reachable():
                runner.machine.declare_lost("released while unreachable")
        threads = [threading.Thread(target=self._stop_quietly, args=(r,)) for r in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for host in cluster.hosts:
            if host.id in self._runners and host.id not in self._states:
                self._states[host.id] = HostState.TERMINATED
        self._retry_lost()
        with self._lock:
            live_hosts = [h for h, m in self._host_machine.items() if h not in self._states]
            in_use = {self._host_machine[h].name for h in live_hosts}
            for name, machine in list(self._machines.items()):
                if name not in in_use:
                    machine.close()
                    if machine.state == HostState.RUNNING:
                        machine.state = HostState.TERMINATED
                        del self._machines[name]  # free for the next acquire

    @staticmethod
    def _stop_quietly(runner: SshHostRunner) -> None:
        runner.mark_gone()
        with contextlib.suppress(ProvisionError):
            runner.stop_all(runner.machine.provider.config.stop_grace_s)

    def _retry_lost(self) -> None:
        """Stop roles on lost machines that answer again (briefly: they usually do not)."""
        by_machine: dict[str, list[tuple[SshHostRunner, list[tuple[int, int | None]]]]] = {}
        for runner in self._runners.values():
            groups = runner.launcher.maybe_running()
            if groups and not runner.machine.alive():
                by_machine.setdefault(runner.machine.name, []).append((runner, groups))
        for name, items in by_machine.items():
            machine = self._machines.get(name) or items[0][0].machine
            groups = [g for _, gs in items for g in gs]
            if self._kill_on(machine.inventory, groups, self.config.stop_grace_s) is not None:
                for runner, gs in items:
                    runner.launcher.forget([g for g, _ in gs])

    def _kill_on(self, inventory: SshHostConfig, groups: Sequence[tuple[int, int | None]],
                 grace_s: float) -> list[int] | None:
        """Connect afresh and stop these groups (TERM, grace, KILL); the pgids that were still
        running, or None if the machine cannot be reached."""
        machine = Machine(inventory, self, reconnect=False)
        timeouts = SshTimeouts(connect_s=RETRY_LOST_CONNECT_S, command_s=30.0,
                               heartbeat_interval_s=3600.0, heartbeat_timeout_s=60.0,
                               connect_attempts=1)
        try:
            connection = machine.connect(timeouts)
        except ProvisionError as error:
            log.warning("ssh: cannot reach %s to stop leftovers: %s", inventory.name, error)
            return None
        try:
            pgids = [g for g, _ in groups]
            running = [int(g) for g in
                       connection.run(group_alive_command(pgids), check=False).stdout.split()]
            def wait_gone(seconds: float) -> bool:
                deadline = time.monotonic() + seconds
                while connection.run(group_alive_command(pgids), check=False).stdout.split():
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.1)
                return True

            if running:
                connection.run(kill_groups_command("TERM", groups), check=False)
                if not wait_gone(grace_s):
                    connection.run(kill_groups_command("KILL", groups), check=False)
                    # gone, not merely signalled: the caller reports nothing left running
                    wait_gone(KILL_CONFIRM_S)
            return running
        except ProvisionError as error:
            log.warning("ssh: stopping leftovers on %s failed: %s", inventory.name, error)
            return None
        finally:
            connection.close()

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        runner = self.runner(host)
        if notice_s > 0:
            notice = {"host_id": host.id, "deadline": time.time() + notice_s}
            runner.write_text(runner.notice_path, json.dumps(notice) + "\n")
            timer = threading.Timer(notice_s, self._kill_machine, args=(runner.machine,))
            timer.daemon = True
            timer.start()
        else:
            self._kill_machine(runner.machine)

    def _kill_machine(self, machine: Machine) -> None:
        """A revocation: every role on the machine is KILLed, then the machine is gone."""
        if not machine.alive():
            return
        runners = [r for r in self._runners.values() if r.machine is machine]
        for runner in runners:
            runner.mark_gone()
        threads = [threading.Thread(target=r.launcher.stop_all, args=(0.0,)) for r in runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        machine.declare_lost("revoked")
        machine.close()

    def clean_up(self, entries: Sequence[Any], grace_s: float = STOP_GRACE_S
                 ) -> list[CleanUpResult]:
        """Stop the journal's unreleased process groups on their machines (found by address in
        the inventory), each guarded by its recorded start time."""
        inventory = {h.address: h for h in self.config.hosts}
        results: dict[int, CleanUpResult] = {}
        by_address: dict[str, list[Any]] = {}
        for i, entry in enumerate(entries):
            if entry.pgid is None or entry.address not in inventory:
                results[i] = CleanUpResult(entry, False, (
                    f"{entry.kind} {entry.resource_id} on host {entry.host_id} "
                    f"({entry.address or '?'}): not a process group on an inventory machine of "
                    f"this run's provider config; left alone"))
                continue
            by_address.setdefault(entry.address, []).append((i, entry))
        for address, items in by_address.items():
            running = self._kill_on(inventory[address], [(e.pgid, e.start_ticks)
                                                         for _, e in items], grace_s)
            for i, entry in items:
                if running is None:
                    results[i] = CleanUpResult(entry, False, (
                        f"process group {entry.pgid} on {address} (host {entry.host_id}): "
                        f"machine unreachable; still recorded"))
                elif entry.pgid in running:
                    results[i] = CleanUpResult(entry, True, (
                        f"stopped process group {entry.pgid} on {address} "
                        f"(host {entry.host_id})"))
                else:
                    results[i] = CleanUpResult(entry, True)
        return [results[i] for i in range(len(entries))]
