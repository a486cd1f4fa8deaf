"""`provider=gce`: one Compute Engine VM per machine of the plan, Spot for transient hosts.

- acquire: first the checks that need no VM, in one pass with one line per problem
  (`preflight.py`: quotas, image family, bucket, OS Login, whose key is imported then; the login
  key is `keys.py`'s). VMs are journalled *before* they are inserted, then created in parallel
  (one idempotency `request_id` per attempt), each operation waited on in a bounded loop. A
  failed insert is classified once (`errors.py`): a stock-out blocks the zone, a quota error its
  region (or every region for `*_ALL_REGIONS`), and the VMs that failed move to their next zone
  (`HostSpec.zone` first, then `provider.zones`) within ONE region: a VM that fits nowhere there
  moves the whole cluster to the next region (`provider.cross_region` lifts it); a bad request
  stops at once. An insert that raised a transient error may have created its VM: that name is
  deleted when the acquire ends. A Spot VM preempted while booting is re-created alone. When
  acquire fails, every VM it created is deleted before the error propagates. Where the VMs
  landed goes to the log and `<run dir>/placement.json`.
- readiness: ONE label-filtered aggregatedList per tick for all VMs until RUNNING, then host
  keys from the guest attributes (pinned into `<run dir>/known_hosts`; first-use pinning when a
  VM publishes none) and, on GPU VMs, what nvidia-smi saw (no GPU: one line, the acquire
  fails). The first SSH login waits for the booting guest (`connection.py`, boot_timeout_s).
- lease: every VM carries a lease in its metadata, renewed from a background thread; a watcher
  on the VM deletes it once the lease has passed (the orchestrator is gone), and
  `max_run_duration_s` bounds every VM's life on GCE's side.
- poll: ONE aggregatedList per `poll_interval_s` for the whole cluster; raw GCE states are mapped
  onto HostState in `STATE_MAP`, a VM we did not delete that is stopping, stopped or gone is
  REVOKED (preempted: its zone's `compute.instances.preempted` operation is looked up once). A
  RUNNING VM whose SSH heartbeat stopped is only *unreachable* (our network): reconnected in the
  background (`gce/ssh.py`), REVOKED after `unreachable_grace_s`.
- replace: the lost VM is deleted and a new one created the same way in the same zone with the
  same internal IP, so the replacement keeps the TensorFlow endpoint of its slot.
- release: deletes every VM of the run, in parallel; idempotent.

- runners: the SSH backend's, over one connection per VM opened on first use (`gce/ssh.py`).
- clean_up (after a crash, from the journal) and `python -m orchestrator.gc` (`orphans.py`) delete
  leftovers; `checkpoint_store` mirrors checkpoints to `provider.storage` (`storage.py`).
- class-level hooks of the contract, read without building a provider: `preview` (the dry
  run's VMs per zone, `preview.py`), `check_credentials` (`api.resolve_credentials`, at run
  start) and `fetch_dataset` for `job.data_dir=gs://...` (`storage.cached_copy`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from provisioning.base import (
    DATA_DIR_FIELD,
    STOP_GRACE_S,
    BadFieldError,
    BadRequestError,
    CapacityError,
    CheckpointStore,
    CleanUpResult,
    Cluster,
    ClusterRequest,
    Host,
    HostId,
    HostLostError,
    HostRunner,
    HostSpec,
    HostState,
    PlanPreview,
    Provider,
    ProviderConfig,
    ProvisionError,
    ResourceJournal,
    url_scheme,
)
from provisioning.catalog import Market
from provisioning.gce.body import (
    GPU_NAMESPACE,
    LEASE_KEY,
    VmRequest,
    has_gpu,
    instance_body,
    label_value,
    remote_workdir,
    vm_name,
)
from provisioning.gce.body import run_labels as make_run_labels
from provisioning.gce.config import TOOL_LABEL, GceConfig
from provisioning.gce.errors import (
    QuotaError,
    TransientApiError,
    ZoneCapacityError,
    region_of,
)
from provisioning.gce.ssh import VmSsh
from provisioning.journal import ResourceKind, read_process_start_ticks

#: Raw GCE instance status -> HostState, for VMs we have not asked to delete. Anything stopping,
#: stopped or gone without our asking is a revocation (a Spot preemption, a maintenance event).
STATE_MAP: dict[str, HostState] = {
    "PROVISIONING": HostState.PENDING, "STAGING": HostState.PENDING,
    "PENDING": HostState.PENDING, "REPAIRING": HostState.PENDING,
    "RUNNING": HostState.RUNNING,
    "PENDING_STOP": HostState.REVOKED, "STOPPING": HostState.REVOKED,
    "SUSPENDING": HostState.REVOKED, "SUSPENDED": HostState.REVOKED,
    "TERMINATED": HostState.REVOKED, "STOPPED": HostState.REVOKED,
    "DEPROVISIONING": HostState.REVOKED,
}
KNOWN_HOSTS_FILE = "known_hosts"
#: One poll's list call: a cut link must not hold the supervisor's loop for minutes.
POLL_TIMEOUT_S = 20.0
PLACEMENT_FILE = "placement.json"  # where a run's VMs landed (zone per VM), in its run dir
log = logging.getLogger(__name__)
PIN_GUEST_ATTRIBUTES = "guest-attributes"
PIN_FIRST_USE = "first-use"


@dataclass
class _Vm:
    """One VM of a run, from before its insert to after its delete."""

    request: VmRequest
    run_id: str
    slot: str  # plan name of the VM's first host (ps-0, worker-3), stable across replacements
    specs: list[HostSpec]
    internal_ip: str = ""
    external_ip: str = ""
    host_keys: list[tuple[str, str]] | None = None
    created: bool = False  # its insert may have succeeded: delete it on release
    deleted: bool = False  # we deleted it (or it never came to exist)
    revoked_reason: str | None = None
    ssh: VmSsh | None = None  # the SSH side, once RUNNING (connects on first runner())
    zone_hint: str | None = None  # tried before the hosts' plan zone (a replacement's slot)
    hosts: list[Host] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def zone(self) -> str:
        return self.request.zone


def _address_held(error: BaseException) -> bool:
    """The requested internal IP is still held by a VM that is going away."""
    text = str(error)
    return "already being used" in text or "ipInUseByAnotherResource" in text \
        or "IP_IN_USE" in text


def owner_labels() -> dict[str, str]:
    """Who created a VM: this machine and process, so `orchestrator.gc` can tell a live run."""
    pid = os.getpid()
    return {"owner-host": label_value(socket.gethostname()), "owner-pid": str(pid),
            "owner-start": str(read_process_start_ticks(pid) or 0)}


class GceProvider(Provider):
    """Compute Engine VMs for trainer roles. `api`: a `ComputeApi` (built from `config` when
    None; tests pass one bound to a fake). Runners come from the SSH backend (`gce/ssh.py`)."""

    name = "gce"
    transient_market = Market.spot  # instance_body: provisioningModel SPOT for transient hosts

    def __init__(self, config: GceConfig | None = None, journal: ResourceJournal | None = None,
                 api: Any = None, sweep_id: str | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config or GceConfig()
        self.gpus_checked = self.config.gpu_check  # a GPU VM's roles must see its GPU
        if api is None:
            from provisioning.gce.api import ComputeApi

            api = ComputeApi(self.config)
        self.api = api
        self._journal = journal
        self._sweep_id = sweep_id
        self._clock, self._sleep = clock, sleep
        self._vms: dict[str, _Vm] = {}  # by VM name
        self._host_vm: dict[HostId, str] = {}
        self._workdirs: dict[str, Path] = {}  # run_id -> request.workdir
        self._sweep_ids: dict[str, str] = {}  # run_id -> request.sweep_id
        self._poll_cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self._serial = itertools.count()
        self._lock = threading.RLock()
        self._owner = owner_labels()
        self.revocations: dict[HostId, str] = {}  # host -> "preempted" | "gone" (for reports)
        self._login_key: str | None = None  # public half of the login key (`_public_key`)
        self.os_login = False  # the project turns OS Login on (read by the preflight)
        self._login_user: str | None = None  # OS Login's POSIX user; None = provider.ssh_user
        self._lease_thread: threading.Thread | None = None
        self._lease_stop = threading.Event()
        self.lease_renewals = 0  # renewal rounds done (tests, benchmarks)
        self._api_down = False  # the last poll could not reach the Compute API

    # --- class-level hooks (read without building a provider) -----------------------------

    dataset_schemes = ("gs",)  # job.data_dir=gs://BUCKET/PREFIX (storage.cached_copy)

    @classmethod
    def preview(cls, hosts: Sequence[HostSpec], config: ProviderConfig) -> PlanPreview:
        """The VMs the plan creates, per zone (colocated roles share a VM; `preview.py`), and
        under them every VM's maxRunDuration and, where credentials are present, the
        pre-create checks `acquire` makes (`preflight.py`), read and reported, nothing
        created: quotas against the plan, image family, bucket, OS Login mode."""
        from provisioning.gce.preview import preview_vms

        assert isinstance(config, GceConfig)
        vms = preview_vms(hosts, config.zones)
        rows = [(zone, vm.slot, vm.machine_type, vm.gpu, "Spot" if vm.spot else "on-demand",
                 ", ".join(vm.hosts))
                for zone in dict.fromkeys(vm.zone for vm in vms) for vm in vms if vm.zone == zone]
        limit = config.run_duration_s()
        life = f"{limit} s ({limit / 3600:.1f} h)" if limit else "none"
        notes = [f"maxRunDuration of every VM: {life} ({config.run_duration_basis()})"]
        notes += cls._precreate_report(hosts, config)
        return PlanPreview(f"GCE VMs to create ({len(vms)})",
                           ("zone", "VM", "machine", "GPU", "model", "roles on it"), rows,
                           tuple(notes))

    @classmethod
    def _precreate_report(cls, hosts: Sequence[HostSpec], config: GceConfig) -> list[str]:
        """The dry run's pre-create checks, one line each ("ok:", "problem:", "not
        checked:"); the OS Login key is not imported (that changes the user's profile)."""
        from provisioning.gce.preflight import check

        if not config.preflight_checks:
            return ["not checked: pre-create checks (provider.preflight_checks=false)"]
        problem = cls.check_credentials(config)
        if problem is not None:
            return [f"not checked: quotas, image, bucket, OS Login (no credentials: "
                    f"{problem[0]}: {problem[1]})"]
        try:
            provider = cls(config)
            vms = provider._plan_vms("dry-run", hosts)
            result = check(provider.api, config, provider._first_zone_requests(vms))
        except ProvisionError as error:
            return [f"problem: {' '.join(str(error).split())}"]
        lines = [f"ok: {line}" for line in result.passed]
        lines += [f"problem: {line}" for line in result.problems]
        if not result.os_login:
            lines.append(f"ok: OS Login off in project {provider.api.project}: VMs take the "
                         f"key from ssh-keys metadata, login as {config.ssh_user}")
        elif user := provider.api.os_login_user():
            lines.append(f"ok: OS Login on in project {provider.api.project}: the run imports "
                         f"the key for {user} and logs in as its POSIX user")
        else:
            lines.append(f"problem: provider.os_login_user: project {provider.api.project} "
                         "has OS Login on; set it to the e-mail of the account whose OS Login "
                         "profile gets the tool's key")
        return lines

    @classmethod
    def check_credentials(cls, config: ProviderConfig) -> tuple[str, str] | None:
        """Google credentials and a project for `config` (`api.resolve_credentials`)."""
        from provisioning.gce.api import GceAuthError, resolve_credentials

        try:
            resolve_credentials(config)  # type: ignore[arg-type]
        except GceAuthError as error:
            return error.field, error.problem
        return None

    @classmethod
    def fetch_dataset(cls, url: str, cache_root: Path, download: bool = True) -> Path:
        """A `gs://BUCKET/PREFIX` dataset: downloaded into `<cache_root>/gs/BUCKET/PREFIX`,
        only objects missing there or of another size (`storage.cached_copy`)."""
        if url_scheme(url) != "gs":
            return super().fetch_dataset(url, cache_root, download)
        from provisioning.gce.storage import GcsUrl, StorageError, cache_folder, cached_copy

        try:
            folder = cache_folder(GcsUrl.parse(url), cache_root)
        except ValueError:
            raise BadFieldError(DATA_DIR_FIELD, f"'{url}' names no bucket, "
                                "expected gs://BUCKET[/PREFIX]") from None
        if not download:
            return folder
        try:
            return cached_copy(url, cache_root)
        except StorageError as error:
            raise ProvisionError(str(error)) from None

    # --- acquire ---------------------------------------------------------------------------

    def acquire(self, request: ClusterRequest) -> Cluster:
        self._workdirs[request.run_id] = request.workdir
        if request.sweep_id:  # the request's sweep labels this run's VMs (replacements too)
            self._sweep_ids[request.run_id] = request.sweep_id
        vms = self._plan_vms(request.run_id, request.hosts)
        self._public_key()  # a key problem stops here, before any VM
        self._preflight(vms)
        try:
            self._create_cluster(vms)
            self._await_running(vms)
            self._pin_host_keys(request.run_id, vms)
        except BaseException:
            self._delete([vm for vm in vms if vm.created])
            raise
        finally:
            self._delete_ghosts(request.run_id)
        self._record_placement(request.run_id, request.workdir, vms)
        by_name = {h.spec.name: h for vm in vms for h in vm.hosts}
        return Cluster(run_id=request.run_id, hosts=[by_name[s.name] for s in request.hosts])

    def _preflight(self, vms: Sequence[_Vm]) -> None:
        """Quotas, image, bucket and OS Login, before any VM (`preflight.py`); PreflightError
        with one line per problem."""
        from provisioning.gce.preflight import PreflightError, check

        if not self.config.preflight_checks:
            return
        result = check(self.api, self.config, self._first_zone_requests(vms))
        self.os_login = result.os_login
        problems = list(result.problems)
        if self.os_login:
            problem = self._use_os_login()
            if problem is not None:
                problems.append(problem)
        if problems:
            raise PreflightError(problems)

    def _first_zone_requests(self, vms: Sequence[_Vm]) -> list[VmRequest]:
        """Each VM's request in the zone it is tried in first (what the quotas count)."""
        return [replace(vm.request, zone=self._zones_for(vm)[0]) for vm in vms]

    def _use_os_login(self) -> str | None:
        """The project ignores `ssh-keys` metadata (OS Login): import our key into the OS
        Login profile and log in as its POSIX user; a line saying why not, else None."""
        user = self.api.os_login_user()
        if not user:
            return (f"provider.os_login_user: project {self.api.project} has OS Login on "
                    "(enable-oslogin=TRUE), so VMs ignore the ssh-keys metadata; set it to the "
                    "e-mail of the account whose OS Login profile gets the tool's key")
        try:
            self._login_user = self.api.import_os_login_key(user, self._public_key())
        except ProvisionError as error:
            return (f"provider.os_login_user: project {self.api.project} has OS Login on and "
                    f"the key could not be imported for {user} ({error}); it needs the role "
                    "roles/compute.osAdminLogin (or osLogin) in the project")
        return None

    def _plan_vms(self, run_id: str, specs: Sequence[HostSpec]) -> list[_Vm]:
        """One `_Vm` per machine of the plan; colocated roles join their owner's VM."""
        groups: dict[str, list[HostSpec]] = {}
        for spec in specs:
            owner = spec.colocate_with
            if owner is None:
                groups[spec.name] = [spec]
            elif owner in groups:
                groups[owner].append(spec)
            else:
                raise BadRequestError(f"host {spec.name!r}: colocated with {owner!r}, which "
                                      "is not an earlier host of the request")
        return [_Vm(request=self._vm_request(run_id, slot, group), run_id=run_id, slot=slot,
                    specs=group) for slot, group in groups.items()]

    def _vm_request(self, run_id: str, slot: str, specs: list[HostSpec],
                    zone: str | None = None, network_ip: str | None = None) -> VmRequest:
        """A fresh VM request (new name, new host ids) for the hosts of one machine."""
        first = specs[0]
        host_ids = [f"{run_id}-{s.name}-{next(self._serial)}" for s in specs]
        labels = make_run_labels(run_id, self._sweep_ids.get(run_id, self._sweep_id), "_".join(s.role.value for s in specs),
                                 host_ids[0], self._owner)
        return VmRequest(name=vm_name(run_id, slot, next(self._serial)),
                         zone=zone or first.zone or "", machine_type=first.machine_type,
                         gpu=first.gpu, transient=first.transient, labels=labels,
                         host_ids=host_ids, network_ip=network_ip)

    def _zones_for(self, vm: _Vm, same_region: str | None = None) -> list[str]:
        zones = [z for z in dict.fromkeys([vm.zone_hint, vm.specs[0].zone, *self.config.zones])
                 if z]
        if same_region is not None:
            zones = [z for z in zones if region_of(z) == same_region]
        if not zones:
            raise BadRequestError(f"provider.zones: no zone for host {vm.slot!r} (set its zone "
                                  "in the cluster or list zones in provider.zones)")
        return zones

    def _keep_ghost(self, vm: _Vm) -> None:
        """An insert that raised a transient error may have created the VM anyway: keep its
        name (journalled already) so it is deleted with the run's other leftovers."""
        ghost = _Vm(request=vm.request, run_id=vm.run_id, slot=vm.slot, specs=[], created=True)
        with self._lock:
            self._vms[ghost.name] = ghost
        vm.created = False

    def _delete_ghosts(self, run_id: str) -> None:
        """Delete the names of inserts that may have succeeded unseen (404 = never created)."""
        with self._lock:
            ghosts = [vm for vm in self._vms.values()
                      if vm.run_id == run_id and not vm.specs and not vm.deleted]
        try:
            self._delete(ghosts)
        except ProvisionError as error:  # release tries again
            log.warning("gce: could not delete a VM whose insert failed: %s", error)

    def _create(self, vms: list[_Vm], same_region: str | None = None,
                avoid_zones: frozenset[str] = frozenset()) -> None:
        """Insert every VM, in parallel rounds; failed ones move to their next usable zone
        (`avoid_zones` are tried last)."""
        blocked_zones: set[str] = set()
        blocked_regions: set[str] = set()
        everywhere_blocked = False
        reasons: list[str] = []
        last_error: dict[str, ProvisionError] = {}
        candidates = {vm.slot: sorted(self._zones_for(vm, same_region),
                                      key=lambda z: z in avoid_zones) for vm in vms}
        pending = list(vms)
        while pending:
            round_vms = []
            for vm in pending:
                usable = [z for z in candidates[vm.slot] if not everywhere_blocked
                          and z not in blocked_zones and region_of(z) not in blocked_regions]
                if not usable:
                    last = last_error.get(vm.slot)
                    if isinstance(last, QuotaError):  # a quota raise fixes it, not a zone
                        raise last
                    raise CapacityError(f"no zone could create {vm.slot}: " + "; ".join(reasons))
                vm.request = replace(vm.request, zone=usable[0],
                                     name=vm_name(vm.run_id, vm.slot, next(self._serial)))
                round_vms.append(vm)
            failures = self._parallel(self._insert_one, round_vms)
            pending = []
            bad: ProvisionError | None = None
            for vm, error in zip(round_vms, failures, strict=True):
                if error is None:
                    continue
                if isinstance(error, QuotaError):
                    if error.region is None:
                        everywhere_blocked = True
                    else:
                        blocked_regions.add(error.region)
                elif isinstance(error, ZoneCapacityError | TransientApiError):
                    blocked_zones.add(vm.zone)
                    if vm.created:  # the insert may have succeeded: delete that name later
                        self._keep_ghost(vm)
                elif isinstance(error, ProvisionError):
                    bad = bad or error
                else:
                    raise error
                reasons.append(str(error))
                last_error[vm.slot] = error
                pending.append(vm)
            if bad is not None:
                raise bad

    def _create_cluster(self, vms: list[_Vm]) -> None:
        """Create a run's VMs in ONE region: the region of the first VM's (the PS's) zones
        first, then each other region of `provider.zones`; a VM that fits nowhere in a region
        moves the whole cluster to the next one (what was created there is deleted first), so
        the PS and its workers never talk across regions (inter-region latency and egress on
        every step). `provider.cross_region=true`: each VM falls back on its own."""
        if self.config.cross_region or not vms:
            self._create(vms)
            return
        regions = [region_of(z) for z in self._zones_for(vms[0])]
        regions += [region_of(z) for z in self.config.zones]
        reasons = []
        for region in dict.fromkeys(regions):
            if any(not self._zones_in(vm, region) for vm in vms):
                continue  # some VM has no zone there
            try:
                self._create(vms, same_region=region)
                return
            except CapacityError as error:
                if isinstance(error, QuotaError) and error.region is None:
                    raise  # a project-wide quota: no region helps
                self._delete([vm for vm in vms if vm.created])
                reasons.append(f"{region}: {error}")
        if not reasons:
            raise BadRequestError("provider.zones: no region has a zone for every VM of the "
                                  "cluster (list zones of one region, or set "
                                  "provider.cross_region=true)")
        raise CapacityError("no region could hold the whole cluster: " + "; ".join(reasons))

    def _zones_in(self, vm: _Vm, region: str) -> list[str]:
        zones = [vm.zone_hint, vm.specs[0].zone, *self.config.zones]
        return [z for z in dict.fromkeys(zones) if z and region_of(z) == region]

    def _record_placement(self, run_id: str, workdir: Path, vms: Sequence[_Vm]) -> None:
        """Where the VMs landed: said once (the run's log) and kept in `<run dir>/placement.json`."""
        import json

        zones: dict[str, list[str]] = {}
        for vm in vms:
            zones.setdefault(vm.zone, []).append(vm.slot)
        regions = sorted({region_of(z) for z in zones})
        log.info("gce: %d VMs of run %s in region %s: %s", len(vms), run_id, ", ".join(regions),
                 "; ".join(f"{z}: {', '.join(slots)}" for z, slots in zones.items()))
        record = {"regions": regions, "vms": [
            {"slot": vm.slot, "name": vm.name, "zone": vm.zone, "hosts": [s.name for s in vm.specs]}
            for vm in vms]}
        with contextlib.suppress(OSError):
            workdir.mkdir(parents=True, exist_ok=True)
            tmp = workdir / (PLACEMENT_FILE + ".tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.replace(workdir / PLACEMENT_FILE)

    def _insert_one(self, vm: _Vm) -> None:
        cfg = self.config
        self._journal_vm(vm, released=False)
        lease = (time.time() + cfg.lease_s + cfg.vm_ready_timeout_s + cfg.boot_timeout_s
                 if cfg.lease_s > 0 else None)  # until the first renewal, boot included
        body = instance_body(cfg, self.api.project, vm.request, vm.run_id, self._public_key(),
                             lease_expires=lease)
        vm.created = True  # from here on a delete is owed (404 if it never came to exist)
        vm.deleted = False
        deadline = self._clock() + cfg.not_ready_retry_s
        delay = cfg.retry_backoff_s
        while True:
            try:
                op = self.api.insert(vm.zone, body, request_id=str(uuid.uuid4()))
                self.api.wait(vm.zone, op, cfg.operation_timeout_s)
                break
            except (ZoneCapacityError, QuotaError, BadRequestError) as error:
                if vm.request.network_ip and _address_held(error) \
                        and self._clock() + delay < deadline:
                    # The lost VM's internal IP is released a little after it is gone.
                    self._sleep(delay)
                    delay = min(delay * 2, 15.0)
                    continue
                vm.created = False  # the operation failed: GCE created nothing
                self._record_released(vm)
                raise
        with self._lock:
            self._vms[vm.name] = vm
        self._start_lease()

    # --- the lease: VMs end themselves when the orchestrator is gone ----------------------

    def _start_lease(self) -> None:
        """Renew every live VM's lease every `lease_s / 3` from a background thread, so a VM
        outlives its orchestrator (killed, asleep, cut off) by at most `lease_s`."""
        if self.config.lease_s <= 0:
            return
        with self._lock:
            if self._lease_thread is not None and self._lease_thread.is_alive():
                return
            self._lease_stop.clear()
            self._lease_thread = threading.Thread(target=self._renew_leases, daemon=True,
                                                  name="gce-lease")
            self._lease_thread.start()

    def _renew_leases(self) -> None:
        interval = self.config.lease_s / 3
        failing = False
        while not self._lease_stop.wait(interval):
            with self._lock:
                vms = [vm for vm in self._vms.values()
                       if vm.specs and not vm.deleted and vm.revoked_reason is None]
            expires = str(int(time.time() + self.config.lease_s))

            def renew(vm: _Vm, value: str = expires) -> None:
                self.api.set_metadata_value(vm.zone, vm.name, LEASE_KEY, value)

            errors = [e for e in self._parallel(renew, vms) if e is not None]
            if errors and not failing:
                log.warning("gce: cannot renew the VMs' lease (%s); they end themselves "
                            "%g s after the last renewal", errors[0], self.config.lease_s)
            failing = bool(errors)
            self.lease_renewals += 1

    def _stop_lease(self) -> None:
        with self._lock:
            if any(vm.specs and not vm.deleted for vm in self._vms.values()):
                return
            thread, self._lease_thread = self._lease_thread, None
        self._lease_stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _public_key(self) -> str:
        """The public half of the login key (the tool's own is generated on first use)."""
        from provisioning.gce.keys import ensure_tool_key, key_problem, public_key_line

        if self._login_key is not None:
            return self._login_key
        if self.config.ssh_key:
            problem = key_problem(self.config.ssh_key)
            if problem is not None:
                raise BadFieldError("provider.ssh_key", problem)
            self._login_key = public_key_line(self.config.ssh_key)
        else:
            self._login_key = public_key_line(ensure_tool_key())
        return self._login_key

    def _await_running(self, vms: list[_Vm]) -> None:
        """Until every VM is RUNNING: one list call per config.ready_poll_s for all of them."""
        deadline = self._clock() + self.config.vm_ready_timeout_s
        waiting = {vm.name: vm for vm in vms}
        run_ids = {vm.run_id for vm in vms}
        missing: dict[str, int] = {}  # name -> lists in a row without it (gone after insert)
        preempted: dict[str, int] = {}  # slot -> preemptions while booting
        while waiting:
            listed = {}
            for run_id in run_ids:
                listed.update({v.name: v for v in self.api.list_vms(self._run_filter(run_id))})
            for name, vm in list(waiting.items()):
                seen = listed.get(name)
                if seen is not None and seen.status == "RUNNING":
                    vm.internal_ip, vm.external_ip = seen.internal_ip, seen.external_ip
                    del waiting[name]
                    continue
                if seen is None:
                    missing[name] = missing.get(name, 0) + 1
                    if missing[name] < 2:  # its insert is DONE: absent twice = gone
                        continue
                elif STATE_MAP.get(seen.status) is not HostState.REVOKED:
                    continue
                status = seen.status if seen is not None else "gone"
                preempted[vm.slot] = preempted.get(vm.slot, 0) + 1
                if not vm.request.transient or preempted[vm.slot] > self.config.boot_preemptions:
                    raise ZoneCapacityError(vm.zone, f"VM {name} went {status} while "
                                            "starting (preempted during creation)")
                log.warning("gce: %s went %s while booting (preempted): re-creating it alone",
                            name, status)
                del waiting[name]
                self._recreate_booting(vm)
                waiting[vm.name] = vm
            if not waiting:
                break
            if self._clock() >= deadline:
                raise CapacityError(f"VMs not RUNNING after {self.config.vm_ready_timeout_s:g} s: "
                                    + ", ".join(sorted(waiting)))
            self._sleep(self.config.ready_poll_s)

    def _recreate_booting(self, vm: _Vm) -> None:
        """A Spot VM preempted before it ever ran: delete what is left of it and create it
        again, alone, in its region (another zone first), keeping the rest of the cluster."""
        old_name, old_zone = vm.name, vm.zone
        self._delete([vm])
        with self._lock:
            self._vms.pop(old_name, None)
        self._create([vm], same_region=region_of(old_zone), avoid_zones=frozenset({old_zone}))

    def _pin_host_keys(self, run_id: str, vms: list[_Vm]) -> None:
        """Host keys from guest attributes (in parallel), then the Host records."""

        def fetch(vm: _Vm) -> None:
            deadline = self._clock() + self.config.host_key_timeout_s
            while (keys := self.api.host_keys(vm.zone, vm.name)) is None:
                if self._clock() >= deadline:
                    break
                self._sleep(self.config.host_key_poll_s)
            vm.host_keys = keys
            if self.config.gpu_check and has_gpu(vm.request.machine_type, vm.request.gpu):
                self._check_gpu(vm)

        errors = self._parallel(fetch, vms)
        for error in errors:
            if error is not None:
                raise error
        self._write_known_hosts(run_id)
        for vm in vms:
            machine = vm.request.host_ids[0]
            workdir = Path(PurePosixPath(remote_workdir(self.config, run_id, machine)))
            vm.hosts = [
                Host(id=host_id, spec=spec, address=vm.internal_ip,
                     port=self.config.trainer_port + i, workdir=workdir,
                     state=HostState.RUNNING, machine=machine)
                for i, (host_id, spec) in enumerate(zip(vm.request.host_ids, vm.specs,
                                                        strict=True))]
            vm.ssh = VmSsh(self.config, vm.name, vm.external_ip or vm.internal_ip,
                           has_gpu(vm.request.machine_type, vm.request.gpu),
                           self.known_hosts_path(run_id), pinned=bool(vm.host_keys),
                           journal=self._journal, user=self._login_user)
            with self._lock:
                for host in vm.hosts:
                    self._host_vm[host.id] = vm.name

    def _check_gpu(self, vm: _Vm) -> None:
        """Fail fast on a GPU VM that sees no GPU (driver missing or not loaded), instead of
        training on its CPU: its startup script publishes what nvidia-smi sees
        (`body.gpu_check_script`) as guest attributes, read here with the host keys."""
        deadline = self._clock() + self.config.gpu_timeout_s + 60.0  # the script's wait, then
        what = f"VM {vm.name} ({vm.request.machine_type}, GPU {vm.request.gpu or 'built in'})"
        while (seen := self.api.guest_attributes(vm.zone, vm.name, GPU_NAMESPACE)) is None:
            if self._clock() >= deadline:
                raise BadRequestError(f"{what}: no GPU check published within "
                                      f"{self.config.gpu_timeout_s + 60:g} s (guest "
                                      "attributes off, or the startup script did not run); "
                                      "provider.gpu_check=false skips it")
            self._sleep(self.config.host_key_poll_s)
        value = dict(seen).get("gpus", "0: nothing published")
        if not value.split(":", 1)[0].strip().isdigit() or int(value.split(":", 1)[0]) < 1:
            detail = value.split(":", 1)[1].strip() if ":" in value else value
            raise BadRequestError(f"{what} sees no GPU: nvidia-smi: {detail} (the NVIDIA "
                                  "driver is missing or not loaded; use an image family that "
                                  "carries it, e.g. common-cu128-ubuntu-2404-nvidia-570)")

    def known_hosts_path(self, run_id: str) -> Path:
        return self._workdirs.get(run_id, Path.cwd()) / KNOWN_HOSTS_FILE

    def _write_known_hosts(self, run_id: str) -> None:
        """`<run dir>/known_hosts` with every published key of the run's live VMs (OpenSSH
        format, paramiko's `load_host_keys` reads it; RejectPolicy stays on)."""
        lines = []
        with self._lock:
            vms = [vm for vm in self._vms.values() if vm.run_id == run_id and not vm.deleted]
        for vm in vms:
            for kind, blob in vm.host_keys or []:
                lines.extend(f"{addr} {kind} {blob}"
                             for addr in dict.fromkeys([vm.external_ip, vm.internal_ip]) if addr)
        path = self.known_hosts_path(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        tmp.replace(path)

    # --- runners (the SSH backend) ---------------------------------------------------------

    def runner(self, host: Host) -> HostRunner:
        """The SSH runner of `host` (the same object per host); connects to its VM on first
        use, checking the host key pinned from guest attributes."""
        vm = self._vm_of(host.id)
        if vm.deleted or vm.ssh is None or vm.revoked_reason is not None:
            raise HostLostError(host.id)
        return vm.ssh.runner(host)

    # --- poll ------------------------------------------------------------------------------

    def _run_filter(self, run_id: str) -> str:
        return f'labels.tool = "{TOOL_LABEL}" AND labels.run-id = "{label_value(run_id)}"'

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        """States of every host from ONE list call, at most one per `poll_interval_s`."""
        now = self._clock()
        cached = self._poll_cache.get(cluster.run_id)
        if cached is None or now - cached[0] >= self.config.poll_interval_s:
            try:  # one attempt: the next poll is the retry, the supervisor's loop never waits
                found = self.api.list_vms(self._run_filter(cluster.run_id), retries=0,
                                          timeout_s=POLL_TIMEOUT_S)
            except TransientApiError as error:
                if cached is None:
                    raise
                # Our link to the API is down (or GCE hiccups): the cloud has not said anything
                # new, so the last answer stands; SSH tells an unreachable VM meanwhile.
                if not self._api_down:
                    log.warning("gce: cannot reach the Compute API (%s); keeping the VMs' last "
                                "known states", error)
                self._api_down = True
                cached = (now, cached[1])
            else:
                if self._api_down:
                    log.warning("gce: the Compute API answers again")
                self._api_down = False
                cached = (now, {v.name: v for v in found})
            self._poll_cache[cluster.run_id] = cached
        listed = cached[1]
        states = {}
        for host in cluster.hosts:
            vm = self._vms.get(self._host_vm.get(host.id, ""))
            if vm is None:
                states[host.id] = HostState.REVOKED
                continue
            if vm.deleted:
                states[host.id] = HostState.TERMINATED
                continue
            seen = listed.get(vm.name)
            state = HostState.REVOKED if seen is None else STATE_MAP.get(seen.status,
                                                                          HostState.REVOKED)
            if state is HostState.RUNNING and vm.ssh is not None:
                state = vm.ssh.state() or state  # REVOKED only after the unreachable grace
            if state is HostState.REVOKED and vm.revoked_reason is None:
                vm.revoked_reason = self._revocation_reason(vm)
                if vm.ssh is not None:
                    vm.ssh.mark_gone()  # nothing more runs on a preempted VM
            if state is HostState.REVOKED:
                self.revocations[host.id] = vm.revoked_reason or "gone"
            states[host.id] = state
        return states

    def state_lag_s(self) -> float:
        """poll() answers from one listing per `poll_interval_s`: a preempted VM's processes
        can be seen dead (over SSH) up to that long before the listing says STOPPING."""
        return self.config.poll_interval_s

    def _revocation_reason(self, vm: _Vm) -> str:
        """'preempted' when GCE recorded a preemption of the VM, else 'gone' (one call, once)."""
        try:
            return "preempted" if self.api.was_preempted(vm.zone, vm.name) else "gone"
        except ProvisionError:
            return "gone"

    # --- replace ---------------------------------------------------------------------------

    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        lost_vms: dict[str, _Vm] = {}
        for host_id in cluster.same_machine(list(lost)):  # KeyError for a stranger
            vm = self._vm_of(host_id)
            lost_vms[vm.name] = vm
        old = list(lost_vms.values())
        self._close_ssh(old)
        self._delete(old)
        # The slot's zone first. keep_endpoints: also the lost VM's internal IP, so the
        # replacement has the endpoint in TensorFlow's fixed cluster spec (an internal address
        # holds only within its region's subnet).
        fresh = [_Vm(request=self._vm_request(
                         vm.run_id, vm.slot, vm.specs, zone=vm.zone,
                         network_ip=(vm.internal_ip or None) if keep_endpoints else None),
                     run_id=vm.run_id, slot=vm.slot, specs=list(vm.specs), zone_hint=vm.zone)
                 for vm in old]
        try:
            same_region = region_of(old[0].zone) if old and keep_endpoints else None
            self._create(fresh, same_region=same_region)
            self._await_running(fresh)
            self._pin_host_keys(cluster.run_id, fresh)
        except BaseException:
            self._delete([vm for vm in fresh if vm.created])
            raise
        finally:
            self._delete_ghosts(cluster.run_id)
        swap = {h.id: new_host for vm, new in zip(old, fresh, strict=True)
                for h, new_host in zip(vm.hosts, new.hosts, strict=True)}
        return Cluster(run_id=cluster.run_id, hosts=[swap.get(h.id, h) for h in cluster.hosts])

    # --- release ---------------------------------------------------------------------------

    def release(self, cluster: Cluster) -> None:
        """Stop the runners and delete every VM of the run (the cluster's and any leftovers of
        a failed replacement); waits for the deletes. Idempotent."""
        with self._lock:
            vms = [vm for vm in self._vms.values()
                   if vm.run_id == cluster.run_id and not vm.deleted]
        self._close_ssh(vms)
        try:
            self._delete(vms)
        finally:
            self._stop_lease()

    def _close_ssh(self, vms: Sequence[_Vm]) -> None:
        """Stop every role on these VMs and close their connections, in parallel."""
        self._parallel(lambda vm: vm.ssh.close() if vm.ssh is not None else None, vms)

    def _delete(self, vms: Sequence[_Vm]) -> None:
        """Delete in parallel and wait; a VM that is already gone is fine. Raises the first
        failure after every delete was tried."""

        def delete(vm: _Vm) -> None:
            self.api.remove(vm.zone, vm.name, self.config.operation_timeout_s)
            vm.deleted = True
            vm.created = False
            self._record_released(vm)

        errors = [e for e in self._parallel(delete, [vm for vm in vms if not vm.deleted]) if e]
        if errors:
            raise errors[0]

    def _record_released(self, vm: _Vm) -> None:
        self._journal_vm(vm, released=True)

    def _journal_vm(self, vm: _Vm, released: bool) -> None:
        """Journal a VM before its insert and after its delete (`provisioning.journal.Journal`
        records VMs; a journal of process groups only is skipped)."""
        record = getattr(self._journal, "record_vm", None)
        if record is not None:
            record(backend=self.name, host_id=vm.request.host_ids[0], name=vm.name,
                   address=vm.zone or None, released=released)

    def checkpoint_store(self, run_id: str, folder: Path) -> CheckpointStore:
        """With `provider.storage = gs://...`: the local folder mirrored to the bucket
        (`storage.GcsCheckpointStore`); otherwise the default folder store."""
        if not self.config.storage:
            return super().checkpoint_store(run_id, folder)
        from provisioning.gce.storage import GcsCheckpointStore

        return GcsCheckpointStore(folder, self.config.storage, run_id)

    def clean_up(self, entries: Sequence[Any], grace_s: float = STOP_GRACE_S
                 ) -> list[CleanUpResult]:
        """After a crash: delete the VMs a run's journal still lists (found by name with one
        list call, deleted in parallel). Processes on them end with their VM, so their entries
        are released once every VM of the journal is gone."""
        vm_names = {e.resource_id for e in entries if e.kind == ResourceKind.VM}
        existing = {v.name: v for v in self.api.list_vms(f'labels.tool = "{TOOL_LABEL}"')
                    if v.name in vm_names}
        failed: dict[str, str] = {}

        def delete(name: str) -> None:
            listed = existing[name]
            try:
                self.api.remove(listed.zone, name, self.config.operation_timeout_s)
            except ProvisionError as error:
                failed[name] = str(error)

        self._parallel(delete, sorted(existing))
        results = []
        for entry in entries:
            if entry.kind == ResourceKind.VM:
                name = entry.resource_id
                if name in failed:
                    results.append(CleanUpResult(entry, False, f"vm {name}: delete failed: "
                                                 f"{failed[name]}"))
                else:
                    note = (f"deleted vm {existing[name].zone}/{name} (host {entry.host_id})"
                            if name in existing else None)
                    results.append(CleanUpResult(entry, True, note))
            elif failed:
                results.append(CleanUpResult(entry, False, f"{entry.kind} {entry.resource_id} "
                                             f"on host {entry.host_id}: its VM may still run"))
            else:
                results.append(CleanUpResult(entry, True, None))
        return results

    # --- helpers ---------------------------------------------------------------------------

    def _vm_of(self, host_id: HostId) -> _Vm:
        try:
            return self._vms[self._host_vm[host_id]]
        except KeyError:
            raise HostLostError(host_id, f"host {host_id} was not acquired here") from None

    def _parallel(self, fn: Callable[[Any], None], vms: Sequence[Any]) -> list[BaseException | None]:
        """Run `fn` on every VM concurrently; the exception of each (None = success). Waits for
        all, so nothing is still being created when the caller cleans up."""
        if not vms:
            return []
        if len(vms) == 1:
            try:
                fn(vms[0])
                return [None]
            except Exception as error:
                return [error]
        with ThreadPoolExecutor(max_workers=min(self.config.max_parallel, len(vms)),
                                thread_name_prefix="gce") as pool:
            futures = [pool.submit(fn, vm) for vm in vms]
            return [f.exception() for f in futures]

