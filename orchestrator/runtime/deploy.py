"""The deployer: starts trainer roles on a cluster's hosts and turns their output into events.

Provider-agnostic: it uses only the launch contract (`provisioning.base.HostRunner`). Before a
host's first role it runs `runner.setup()` and puts the spec on the host (`trainer_spec.json` in
the host's work dir, atomically); every role runs `<runner.trainer_command()> --role R --index I
--spec <host path>` with the host's work dir as its cwd. Parameter servers and workers start
first, the evaluator and the chief right after (the chief waits for the server ports itself);
`start()` returns once every server is ready (its `ready` event, or its port accepts
connections).

Each process gets a reader thread. Stdout lines starting with `@event ` (Contract 2) become
`TrainerEvent`s on one queue; every other line, and stderr, goes to
`<run_dir>/logs/<role>-<index>.log`. When a process exits the deployer adds a synthetic
`process_exit` event with fields `exit_code` (negative = signal) and `expected`: False when a
ps/worker exits outside teardown or a chief/evaluator exits non-zero, so the orchestrator can
react (restart, replace, fail the run). Every event carries `received`: the orchestrator's
clock when it arrived (the role's own clock stays in `time`). `collect()` fetches the roles'
host files (TensorBoard) back into the run directory.

Leases: a role must end by itself when nobody wants it any more (the orchestrator died, or
went on without a machine that froze and thawed later): with each machine's spec the deployer
writes `LEASE` (this deployment's generation, a fresh token) and rewrites it every
LEASE_RENEW_S while the machine is in the cluster; every role gets its path, the token and
LEASE_S in its environment and exits when the lease is gone, names another generation, or was
not renewed for LEASE_S (trainer/control.py `watch_lease`).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.runtime import data
from provisioning.base import (
    STOP_GRACE_S,
    Cluster,
    Host,
    HostId,
    HostLostError,
    HostRunner,
    Provider,
    RemoteProcess,
    Role,
)
from trainer import layout
from trainer.events import parse_event

#: How long a ps/worker may take to become ready (TF servers take about 5 s; imports 3-4 s).
READY_TIMEOUT_S = 120.0
#: How often readiness is re-checked (event flag, exit, port).
READY_POLL_INTERVAL_S = 0.1
#: Connect timeout of one port probe.
PORT_PROBE_TIMEOUT_S = 0.2
#: How long teardown waits for a reader thread to drain after its process is gone.
READER_JOIN_TIMEOUT_S = 2.0
#: How often each machine's lease is renewed, and how long a role outlives its last renewal:
#: long enough for a loaded orchestrator or a reconnecting SSH link, short enough that what a
#: lost machine still runs when it comes back ends within a minute.
LEASE_RENEW_S = 5.0
LEASE_S = 45.0
EVENT_READY = "ready"
EVENT_PROCESS_EXIT = "process_exit"
# Without this the trainer's stdout is block-buffered into the pipe and events arrive late.
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}
_SERVER_ROLES = (Role.PS, Role.WORKER)
_CLIENT_ROLES = (Role.EVALUATOR, Role.CHIEF)  # started after the servers, in this order
_TEARDOWN_WAVES = ((Role.CHIEF, Role.EVALUATOR), (Role.WORKER, Role.PS))


class DeployError(Exception):
    """A role could not be started or did not become ready; the message names it and its log."""


@dataclass(frozen=True)
class TrainerEvent:
    """One event from a trainer role (Contract 2) or synthesized by the deployer.

    `fields` holds every key except kind, time, role and index. `time` is the role's clock;
    `received` the orchestrator's when the line arrived (what run time is measured on)."""

    kind: str
    time: float
    role: str
    index: int
    fields: dict[str, object] = field(default_factory=dict)
    received: float = field(default_factory=time.time, compare=False)


def parse_event_line(line: str) -> TrainerEvent | None:
    """The event on this stdout line; None if it is log text or a malformed event line.

    The trainer's own reader finds the JSON (Contract 2 is read in one place); a line it cannot
    read, or one without the fields every event carries, is treated as log text here."""
    try:
        raw = parse_event(line)
        if raw is None:
            return None
        return TrainerEvent(
            kind=str(raw.pop("kind")),
            time=float(raw.pop("time", time.time())),
            role=str(raw.pop("role")),
            index=int(raw.pop("index")),
            fields=raw,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass
class RoleTask:
    """One running role instance and what the deployer tracks about it."""

    role: Role
    index: int
    host: Host
    process: RemoteProcess
    log_path: Path
    ready: threading.Event = field(default_factory=threading.Event)
    exited: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None


class Deployment:
    """The trainer processes of one run on one cluster. Use as a context manager, or call
    `teardown()` in a `finally`: nothing it started survives teardown.

    `spec_text` is the trainer spec (JSON) put on every host. `command` replaces each runner's
    `trainer_command()` (tests run stand-in scripts); `env` is added to `DEFAULT_ENV` and the
    runner's `trainer_env()`.
    """

    def __init__(
        self,
        provider: Provider,
        cluster: Cluster,
        run_dir: Path,
        spec_text: str,
        *,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        data_dir: Path | None = None,
    ) -> None:
        self.provider = provider
        self.data_dir = data_dir  # the dataset folder here, staged to hosts that don't share it
        self.cluster = cluster
        self.run_dir = Path(run_dir)
        self.spec_text = spec_text
        self.command = None if command is None else list(command)
        self.env = {**DEFAULT_ENV, **(env or {})}
        self._prepared: set[HostId] = set()  # machines with setup done and the spec in place
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.tasks: dict[tuple[Role, int], RoleTask] = {}
        self._events: queue.Queue[TrainerEvent] = queue.Queue()
        self._tearing_down = threading.Event()
        self._lock = threading.Lock()
        self.lease_token = uuid.uuid4().hex[:12]  # this deployment's generation
        self.lease_s = LEASE_S

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.teardown()

    def start(self) -> None:
        """Start every role: servers first, then evaluator and chief, then wait until every
        server is ready.

        The clients start without waiting for the servers: importing TensorFlow takes seconds
        per process, so overlapping it saves most of the start-up, and the chief itself waits
        until every server port accepts connections. Raises DeployError if a server exits or
        is not ready within `ready_timeout_s`; processes already started keep running until
        `teardown()`."""
        self.prepare_all()
        servers = [self.start_role(h) for r in _SERVER_ROLES for h in self.cluster.hosts_for(r)]
        for role in _CLIENT_ROLES:
            for host in self.cluster.hosts_for(role):
                self.start_role(host)
        for task in servers:
            self.wait_ready(task)

    def start_role(self, host: Host, cluster: Cluster | None = None) -> RoleTask:
        """Start the role of `host` (task index from its position in the cluster) and its reader.

        Pass the new `cluster` for a replacement host; it becomes this deployment's cluster.
        A task already running at that role and index is replaced in the table, not stopped.
        Raises provisioning.HostLostError if the host is gone."""
        if cluster is not None:
            self.cluster = cluster
        index = self.cluster.index_of(host)
        log_path = self.run_dir / layout.LOGS_DIR / f"{host.role.value}-{index}.log"
        runner = self.provider.runner(host)
        self._prepare(host, runner)
        argv = [*(self.command or runner.trainer_command()), "--role", host.role.value]
        argv += ["--index", str(index), "--spec", str(host.workdir / layout.SPEC_FILE)]
        lease = {layout.LEASE_ENV: str(host.workdir / layout.LEASE_FILE),
                 layout.LEASE_TOKEN_ENV: self.lease_token, layout.LEASE_S_ENV: f"{self.lease_s:g}"}
        process = runner.start(argv, {**runner.trainer_env(), **self.env, **lease}, None,
                               log_path)
        task = RoleTask(host.role, index, host, process, log_path)
        task.reader = threading.Thread(
            target=self._read_output, args=(task,), name=f"reader-{host.role}-{index}", daemon=True
        )
        with self._lock:
            self.tasks[(host.role, index)] = task
        task.reader.start()
        return task

    def prepare_all(self) -> None:
        """Set up every machine of the cluster and put the spec there, machines in parallel
        (a remote setup can take a while per host). Raises the first error."""
        firsts = {h.machine: h for h in reversed(self.cluster.hosts)}
        errors: list[BaseException] = []

        def prepare(host: Host) -> None:
            try:
                self._prepare(host, self.provider.runner(host))
            except BaseException as error:  # handed to the caller below
                errors.append(error)

        threads = [threading.Thread(target=prepare, args=(h,), name=f"setup-{h.spec.name}")
                   for h in firsts.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _prepare(self, host: Host, runner: HostRunner) -> None:
        """Once per machine: set the host up and put the spec there (hosts sharing a machine
        share its work dir)."""
        with self._lock:
            if host.machine in self._prepared:
                return
        runner.setup()
        runner.write_text(Path(layout.SPEC_FILE), self.spec_text)
        runner.write_text(Path(layout.LEASE_FILE), self.lease_token)
        if (self.data_dir is not None and not runner.shares_orchestrator_fs
                and data.reads_data(self.cluster, host)):
            data.stage_to(runner, self.data_dir)  # the spec names it relative to the work dir
        with self._lock:
            self._prepared.add(host.machine)
        threading.Thread(target=self._renew_lease, args=(host.machine, runner),
                         name=f"lease-{host.spec.name}", daemon=True).start()

    def _renew_lease(self, machine: HostId, runner: HostRunner) -> None:
        """Rewrite the machine's lease every LEASE_RENEW_S while it serves this cluster and
        its provider has not declared it lost (one thread per machine: a frozen one's write
        blocks only its own renewals)."""
        while not self._tearing_down.wait(LEASE_RENEW_S):
            if all(h.machine != machine for h in self.cluster.hosts) or not runner.alive():
                return  # replaced or lost: what it still runs ends when the lease lapses
            with contextlib.suppress(Exception):  # a lost or cut machine: renewed when back
                runner.write_text(Path(layout.LEASE_FILE), self.lease_token)

    def collect(self) -> None:
        """Fetch the roles' TensorBoard files from their hosts into `<run_dir>/tensorboard`
        (at the end, on failure and before a restart moves the roles). A gone host is
        skipped: what it held is lost with it."""
        for host in [*self.cluster.hosts_for(Role.CHIEF), *self.cluster.hosts_for(Role.EVALUATOR)]:
            with contextlib.suppress(HostLostError, OSError):
                runner = self.provider.runner(host)
                runner.fetch(Path(layout.TENSORBOARD_DIR), self.run_dir / layout.TENSORBOARD_DIR)

    def wait_ready(self, task: RoleTask, timeout_s: float | None = None) -> None:
        """Block until `task` is ready: its `ready` event, or its port accepts a connection.

        Raises DeployError if it exits first or is not ready after `timeout_s` (None = the
        deployment's `ready_timeout_s`)."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        name = f"{task.role.value} {task.index}"
        while not task.ready.is_set():
            if task.exited.is_set() or task.process.poll() is not None:
                raise DeployError(
                    f"{name} exited with code {task.process.poll()} before it was ready; "
                    f"see {task.log_path}"
                )
            if _port_accepts(task.host.address, task.host.port):
                task.ready.set()
                break
            if time.monotonic() >= deadline:
                raise DeployError(f"{name} not ready after {timeout_s} s; see {task.log_path}")
            task.ready.wait(READY_POLL_INTERVAL_S)

    def next_event(self, timeout_s: float | None = None) -> TrainerEvent | None:
        """The next event, waiting up to `timeout_s` (None = forever); None if none came."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def events(self, timeout_s: float) -> Iterator[TrainerEvent]:
        """Events as they come; stops once no event arrives for `timeout_s`."""
        while (event := self.next_event(timeout_s)) is not None:
            yield event

    def chief_exit_code(self) -> int | None:
        """The chief's exit code; None while it runs or if no chief was started."""
        task = self.tasks.get((Role.CHIEF, 0))
        return None if task is None else task.process.poll()

    def wait_for_completion(self, timeout_s: float | None = None) -> bool:
        """Block until the chief and every evaluator have exited (any exit code); False on
        timeout (None = wait forever). Does not consume events."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            clients = [t for t in self.tasks.values() if t.role in _CLIENT_ROLES]
        for task in clients:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                task.process.wait(left)
            except TimeoutError:
                return False
        return True

    def teardown(self) -> None:
        """Stop every process on every host (chief and evaluator first, then workers and
        parameter servers) and wait for the readers to drain. Idempotent; does not release the hosts (that is the provider's)."""
        self._tearing_down.set()
        for roles in _TEARDOWN_WAVES:
            hosts = [h for r in roles for h in self.cluster.hosts_for(r)]
            # Hosts stop in parallel so teardown costs one grace period per wave, not per host.
            threads = [threading.Thread(target=self._stop_host, args=(h,)) for h in hosts]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        with self._lock:
            tasks = list(self.tasks.values())
        for task in tasks:
            task.process.kill()  # hosts replaced out of the cluster still hold their tasks
            if task.reader is not None:
                task.reader.join(READER_JOIN_TIMEOUT_S)

    def _stop_host(self, host: Host) -> None:
        with contextlib.suppress(HostLostError):  # a gone host runs nothing
            self.provider.runner(host).stop_all(self.stop_grace_s)

    def _read_output(self, task: RoleTask) -> None:
        with open(task.log_path, "a", buffering=1) as log:
            for line in task.process.stdout_lines():
                event = parse_event_line(line)
                if event is None:
                    log.write(line + "\n")
                    continue
                self._events.put(event)  # queued first: whoever sees it ready finds it
                if event.kind == EVENT_READY:
                    task.ready.set()
        exit_code = task.process.wait()
        task.exited.set()
        self._events.put(self._exit_event(task, exit_code))

    def _exit_event(self, task: RoleTask, exit_code: int) -> TrainerEvent:
        expected = self._tearing_down.is_set() or (task.role in _CLIENT_ROLES and exit_code == 0)
        return TrainerEvent(
            kind=EVENT_PROCESS_EXIT,
            time=time.time(),
            role=task.role.value,
            index=task.index,
            fields={"exit_code": exit_code, "expected": expected, "host_id": task.host.id},
        )


def _port_accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=PORT_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
