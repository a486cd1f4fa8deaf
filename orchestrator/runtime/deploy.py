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
not renewed for its lease (trainer/control.py `watch_lease`). The lease outlives the
provider's contact grace (`role_lease_s`): a drop of the orchestrator's own network that the
provider waits out must not end the roles it will re-attach to.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.rundir.results import EVENT_HOST_SETUP, EVENT_PROCESS_EXIT
from orchestrator.runtime import data
from provisioning.base import (
    STOP_GRACE_S,
    Cluster,
    ContactLostError,
    Host,
    HostId,
    HostLostError,
    HostRunner,
    HostState,
    Provider,
    ProvisionError,
    RemoteProcess,
    Role,
)
from trainer import layout
from trainer.events import EVENT_READY, parse_event

#: How long a ps/worker may take to become ready (TF servers take about 5 s; imports 3-4 s).
READY_TIMEOUT_S = 120.0
#: How often readiness is re-checked (event flag, exit, port).
READY_POLL_INTERVAL_S = 0.1
#: How often the provider is asked about the cluster while machines are set up: its poll is
#: what declares a preempted machine lost, so that a setup waiting on its connection fails.
SETUP_POLL_S = 1.0
#: Connect timeout of one port probe.
PORT_PROBE_TIMEOUT_S = 0.2
#: How long teardown waits for a reader thread to drain after its process is gone.
READER_JOIN_TIMEOUT_S = 2.0
#: How often each machine's lease is renewed, and how long a role outlives its last renewal:
#: long enough for a loaded orchestrator or a reconnecting SSH link, short enough that what a
#: lost machine still runs when it comes back ends within a minute.
LEASE_RENEW_S = 5.0
LEASE_S = 45.0


#: The newest deployment's lease token per machine in this process: an older deployment's
#: renewals must not write its token back over a newer generation's (which ends its roles).
_generation_of: dict[HostId, str] = {}
_generations_lock = threading.Lock()


def role_lease_s(contact_grace_s: float) -> float:
    """The roles' lease for a provider that waits `contact_grace_s` for a machine it cannot
    reach (`ProviderConfig.contact_grace_s`): that grace plus LEASE_S, so roles outlive every
    drop the provider waits out and still end once it gave up on them."""
    return LEASE_S + max(0.0, contact_grace_s)

# Without this the trainer's stdout is block-buffered into the pipe and events arrive late.
DEFAULT_ENV = {"PYTHONUNBUFFERED": "1"}
_SERVER_ROLES = (Role.PS, Role.WORKER)
_CLIENT_ROLES = (Role.EVALUATOR, Role.CHIEF)  # started after the servers, in this order
_TEARDOWN_WAVES = ((Role.CHIEF, Role.EVALUATOR), (Role.WORKER, Role.PS))


class DeployError(Exception):
    """A role could not be started or did not become ready; the message names it and its log."""


class MachinesLostError(DeployError):
    """Machines were lost (preempted, gone) while the deployment set them up or started their
    roles: before any training step, a loss like any later one, which the supervisor hands to
    recovery (`Supervisor.deploy`). `hosts`: every host on those machines."""

    def __init__(self, hosts: Sequence[Host], cause: str) -> None:
        self.hosts = list(hosts)
        names = ", ".join(h.spec.name for h in self.hosts)
        super().__init__(f"lost {names} before training started ({cause})")


def lost_hosts(provider: Provider, cluster: Cluster, suspects: Sequence[Host] = (),
               declared: Sequence[Host] = ()) -> list[Host]:
    """The hosts of `cluster` on machines that are gone: those the provider no longer calls
    RUNNING, and those it declared lost itself (`declared`: their calls raised HostLostError).
    While a `suspect` (a host whose call failed) is still RUNNING, the provider is asked again
    for up to its state lag (`Provider.state_lag_s`): a preempted VM's calls can fail before
    its cloud's listing says so, and the cause must come from the provider, not the order."""
    deadline = time.monotonic() + (provider.state_lag_s() + SETUP_POLL_S if suspects else 0.0)
    gone = {h.machine for h in declared}
    while True:
        try:
            states = provider.poll(cluster)
        except ContactLostError:
            raise
        except (ProvisionError, OSError):  # the provider's API hiccups: the next ask decides
            states = {}
        gone |= {h.machine for h in cluster.hosts
                 if states.get(h.id, HostState.RUNNING) != HostState.RUNNING}
        if all(h.machine in gone for h in suspects) or time.monotonic() >= deadline:
            return [h for h in cluster.hosts if h.machine in gone]
        time.sleep(READY_POLL_INTERVAL_S)


def run_polling(provider: Provider, cluster: Cluster,
                calls: Mapping[Host, Callable[[], object]]) -> dict[Host, BaseException]:
    """Run `calls` (each on its host's machine) in parallel threads, asking the provider about
    `cluster` every SETUP_POLL_S meanwhile: its poll is what declares a preempted machine lost,
    so a call waiting on that machine (a first login waiting for its boot, a setup) fails
    instead of waiting on. Returns each failed call's error by host; raises ContactLostError,
    once every call has ended, when a poll did."""
    errors: dict[Host, BaseException] = {}

    def call(host: Host) -> None:
        try:
            calls[host]()
        except BaseException as error:  # handed to the caller below
            errors[host] = error

    threads = [threading.Thread(target=call, args=(h,), name=f"setup-{h.spec.name}")
               for h in calls]
    for thread in threads:
        thread.start()
    contact: ContactLostError | None = None
    while any(thread.is_alive() for thread in threads):
        next(t for t in threads if t.is_alive()).join(SETUP_POLL_S)
        try:
            provider.poll(cluster)
        except ContactLostError as lost:  # raised once every call has ended
            contact = lost
        except (ProvisionError, OSError):  # the provider's API hiccups: asked again
            pass
    if contact is not None:
        raise contact
    return errors


def raise_if_lost(provider: Provider, cluster: Cluster,
                  failed: Mapping[Host, BaseException]) -> None:
    """MachinesLostError when a machine of `cluster` is gone (`lost_hosts`, with the hosts of
    `failed` as suspects and their errors as the cause); nothing otherwise."""
    declared = [h for h, error in failed.items() if isinstance(error, HostLostError)]
    lost = lost_hosts(provider, cluster, list(failed), declared)
    if lost:
        error = next(iter(failed.values()), None)
        cause = "gone" if error is None else f"{type(error).__name__}: {error}"
        raise MachinesLostError(lost, cause) from error


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
        lease_s: float = LEASE_S,
        data_source: str | None = None,
    ) -> None:
        self.provider = provider
        self.data_dir = data_dir  # the dataset folder here, staged to hosts that don't share it
        # how (DataStager): as given, else the provider's `data_source` (every backend keeps
        # its ProviderConfig as `config`; a stand-in without one gets the default)
        source = data_source or getattr(getattr(provider, "config", None), "data_source", "auto")
        self._stager = None if data_dir is None else data.DataStager(
            data_dir, Path(run_dir), source, provider.dataset_store())
        self.cluster = cluster
        self.run_dir = Path(run_dir)
        self.spec_text = spec_text
        self.command = None if command is None else list(command)
        self.env = {**DEFAULT_ENV, **(env or {})}
        self._prepared: set[HostId] = set()  # machines with setup done and the spec in place
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.tasks: dict[tuple[Role, int], RoleTask] = {}
        self._events: queue.Queue[TrainerEvent | None] = queue.Queue()  # None: `wake`
        self._tearing_down = threading.Event()
        self._lock = threading.Lock()
        self.lease_token = uuid.uuid4().hex[:12]  # this deployment's generation
        self.lease_s = lease_s

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.teardown()

    def start(self) -> None:
        """Start every role: servers first, then evaluator and chief, then wait until every
        server is ready.

        The clients start without waiting for the servers: importing TensorFlow takes seconds
        per process, so overlapping it saves most of the start-up, and the chief itself waits
        until every server port accepts connections. Raises MachinesLostError when the
        provider says a machine is gone on the way (setup, a role's start, a server that exits
        or is not ready, or at the end), else DeployError if a server exits or is not ready
        within `ready_timeout_s`; processes already started keep running until `teardown()`."""
        self.prepare_all()
        servers = [self._start_or_lost(h) for r in _SERVER_ROLES
                   for h in self.cluster.hosts_for(r)]
        for role in _CLIENT_ROLES:
            for host in self.cluster.hosts_for(role):
                self._start_or_lost(host)
        for task in servers:
            try:
                self.wait_ready(task)
            except DeployError as error:
                self._raise_if_lost({task.host: error})
                raise
        self._raise_if_lost({})  # gone while its role started, with nothing failing yet

    def _start_or_lost(self, host: Host) -> RoleTask:
        try:
            return self.start_role(host)
        except (ProvisionError, OSError) as error:
            self._raise_if_lost({host: error})
            raise

    def _raise_if_lost(self, failed: Mapping[Host, BaseException]) -> None:
        raise_if_lost(self.provider, self.cluster, failed)

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
        (a remote setup can take a while per host), asking the provider about the cluster
        every SETUP_POLL_S meanwhile (its poll declares a preempted machine lost, so a setup
        waiting on that machine's connection fails instead of waiting for it). Raises
        MachinesLostError when a machine is gone by the end (whatever its setup did), else
        the first error."""
        firsts = {h.machine: h for h in reversed(self.cluster.hosts)}

        def prepare(host: Host) -> None:
            self._prepare(host, self.provider.runner(host))

        errors = run_polling(self.provider, self.cluster,
                             {h: functools.partial(prepare, h) for h in firsts.values()})
        self._raise_if_lost(errors)  # also gone during a setup that went through regardless
        if errors:
            raise next(iter(errors.values()))

    def _prepare(self, host: Host, runner: HostRunner) -> None:
        """Once per machine: set the host up, put the spec there (hosts sharing a machine
        share its work dir) and, where a role reads it, the dataset (`data.DataStager`); then
        a `host_setup` event with what that sent over the machine's link (a setup the provider
        ran earlier, e.g. a replacement's in the background, shows in `bytes_sent_total`)."""
        with self._lock:
            if host.machine in self._prepared:
                return
        started, sent = time.monotonic(), runner.bytes_sent()
        runner.setup()
        runner.write_text(Path(layout.SPEC_FILE), self.spec_text)
        with _generations_lock:  # this generation holds the machine now: an older one stops
            _generation_of[host.machine] = self.lease_token  # renewing its token over ours
        runner.write_text(Path(layout.LEASE_FILE), self.lease_token)
        staged = None
        if (self._stager is not None and not runner.shares_orchestrator_fs
                and data.reads_data(self.cluster, host)):
            staged = self._stager.stage(host, runner)  # the spec names it under the work dir
        with self._lock:
            self._prepared.add(host.machine)
        after = runner.bytes_sent()
        self._events.put(TrainerEvent(EVENT_HOST_SETUP, time.time(), host.role.value,
                                      self.cluster.index_of(host), {
            "machine": host.machine, "address": host.address, "lease": self.lease_token,
            "setup_s": round(time.monotonic() - started, 3),
            "bytes_sent": None if after is None or sent is None else after - sent,
            "bytes_sent_total": after,  # since the machine was first connected (acquire too)
            "data": None if staged is None else staged.how,
            "data_pushed_bytes": None if staged is None else staged.pushed_bytes,
            # the run's one upload to the provider's dataset store, on the machine that needed it
            **({"data_uploaded_bytes": staged.uploaded_bytes}
               if staged is not None and staged.uploaded_bytes is not None else {}),
            **({"data_note": staged.note} if staged is not None and staged.note else {})}))
        threading.Thread(target=self._renew_lease, args=(host.machine, runner),
                         name=f"lease-{host.spec.name}", daemon=True).start()

    def _renew_lease(self, machine: HostId, runner: HostRunner) -> None:
        """Rewrite the machine's lease every LEASE_RENEW_S while it serves this cluster and
        its provider has not declared it lost (one thread per machine: a frozen one's write
        blocks only its own renewals)."""
        while not self._tearing_down.wait(LEASE_RENEW_S):
            if all(h.machine != machine for h in self.cluster.hosts) or not runner.alive():
                return  # replaced or lost: what it still runs ends when the lease lapses
            with _generations_lock:
                if _generation_of.get(machine) != self.lease_token:
                    return  # a newer deployment took the machine: its roles end ours at once
            with contextlib.suppress(Exception):  # a lost or cut machine: renewed when back
                runner.write_text(Path(layout.LEASE_FILE), self.lease_token)

    def collect(self) -> None:
        """Fetch the roles' TensorBoard files from their hosts into `<run_dir>/tensorboard`
        (at the end, on failure and before a restart moves the roles). A gone host is
        skipped: what it held is lost with it."""
        for host in [*self.cluster.hosts_for(Role.CHIEF), *self.cluster.hosts_for(Role.EVALUATOR)]:
            with contextlib.suppress(ProvisionError, OSError):  # lost, or out of contact
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
                if task.reader is not None:  # the log complete: its last line is the cause
                    task.reader.join(READER_JOIN_TIMEOUT_S)
                raise DeployError(
                    f"{name} exited with code {task.process.poll()} before it was ready"
                    f"{_cause_in_log(task.log_path)}; see {task.log_path}"
                )
            if _port_accepts(task.host.address, task.host.port):
                task.ready.set()
                break
            if time.monotonic() >= deadline:
                raise DeployError(f"{name} not ready after {timeout_s} s; see {task.log_path}")
            task.ready.wait(READY_POLL_INTERVAL_S)

    def next_event(self, timeout_s: float | None = None) -> TrainerEvent | None:
        """The next event, waiting up to `timeout_s` (None = forever); None if none came or
        `wake` ended the wait."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def wake(self) -> None:
        """End a `next_event` wait now (from any thread): work the waiter does between
        events is ready (a background replacement's hosts), so it need not wait out its
        timeout before starting their roles."""
        self._events.put(None)

    def events(self, timeout_s: float) -> Iterator[TrainerEvent]:
        """Events as they come (wake-ups skipped); stops once none arrives for `timeout_s`."""
        while True:
            try:
                event = self._events.get(timeout=timeout_s)
            except queue.Empty:
                return
            if event is not None:
                yield event

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
        # unbuffered: on a full disk a log line is lost, never the events after it (the role's
        # `failure` naming the disk) nor its exit
        with open(task.log_path, "ab", buffering=0) as log:
            for line in task.process.stdout_lines():
                event = parse_event_line(line)
                if event is None:
                    with contextlib.suppress(OSError):
                        log.write(f"{line}\n".encode("utf-8", "replace"))
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


#: How to get TensorFlow where a role lacks it (pyproject.toml [project.optional-dependencies])
TF_EXTRAS = "pip install 'transient-orchestrator[cpu]', or [gpu] on a CUDA machine"


def _cause_in_log(log_path: Path) -> str:
    """": " and the last line of a role's log (a traceback's last line is its exception), with
    what to do when it is TensorFlow missing; "" when the log is empty or unreadable."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1][:300]
    if "No module named 'tensorflow'" in last:
        last += f" (TensorFlow is not installed for that role's Python: {TF_EXTRAS})"
    return f": {last}"


def _port_accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=PORT_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False
