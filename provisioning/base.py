"""The provisioning contract: records, errors, the launch contract and the `Provider` interface.

Every backend (`local` today; `ssh`, `gce`, `sim` later) implements exactly this module's
interface and never widens it. The orchestrator and the deployer import only from here.

Shape (after SkyPilot's provision API and submitit's executors):

    provider.acquire(ClusterRequest) -> Cluster        hosts for roles, one host per HostSpec
    provider.runner(host) -> HostRunner                run a command, copy a file, liveness, stop
    provider.poll(cluster) -> {host_id: HostState}     watch for revocation
    provider.replace(cluster, lost) -> Cluster         new hosts in the lost hosts' slots
    provider.release(cluster)                          idempotent
    provider.revoke(host, notice_s)                    optional (`can_revoke`): local, ssh, sim
    provider.clean_up(entries) -> [str]                stop what a crashed run's journal lists
    provider.checkpoint_store(run_id, folder)          where checkpoints are kept durable
    Provider.preview(hosts, config) -> PlanPreview | None   the dry run's table of what it creates
    Provider.check_credentials(config)                 at run start: (field, problem) | None
    Provider.fetch_dataset(url, cache_root) -> Path    a `job.data_dir` URL (`dataset_schemes`)

    runner.setup()                                     optional: make `trainer_command` work
    runner.trainer_command() -> argv                   how `python -m trainer` starts there
    runner.start(argv, env, cwd, log_path)             sets the notice variable, streams logs
    runner.copy(local, remote) / write_text(...)       onto the host, atomically
    runner.fetch(remote, local) -> bool                host files back (TensorBoard, logs)
    runner.alive() / runner.stop_all(grace_s)

Nothing a role needs is read from the orchestrator's disk: the spec and the control file reach
the host through `copy`/`write_text`, every path handed to a role is a host path (under
`Host.workdir`), and files come back through `fetch`. `docs/architecture.md` ("Writing a
backend") lists what a new backend implements.

Colocation: a `HostSpec` with `colocate_with` names an earlier host spec whose *machine* it
shares (the chief and evaluator on the first PS's machine); it gets its own `Host` (id, port,
runner) on the same machine (`Host.machine`, same address and work dir). A machine is revoked,
replaced and released as a whole: every host on it reports the same state.

Preemption notice channel: before a revocation with notice, the backend writes the file
`<machine workdir>/PREEMPTION_NOTICE` (JSON `{"host_id", "deadline"}`, deadline in unix seconds).
`HostRunner.start` gives every process its absolute host path in the environment variable
`TRANSIENT_PREEMPTION_NOTICE` (by contract: backends implement `_launch`, not `start`), so the
trainer can poll it without importing this package. A GCE backend mirrors this with an on-VM
watcher of the metadata server's `preempted` key.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from provisioning.catalog import Market
from trainer import layout

HostId = str

#: Grace between SIGTERM and SIGKILL when a runner stops its processes.
STOP_GRACE_S = 5.0
#: File name of the preemption notice inside a machine's work dir (see module docstring).
PREEMPTION_NOTICE_FILE = layout.NOTICE_FILE
#: Environment variable holding the notice file's absolute path for every started process.
PREEMPTION_NOTICE_ENV = layout.NOTICE_ENV
#: The config field a dataset location comes from (`Provider.fetch_dataset` errors name it).
DATA_DIR_FIELD = "job.data_dir"


class Role(enum.StrEnum):
    """A trainer role; one host runs one role instance."""

    PS = layout.ROLE_PS
    WORKER = layout.ROLE_WORKER
    CHIEF = layout.ROLE_CHIEF
    EVALUATOR = layout.ROLE_EVALUATOR


class HostState(enum.StrEnum):
    """Lifecycle of a host as a provider reports it. Backends map raw states onto this once."""

    PENDING = "pending"
    RUNNING = "running"
    REVOKED = "revoked"  # preempted / gone without our asking
    TERMINATED = "terminated"  # released by us
    FAILED = "failed"  # could not be brought up

    def is_terminal(self) -> bool:
        """True when the host will never run anything again."""
        return self in (HostState.REVOKED, HostState.TERMINATED, HostState.FAILED)


# --- errors: recovery branches on the class, so keep them distinct ---------------------------


class ProvisionError(Exception):
    """Base class of every provisioning failure."""


class CapacityError(ProvisionError):
    """No capacity for this request in this zone; another zone may succeed."""


class BadRequestError(ProvisionError):
    """The request can never succeed as written; stop and tell the user (the message says why)."""


class BadFieldError(BadRequestError):
    """A bad request whose cause is one config field: `field` as the user types it (e.g.
    `job.data_dir`), `problem` what is wrong; the orchestrator reports it as that field's
    config error."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


class HostLostError(ProvisionError):
    """The host was revoked or released; nothing more can run on it."""

    def __init__(self, host_id: HostId, message: str = "") -> None:
        super().__init__(message or f"host {host_id} is gone (revoked or released)")
        self.host_id = host_id


# --- configuration ----------------------------------------------------------------------------


@dataclass
class ProviderConfig:
    """Options every backend takes (the Hydra `provider` group). Each backend subclasses it
    next to its code (`provisioning/local.py: LocalProviderConfig`) and registers the subclass
    with `registry.register_provider`; the registry stores it in Hydra's ConfigStore as
    `<name>_schema`, which `conf/provider/<name>.yaml` names first in its defaults."""

    name: str = "local"  # provider registry name
    ready_timeout_s: float = 120.0  # how long a role may take to start serving

    def check(self) -> list[tuple[str, str]]:
        """Backend-specific semantic problems as (field as the user types it, what is wrong);
        validation reports the first as a config error before anything is provisioned."""
        return []

    def transient_lifetime_cap_s(self) -> float | None:
        """Seconds after which this backend's own transient VMs end whatever the market (GCE's
        max run duration); None: no such limit. The simulated band revokes them then."""
        return None

    def for_plan(self, predicted_run_s: float | None) -> ProviderConfig:
        """This config for a plan predicted to train in `predicted_run_s` seconds (None: no
        prediction), made once per run before the dry run and the provider read it: a backend
        may derive limits from the plan (gce: every VM's maxRunDuration). Default: self."""
        return self


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSpec:
    """What one host must be. `gpu`/`zone` None = no accelerator / let the backend choose."""

    name: str
    role: Role
    machine_type: str = "local"
    gpu: str | None = None
    zone: str | None = None
    transient: bool = False
    colocate_with: str | None = None  # name of an earlier host spec whose machine it shares

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            allowed = ", ".join(r.value for r in Role)
            raise BadRequestError(
                f"host {self.name!r}: role: unknown role {self.role!r} ({allowed})"
            ) from None


@dataclass(frozen=True)
class ClusterRequest:
    """Hosts wanted for one run. `workdir` is the run's directory on the orchestrator machine;
    `sweep_id` names the sweep the run belongs to (None for a single run): a backend may label
    its resources with it (GCE does), any other may ignore it."""

    run_id: str
    hosts: list[HostSpec]
    workdir: Path
    sweep_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        if not self.hosts:
            raise BadRequestError("cluster request: hosts: must name at least one host (got 0)")
        names = [h.name for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BadRequestError(f"cluster request: hosts: duplicate names {duplicates}")
        earlier: dict[str, HostSpec] = {}
        for spec in self.hosts:
            target = earlier.get(spec.colocate_with or "")
            if spec.colocate_with is not None and (target is None or target.colocate_with):
                raise BadRequestError(
                    f"host {spec.name!r}: colocate_with: {spec.colocate_with!r} is not an "
                    f"earlier host with a machine of its own")
            earlier[spec.name] = spec


@dataclass(frozen=True)
class Host:
    """One acquired host.

    `address` is the hostname/IP other roles use for gRPC; `port` is the port the trainer role
    on this host must listen on; `workdir` is the host-side directory for this host's files
    (a host path: on a remote host it does not exist on the orchestrator; roles start there).
    `machine` is the id of the machine it runs on: its own id, or for a colocated host the id
    of the host whose machine it shares (same address and work dir, its own port).
    `state` is the state when this record was made; `Provider.poll` gives the current one.
    """

    id: HostId
    spec: HostSpec
    address: str
    port: int
    workdir: Path
    state: HostState = HostState.RUNNING
    machine: HostId = ""

    def __post_init__(self) -> None:
        if not self.machine:
            object.__setattr__(self, "machine", self.id)

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def colocated(self) -> bool:
        """True when this host shares another host's machine."""
        return self.machine != self.id

    @property
    def endpoint(self) -> str:
        """`address:port`, as it goes into a TF cluster spec."""
        return f"{self.address}:{self.port}"

    def with_state(self, state: HostState) -> Host:
        return replace(self, state=state)


@dataclass(frozen=True)
class Cluster:
    """The hosts of one run. A role's task index is its host's position among that role's hosts;
    `Provider.replace` keeps positions, so a replacement takes over the lost host's index."""

    run_id: str
    hosts: list[Host] = field(default_factory=list)

    def hosts_for(self, role: Role | str) -> list[Host]:
        """Hosts running `role`, in task-index order."""
        return [h for h in self.hosts if h.role == role]

    def host(self, host_id: HostId) -> Host:
        """The host with this id; raises KeyError if it is not in this cluster."""
        for h in self.hosts:
            if h.id == host_id:
                return h
        raise KeyError(f"host {host_id!r} is not in cluster {self.run_id!r}")

    def index_of(self, host: Host) -> int:
        """Task index of `host` within its role; raises KeyError if it is not in this cluster."""
        for i, h in enumerate(self.hosts_for(host.role)):
            if h.id == host.id:
                return i
        raise KeyError(f"host {host.id!r} is not in cluster {self.run_id!r}")

    def endpoints(self, role: Role | str) -> list[str]:
        """`address:port` of each host of `role`, in task-index order."""
        return [h.endpoint for h in self.hosts_for(role)]

    def same_machine(self, host_ids: Sequence[HostId]) -> list[HostId]:
        """`host_ids` plus every host sharing a machine with one of them, in cluster order:
        what a machine's loss takes down, and what replacing it must replace."""
        machines = {self.host(i).machine for i in host_ids}
        return [h.id for h in self.hosts if h.machine in machines]


# --- the launch contract ----------------------------------------------------------------------


class RemoteProcess(abc.ABC):
    """A process started by a `HostRunner`: its stdout is piped back to the caller."""

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """Process id on its host (for local hosts also its process-group id)."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """Exit code, or None while it runs. Negative codes are signals (-9 = SIGKILL)."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> int:
        """Block until exit and return the exit code; None waits forever.

        Raises TimeoutError if it still runs after `timeout_s`."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its process group). No-op once it has exited."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop it now (SIGKILL to its process group). No-op once it has exited."""

    @abc.abstractmethod
    def readline(self) -> str:
        """Next stdout line including its newline; '' at end of output."""

    def stdout_lines(self) -> Iterator[str]:
        """Stdout lines without trailing newlines, until the process closes stdout."""
        while line := self.readline():
            yield line.rstrip("\r\n")


class HostRunner(abc.ABC):
    """Runs commands on one host and moves files to and from it. Every provider's hosts give
    one; the deployer needs no more. Host paths are POSIX paths on the host; a relative one is
    relative to `host.workdir`.

    Backends implement `_launch`, `copy`, `fetch`, `alive`, `stop_all` and `notice_path`, and
    may override `setup`, `trainer_command` and `trainer_env`; `start` and `write_text` are the
    contract's own and not overridden."""

    host: Host
    #: True when host paths are paths on the orchestrator's own machine (the local backend):
    #: then the chief may write checkpoints straight into the orchestrator's folder.
    shares_orchestrator_fs: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def notice_path(self) -> Path:
        """Absolute host path of the preemption-notice file of this host's machine."""

    def setup(self) -> None:
        """Make `trainer_command()` runnable on the host (environment, this project's code).

        Idempotent and cached: a second call (or run) on a ready host does nothing costly.
        Called once per host before its first role starts. Default: nothing to do."""
        return None

    @abc.abstractmethod
    def trainer_command(self) -> list[str]:
        """The argv prefix that runs `python -m trainer` on this host (the host's interpreter,
        not the orchestrator's), e.g. `["/opt/env/bin/python", "-m", "trainer"]`."""

    def trainer_env(self) -> dict[str, str]:
        """Environment the trainer needs on this host besides the contract's (e.g. PYTHONPATH
        of a checkout). Default: none."""
        return {}

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
    ) -> RemoteProcess:
        """Start `argv` on the host in its own process group; stdout is piped back to the
        caller, stderr appended to `log_path` (a path on the orchestrator: remote runners
        stream it back). The process finds the notice file in `TRANSIENT_PREEMPTION_NOTICE`.

        `env` is added to the host's default environment; `cwd` None = the host's work dir;
        `log_path` None discards stderr. Raises HostLostError if the host is gone."""
        full_env = {**(env or {}), PREEMPTION_NOTICE_ENV: str(self.notice_path)}
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        return self._launch(argv, full_env, cwd, log_path)

    @abc.abstractmethod
    def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        log_path: Path | None,
    ) -> RemoteProcess:
        """`start` without the contract's part: `env` already holds the notice variable."""

    @abc.abstractmethod
    def copy(self, local: Path, remote: Path) -> None:
        """Copy a file or directory from the orchestrator machine onto the host.

        A file is replaced atomically (written beside the target, then renamed), so a role
        polling it never reads half of it. Parent directories are created.
        A relative `remote` is relative to the host's work dir. Raises HostLostError."""

    def write_text(self, remote: Path, text: str) -> None:
        """Write `text` to the host file `remote`, atomically (through `copy`)."""
        fd, tmp = tempfile.mkstemp(prefix=".put-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            self.copy(Path(tmp), remote)
        finally:
            os.unlink(tmp)

    @abc.abstractmethod
    def fetch(self, remote: Path, local: Path) -> bool:
        """Copy a host file or directory (recursively, merging) to `local` on the orchestrator.

        Returns False when `remote` does not exist; raises HostLostError if the host is gone.
        Used at the end of a run and on failure (TensorBoard, role files)."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the host can run commands (not revoked, not released)."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process this runner started: SIGTERM, `grace_s`, then SIGKILL; reap.

        Idempotent, and safe on a revoked or released host."""


class ResourceJournal(Protocol):
    """Where a backend records every resource before (or as) it exists, so a crashed run can be
    cleaned up later by `Provider.clean_up`. Implemented by `provisioning.journal.Journal`.
    Every entry carries the backend's name and the host (id and address): a pid means nothing
    without the machine it lives on. `start_ticks` (the process's start time on its host, when
    the backend can read it) guards clean-up against pid reuse."""

    def record_process_group(
        self, *, backend: str, host_id: HostId, address: str, pid: int, pgid: int,
        argv: Sequence[str], start_ticks: int | None = None,
    ) -> None: ...

    def record_process_group_released(
        self, *, backend: str, host_id: HostId, address: str, pgid: int
    ) -> None: ...


class Provider(abc.ABC):
    """Acquires hosts for roles, watches them, replaces lost ones and releases them.

    Built by the registry as `factory(config, journal=...)` with the backend's typed config
    (a `ProviderConfig` subclass). `can_revoke` says whether `revoke` works: validation turns
    a revocation model on a backend that cannot revoke into a config error."""

    name: str
    can_revoke: ClassVar[bool] = False

    #: How the cloud behind this backend sells the transient VMs it creates (GCE: Spot); None
    #: when no cloud revokes its hosts (local processes, an SSH inventory): a prediction then
    #: revokes only what the `revocation` model injects. Validation requires the pricing
    #: catalog's `transient_market` to agree, so a dry run cannot predict another market.
    transient_market: ClassVar[Market | None] = None

    #: False for a stand-in whose hosts cost nothing (local processes): a run's price is then
    #: what the planned cluster would cost, not money spent.
    billed: bool = True

    #: True when a host whose spec names a GPU has one and its role must see it: the trainer
    #: spec lists those tasks (`gpu_tasks`), whose server fails at start when TensorFlow sees
    #: no GPU (gce, unless `provider.gpu_check=false`). False where GPUs are stood in for
    #: (local processes) or only labels (an SSH inventory).
    gpus_checked: bool = False

    @classmethod
    def plan_note(cls, hosts: Sequence[HostSpec]) -> str | None:
        """One plain sentence on what of `hosts` this backend does not provide as asked (GPU
        types, zones, machine types), said once by the dry run and the run; None: nothing."""
        return None

    @classmethod
    def preview(cls, hosts: Sequence[HostSpec], config: ProviderConfig) -> PlanPreview | None:
        """What this backend would create for the planned `hosts` with `config` (the run's
        provider section, `for_plan` applied), a table the dry run shows under the hosts, and
        what the cloud says of it before anything is created (`PlanPreview.notes`; gce: quotas
        against the plan, image, bucket, OS Login, read only where credentials are present).
        Creates nothing and never fails the dry run: a check it cannot make is a note.
        Default: None (nothing to add to the host table)."""
        return None

    @classmethod
    def check_credentials(cls, config: ProviderConfig) -> tuple[str, str] | None:
        """Whether this machine may use the cloud behind `config`, asked when a real run starts
        (never by a dry run), before any download: (field as the user types it, what is wrong
        and how to fix it), which stops the run as a config error; None: nothing missing.
        Default: None (no credentials to check)."""
        return None

    #: URL schemes of `job.data_dir` that `fetch_dataset` reads (gce: ``("gs",)``). The data
    #: step asks the run's backend first, then any backend claiming the scheme: the copy lands
    #: on the orchestrator's machine and reaches hosts through `HostRunner.copy` either way.
    dataset_schemes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def fetch_dataset(cls, url: str, cache_root: Path, download: bool = True) -> Path:
        """The folder on the orchestrator's machine holding the dataset at `url` (a
        `job.data_dir`), kept under `cache_root` (the data cache) by a backend that downloads it
        and brought up to date there; `download` False: only where it would be (the dry run),
        nothing transferred. Raises BadRequestError for a URL it cannot read (the message
        says why; a BadFieldError for `job.data_dir` when the URL itself is wrong),
        ProvisionError when the transfer fails. Default: a local path passes through
        (absolute); any `scheme://` URL is a BadFieldError."""
        scheme = url_scheme(url)
        if scheme is None:
            return Path(url).expanduser().resolve()
        name = getattr(cls, "name", cls.__name__)
        raise BadFieldError(DATA_DIR_FIELD, f"provider {name!r} reads no {scheme}:// URLs")

    @abc.abstractmethod
    def acquire(self, request: ClusterRequest) -> Cluster:
        """One RUNNING host per `request.hosts` entry, in the same order.

        Raises CapacityError (another zone may succeed), BadRequestError (never will).
        On error nothing acquired stays allocated."""

    @abc.abstractmethod
    def runner(self, host: Host) -> HostRunner:
        """The runner for `host`; the same object on every call for the same host."""

    @abc.abstractmethod
    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        """Current state of every host; hosts that are gone report REVOKED."""

    def state_lag_s(self) -> float:
        """How long poll() may still report RUNNING for a host the cloud has already taken
        after its processes were seen to die (a cached or eventually consistent listing). The
        supervisor waits this long for the provider's word before it calls an unexplained
        process exit a crash, so a preemption is never counted as one. Default 0: poll()
        knows as soon as any process exit can be seen (local: the state is set before the
        kill; ssh: a lost connection marks the machine before its roles' exits show)."""
        return 0.0

    @abc.abstractmethod
    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        """A new cluster where each lost host is swapped for a fresh one (new id) in the same
        position, so it keeps the lost host's task index. A lost machine is replaced whole:
        hosts colocated on it are replaced too (`Cluster.same_machine`). The lost hosts are
        released.

        `keep_endpoints` True: each replacement has the lost host's endpoint, so the running
        TensorFlow job (whose cluster spec is fixed) reaches it (a worker joining a live job).
        False: any endpoint will do (a restart rewrites the cluster spec anyway), which lets a
        backend use a spare machine at another address.

        Raises KeyError for an id not in `cluster`, CapacityError/BadRequestError as acquire."""

    @abc.abstractmethod
    def release(self, cluster: Cluster) -> None:
        """Stop everything on every host and give the hosts back.

        Idempotent: releasing what no longer exists is not an error."""

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        """Revoke `host` as the cloud would: with `notice_s` > 0 first write the preemption
        notice, then after `notice_s` kill its processes with no goodbye. Returns at once; poll()
        reports REVOKED once the kill has happened; a colocated host's whole machine goes.
        Optional verb: backends with `can_revoke` False raise NotImplementedError (the
        default)."""
        raise NotImplementedError(f"provider {self.name!r} cannot revoke hosts on demand")

    def checkpoint_store(self, run_id: str, folder: Path) -> CheckpointStore:
        """Where the checkpoints of run `run_id` are kept durable; `folder` is the orchestrator's
        `<run_dir>/checkpoints`. A backend with its own storage returns a store that mirrors
        there (gce: a bucket when `provider.storage` is set). Default: the folder alone."""
        return LocalFolderStore(folder)

    def clean_up(self, entries: Sequence[Any], grace_s: float = STOP_GRACE_S
                 ) -> list[CleanUpResult]:
        """Stop what these unreleased journal entries (`provisioning.journal.JournalEntry` of
        this backend) still run, after a crash: one result per entry, in order.

        Must never signal anything on a machine other than the entry's host, nor a process
        whose start time differs from the recorded one. `released` True = the resource is gone
        now (stopped here, or found gone), so the journal records its release. Default: nothing
        can be done from here; every entry is left over."""
        return [CleanUpResult(e, False, f"{e.kind} {e.resource_id} on host {e.host_id} "
                              f"({e.address or '?'}): backend {self.name!r} cannot clean up; "
                              f"release it by hand") for e in entries]


def url_scheme(location: str) -> str | None:
    """`gs` for ``gs://bucket/x``; None for a local path (which has no ``scheme://``)."""
    found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", location)
    return found.group(1) if found else None


@dataclass(frozen=True)
class PlanPreview:
    """A table `Provider.preview` adds to the dry run: a title, column names, one row per
    resource (each as long as `columns`), and `notes`, one line each, printed under it (gce:
    the pre-create checks, each starting "ok:", "problem:" or "not checked:")."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CleanUpResult:
    """What `Provider.clean_up` did about one journal entry. `note` None = nothing to say (it
    was already gone)."""

    entry: Any  # provisioning.journal.JournalEntry
    released: bool
    note: str | None = None


# --- the checkpoint store ---------------------------------------------------------------------


class CheckpointStore(abc.ABC):
    """Where a run's checkpoints live, so that losing any one host loses none of them.

    The chief writes checkpoints (and `DONE`) where the spec's `checkpoint_dir` says; on a
    restart, possibly on other hosts, the new chief resumes from the newest one it finds there.
    A store decides that location for a given chief host and keeps it durable; the provider
    hands the run its store (`Provider.checkpoint_store`). A checkpoint that was still only on a
    host when that host was lost is lost with it; the run resumes from the last one synced."""

    @abc.abstractmethod
    def location(self, chief: HostRunner) -> str:
        """The spec's `checkpoint_dir` for a cluster whose chief runs on `chief`'s host."""

    @abc.abstractmethod
    def before_start(self, chief: HostRunner) -> None:
        """Make the latest checkpoint readable at `location(chief)` before the chief starts."""

    @abc.abstractmethod
    def sync(self, chief: HostRunner) -> bool:
        """Make what the chief wrote durable; False if nothing could be brought back."""

    def finish(self, run_dir: Path) -> None:
        """Once the run has ended (summary written): archive what the store keeps durable
        elsewhere (the bucket store uploads the run directory). Default: nothing."""
        return None


class LocalFolderStore(CheckpointStore):
    """A folder on the orchestrator's machine (`<run_dir>/checkpoints`), the default store.

    A chief whose host shares the orchestrator's filesystem (`HostRunner.shares_orchestrator_fs`,
    the local backend) writes straight into it. Any other chief writes into `checkpoints/` in
    its host's work dir; the fleet calls `sync` after each `checkpoint` event, which fetches the
    folder back through the runner, and `before_start` copies the store onto a new chief's host
    before it starts, so it resumes from the latest checkpoint whichever host it is on."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def location(self, chief: HostRunner) -> str:
        if chief.shares_orchestrator_fs:
            return str(self.folder.resolve())
        return str(chief.host.workdir / layout.CHECKPOINT_DIR)

    def before_start(self, chief: HostRunner) -> None:
        if not chief.shares_orchestrator_fs and any(self.folder.iterdir()):
            chief.copy(self.folder, Path(layout.CHECKPOINT_DIR))

    def sync(self, chief: HostRunner) -> bool:
        if chief.shares_orchestrator_fs:
            return True
        with contextlib.suppress(HostLostError, OSError):
            return chief.fetch(Path(layout.CHECKPOINT_DIR), self.folder)
        return False
