"""The provisioning contract: records, errors, the launch contract and the `Provider` interface.

Every backend (`local`, `ssh`, `gce`, `sim`) implements exactly this interface and never widens
it. The orchestrator and the deployer import only from here. Split as SkyPilot's `sky/provision`
is (data model, verbs, instance code): the records and errors live in `records.py`, the launch
contract (runners, processes, journal, checkpoint stores) in `launch.py`, and this module holds
the verbs (`Provider`) and their configuration (`ProviderConfig`), re-exporting both others, so
`from provisioning.base import ...` names the whole contract.

Shape (after SkyPilot's provision API and submitit's executors):

    provider.acquire(ClusterRequest) -> Cluster        hosts for roles, one host per HostSpec
    provider.runner(host) -> HostRunner                run a command, copy a file, liveness, stop
    provider.poll(cluster) -> {host_id: HostState}     watch for revocation (ContactLostError:
                                                       no machine answered for the grace)
    provider.replace(cluster, lost) -> Cluster         new hosts in the lost hosts' slots
    provider.release(cluster)                          idempotent
    provider.revoke(host, notice_s)                    optional (`can_revoke`): local, ssh, sim
    provider.clean_up(entries) -> [str]                stop what a crashed run's journal lists
    provider.checkpoint_store(run_id, folder)          where checkpoints are kept durable
    provider.dataset_store() -> DatasetStore | None    optional: where hosts download a dataset
                                                       staged once per run (gce: the bucket)
    Provider.preview(hosts, config) -> PlanPreview | None   the dry run's table of what it creates
    Provider.check_credentials(config)                 at run start: (field, problem) | None
    Provider.fetch_dataset(url, cache_root) -> Path    a `job.data_dir` URL (`dataset_schemes`)

    runner.setup()                                     optional: make `trainer_command` work
    runner.dataset_cache() / bytes_sent()              optional: a host folder kept across runs
                                                       (datasets), bytes sent over the link
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
import contextvars
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from provisioning.catalog import Market, PricingConfig
from provisioning.launch import (
    PREEMPTION_NOTICE_ENV,
    PREEMPTION_NOTICE_FILE,
    STOP_GRACE_S,
    CheckpointStore,
    DatasetStore,
    HostRunner,
    LocalFolderStore,
    RemoteProcess,
    ResourceJournal,
    StagedDataset,
)
from provisioning.records import (
    BadFieldError,
    BadRequestError,
    CapacityError,
    CleanUpResult,
    Cluster,
    ClusterRequest,
    ContactLostError,
    Host,
    HostId,
    HostLostError,
    HostSpec,
    HostState,
    PlanPreview,
    ProvisionError,
    Role,
)

__all__ = [
    "DATA_DIR_FIELD", "PREEMPTION_NOTICE_ENV", "PREEMPTION_NOTICE_FILE", "STOP_GRACE_S",
    "BadFieldError", "BadRequestError", "CapacityError", "CheckpointStore", "CleanUpResult",
    "Cluster", "ClusterRequest", "ContactLostError", "DatasetStore", "Host", "HostId", "HostLostError", "HostRunner", "HostSpec",
    "HostState", "LocalFolderStore", "PlanPreview", "Provider", "ProviderConfig",
    "ProvisionError", "RemoteProcess", "ResourceJournal", "Role", "StagedDataset",
    "machine_file_unchecked", "url_scheme", "without_machine_files",
]

#: The config field a dataset location comes from (`Provider.fetch_dataset` errors name it).
DATA_DIR_FIELD = "job.data_dir"
#: `provider.data_source`: how remote machines that read the dataset get it (docs/datasets.md).
#: auto: a registry dataset is fetched by the host from its source URL; otherwise (a folder of
#: the user's, a source the host cannot reach) downloaded by the host from the provider's
#: `dataset_store` (staged there once per run), pushed from here only without one;
#: origin: a registry dataset never comes from here; push: always pushed.
DATA_SOURCES = ("auto", "origin", "push")


#: Set by `transient-validate` (`orchestrator.validate`, a user's CI): files that only the
#: machine running the experiment holds (an SSH key, its known_hosts) are not required; the
#: fields whose check was skipped are collected here (`machine_file_unchecked`).
_UNCHECKED_FILES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "unchecked_machine_files", default=None)


@contextlib.contextmanager
def without_machine_files() -> Iterator[list[str]]:
    """Validate without the files of the machine that will run the experiment (a CI runner
    holds no SSH key); yields the list of the fields whose file was not checked."""
    skipped: list[str] = []
    token = _UNCHECKED_FILES.set(skipped)
    try:
        yield skipped
    finally:
        _UNCHECKED_FILES.reset(token)


def machine_file_unchecked(field: str) -> bool:
    """True (and `field` noted) when `field`'s file is not to be checked here
    (`without_machine_files`); a config's `check` then skips it."""
    skipped = _UNCHECKED_FILES.get()
    if skipped is None:
        return False
    skipped.append(field)
    return True


# --- configuration ----------------------------------------------------------------------------


@dataclass
class ProviderConfig:
    """Options every backend takes (the Hydra `provider` group). Each backend subclasses it
    next to its code (`provisioning/local.py: LocalProviderConfig`) and registers the subclass
    with `registry.register_provider`; the registry stores it in Hydra's ConfigStore as
    `<name>_schema`, which `conf/provider/<name>.yaml` names first in its defaults."""

    name: str = "local"  # provider registry name
    ready_timeout_s: float = 120.0  # how long a role may take to start serving
    data_source: str = "auto"  # remote hosts' dataset: auto, origin or push (DATA_SOURCES)

    def check(self) -> list[tuple[str, str]]:
        """Backend-specific semantic problems as (field as the user types it, what is wrong);
        validation reports the first as a config error before anything is provisioned."""
        return []

    def check_plan(self, hosts: Sequence[HostSpec], catalog: PricingConfig) -> list[tuple[str, str]]:
        """Like `check`, for what needs the plan's hosts or the catalog (zones that exist, an
        inventory that holds the plan): validation calls it once the cluster is valid."""
        return []

    def transient_lifetime_cap_s(self) -> float | None:
        """Seconds after which this backend's own transient VMs end whatever the market (GCE's
        max run duration); None: no such limit. The simulated band revokes them then."""
        return None

    def contact_grace_s(self) -> float:
        """Longest time this backend waits for a machine it cannot reach before calling it
        lost (0: it never loses contact, its hosts are here). Roles' leases on the hosts
        outlive it, so that a drop of the orchestrator's network does not end them."""
        return 0.0

    def for_plan(self, predicted_run_s: float | None) -> ProviderConfig:
        """This config for a plan predicted to train in `predicted_run_s` seconds (None: no
        prediction), made once per run before the dry run and the provider read it: a backend
        may derive limits from the plan (gce: every VM's maxRunDuration). Default: self."""
        return self


class Provider(abc.ABC):
    """Acquires hosts for roles, watches them, replaces lost ones and releases them.

    Built by the registry as `factory(config, journal=...)` with the backend's typed config
    (a `ProviderConfig` subclass). `can_revoke` says whether `revoke` works: validation turns
    a revocation model on a backend that cannot revoke into a config error."""

    name: str
    can_revoke: ClassVar[bool] = False
    #: True for a backend that models the cloud instead of renting it (`sim`): the entry point
    #: plays the plan in the simulation, which provisions nothing and reads no data.
    simulated: ClassVar[bool] = False
    #: True when the hosts are processes on this machine (`local`): no preflight step before
    #: the run, and a prediction is calibrated on this machine.
    hosts_here: ClassVar[bool] = False

    @classmethod
    def transient_market(cls, pricing: PricingConfig) -> Market | None:
        """How the cloud behind this backend sells the transient VMs it creates (GCE: Spot);
        None when no cloud revokes its hosts (local processes, an SSH inventory): a prediction
        then revokes only what the `revocation` model injects. Validation requires `pricing`'s
        `transient_market` to agree, so a dry run cannot predict another market."""
        return None

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

    def dataset_store(self) -> DatasetStore | None:
        """Where the deployer stages a dataset once per run for the hosts to download
        themselves (`data.DataStager`: a folder of the user's, or a registry dataset whose
        source the hosts cannot reach), instead of pushing it to each host over the
        orchestrator's link. Default: None (no such storage: hosts get a push).
        gce: the bucket of `provider.storage` when it is set."""
        return None

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
