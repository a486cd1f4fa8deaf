"""The provisioning contract: records, errors, the launch contract and the `Provider` interface.

Every backend (`local` today; `ssh`, `gce`, `sim` later) implements exactly this module's
interface and never widens it. The orchestrator and the deployer import only from here.

Shape (after SkyPilot's provision API and submitit's executors):

    provider.acquire(ClusterRequest) -> Cluster        hosts for roles, one host per HostSpec
    provider.runner(host) -> HostRunner                run a command, copy a file, liveness, stop
    provider.poll(cluster) -> {host_id: HostState}     watch for revocation
    provider.replace(cluster, lost) -> Cluster         new hosts in the lost hosts' slots
    provider.release(cluster)                          idempotent
    provider.revoke(host, notice_s)                    optional: revoke on demand (local, sim)

Preemption notice channel: before a revocation with notice, the backend writes the file
`<host workdir>/PREEMPTION_NOTICE` (JSON `{"host_id", "deadline"}`, deadline in unix seconds).
Every process a runner starts gets its absolute path in the environment variable
`TRANSIENT_PREEMPTION_NOTICE`, so the trainer can poll it without importing this package.
A GCE backend mirrors this with an on-VM watcher of the metadata server's `preempted` key.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

HostId = str

#: Grace between SIGTERM and SIGKILL when a runner stops its processes.
STOP_GRACE_S = 5.0
#: File name of the preemption notice inside a host's work dir (see module docstring).
PREEMPTION_NOTICE_FILE = "PREEMPTION_NOTICE"
#: Environment variable holding the notice file's absolute path for every started process.
PREEMPTION_NOTICE_ENV = "TRANSIENT_PREEMPTION_NOTICE"


class Role(enum.StrEnum):
    """A trainer role; one host runs one role instance."""

    PS = "ps"
    WORKER = "worker"
    CHIEF = "chief"
    EVALUATOR = "evaluator"


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


class HostLostError(ProvisionError):
    """The host was revoked or released; nothing more can run on it."""

    def __init__(self, host_id: HostId, message: str = "") -> None:
        super().__init__(message or f"host {host_id} is gone (revoked or released)")
        self.host_id = host_id


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
    """Hosts wanted for one run. `workdir` is the run's directory on the orchestrator machine."""

    run_id: str
    hosts: list[HostSpec]
    workdir: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "workdir", Path(self.workdir))
        if not self.hosts:
            raise BadRequestError("cluster request: hosts: must name at least one host (got 0)")
        names = [h.name for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise BadRequestError(f"cluster request: hosts: duplicate names {duplicates}")


@dataclass(frozen=True)
class Host:
    """One acquired host.

    `address` is the hostname/IP other roles use for gRPC; `port` is the port the trainer role
    on this host must listen on; `workdir` is the host-side directory for this host's files.
    `state` is the state when this record was made; `Provider.poll` gives the current one.
    """

    id: HostId
    spec: HostSpec
    address: str
    port: int
    workdir: Path
    state: HostState = HostState.RUNNING

    @property
    def role(self) -> Role:
        return self.spec.role

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
    """Runs commands on one host. Every provider's hosts give one; the deployer needs no more."""

    @abc.abstractmethod
    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
    ) -> RemoteProcess:
        """Start `argv` on the host; stdout is piped to the caller, stderr appended to `log_path`.

        `env` is added to the host's default environment; `cwd` None = the host's work dir;
        `log_path` None discards stderr. Raises HostLostError if the host is gone."""

    @abc.abstractmethod
    def copy(self, local: Path, remote: Path) -> None:
        """Copy a file or directory from the orchestrator machine onto the host.

        A relative `remote` is relative to the host's work dir. Raises HostLostError."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the host can run commands (not revoked, not released)."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process this runner started: SIGTERM, `grace_s`, then SIGKILL; reap.

        Idempotent, and safe on a revoked or released host."""


class ResourceJournal(Protocol):
    """Where a backend records every resource before (or as) it exists, so a crashed run can be
    cleaned up later. Implemented by `provisioning.journal.Journal`."""

    def record_process_group(
        self, *, host_id: HostId, pid: int, pgid: int, argv: Sequence[str]
    ) -> None: ...

    def record_process_group_released(self, *, host_id: HostId, pgid: int) -> None: ...


class Provider(abc.ABC):
    """Acquires hosts for roles, watches them, replaces lost ones and releases them."""

    name: str
    #: False for a stand-in whose hosts cost nothing (local processes): a run's price is then
    #: what the planned cluster would cost, not money spent.
    billed: bool = True

    @classmethod
    def plan_note(cls, hosts: Sequence[HostSpec]) -> str | None:
        """One plain sentence on what of `hosts` this backend does not provide as asked (GPU
        types, zones, machine types), said once by the dry run and the run; None: nothing."""
        return None

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

    @abc.abstractmethod
    def replace(self, cluster: Cluster, lost: Sequence[HostId]) -> Cluster:
        """A new cluster where each lost host is swapped for a fresh one (new id, the same
        endpoint) in the same position, so it keeps the lost host's task index and the running
        TensorFlow job (whose cluster spec is fixed) reaches it. The lost hosts are released.

        Raises KeyError for an id not in `cluster`, CapacityError/BadRequestError as acquire."""

    @abc.abstractmethod
    def release(self, cluster: Cluster) -> None:
        """Stop everything on every host and give the hosts back.

        Idempotent: releasing what no longer exists is not an error."""

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        """Revoke `host` as the cloud would: with `notice_s` > 0 first write the preemption
        notice, then after `notice_s` kill its processes with no goodbye. Returns at once; poll()
        reports REVOKED once the kill has happened. Optional verb: cloud backends raise
        NotImplementedError (the default)."""
        raise NotImplementedError(f"provider {self.name!r} cannot revoke hosts on demand")
