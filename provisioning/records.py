"""The provisioning contract's data model: roles, host states, the errors recovery branches on,
and the records that pass between the orchestrator and a backend (what SkyPilot keeps in
`sky/provision/common.py`). Plain data, validated on construction; `provisioning.base`
re-exports every name and describes the contract as a whole."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer import layout

HostId = str


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


class ContactLostError(ProvisionError):
    """No machine of the cluster has answered for the backend's grace (`poll` raises it): the
    orchestrator's own network, most likely, not the machines. Not a loss to recover from by
    restarting elsewhere: the run stops resumable (its roles end on their leases)."""


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
