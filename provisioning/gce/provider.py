"""`provider=gce`: one Compute Engine VM per machine of the plan, Spot for transient hosts.

Split as SkyPilot splits `sky/provision/gcp`: this module holds the verbs of the contract
(`GceProvider`), `instance.py` the instance code they call (`GceInstances`: create, wait,
check, lease, delete), `vm.py` the data model (`Vm`, the state map).

- acquire: first the checks that need no VM, in one pass with one line per problem
  (`preflight.py`: quotas, image family, bucket, OS Login, whose key is imported then, the VMs'
  service account; the login key is `keys.py`'s; the first RUNNING VM's effective OS Login value
  can still turn OS Login on, before any login). VMs are journalled *before* they are inserted, then created in parallel
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
  leftovers; `checkpoint_store` mirrors checkpoints to `provider.storage` (`storage.py`), and
  `dataset_store` stages a dataset there once for the VMs to download themselves.
- class-level hooks of the contract, read without building a provider: `preview` (the dry
  run's VMs per zone, `preview.py`), `check_credentials` (`api.resolve_credentials`, at run
  start) and `fetch_dataset` for `job.data_dir=gs://...` (`storage.cached_copy`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioning.base import (
    DATA_DIR_FIELD,
    STOP_GRACE_S,
    BadFieldError,
    BadRequestError,
    CheckpointStore,
    CleanUpResult,
    Cluster,
    ClusterRequest,
    ContactLostError,
    DatasetStore,
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
from provisioning.catalog import Market, PricingConfig
from provisioning.gce.body import (
    VmRequest,
    label_value,
    vm_name,
)
from provisioning.gce.body import run_labels as make_run_labels
from provisioning.gce.config import TOOL_LABEL, GceConfig
from provisioning.gce.errors import (
    TransientApiError,
    region_of,
)
from provisioning.gce.instance import GceInstances
from provisioning.gce.vm import STATE_MAP, Vm, owner_labels
from provisioning.journal import ResourceKind

#: One poll's list call: a cut link must not hold the supervisor's loop for minutes.
POLL_TIMEOUT_S = 20.0
log = logging.getLogger(__name__)


class GceProvider(GceInstances, Provider):
    """Compute Engine VMs for trainer roles. `api`: a `ComputeApi` (built from `config` when
    None; tests pass one bound to a fake). Runners come from the SSH backend (`gce/ssh.py`)."""

    name = "gce"

    @classmethod
    def transient_market(cls, pricing: PricingConfig) -> Market:
        return Market.spot  # instance_body: provisioningModel SPOT for transient hosts

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
        self._vms: dict[str, Vm] = {}  # by VM name
        self._host_vm: dict[HostId, str] = {}
        self._workdirs: dict[str, Path] = {}  # run_id -> request.workdir
        self._sweep_ids: dict[str, str] = {}  # run_id -> request.sweep_id
        self._poll_cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self._serial = itertools.count()
        self._lock = threading.RLock()
        self._owner = owner_labels()
        self.revocations: dict[HostId, str] = {}  # host -> "preempted" | "gone" (for reports)
        self._login_key: str | None = None  # public half of the login key (`_public_key`)
        self.os_login = False  # OS Login is on (the preflight, or the first VM's effective value)
        self._effective_read = False  # the first VM's effective OS Login value was read
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
        lines = [line if line.startswith("not checked:") else f"ok: {line}"
                 for line in result.passed]
        lines += [f"problem: {line}" for line in result.problems]
        try:
            user = provider.api.os_login_user() if result.os_login else None
        except ProvisionError:
            user = None
        if not result.os_login:
            lines.append(f"ok: OS Login off in project {provider.api.project}: VMs take the "
                         f"key from ssh-keys metadata, login as {config.ssh_user} (unless the "
                         "first VM says an organisation policy turns it on)")
        elif user:
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
            self._follow_effective_os_login(vms[0])
            self._pin_host_keys(request.run_id, vms)
        except BaseException:
            self._delete([vm for vm in vms if vm.created])
            raise
        finally:
            self._delete_ghosts(request.run_id)
        self._record_placement(request.run_id, request.workdir, vms)
        by_name = {h.spec.name: h for vm in vms for h in vm.hosts}
        return Cluster(run_id=request.run_id, hosts=[by_name[s.name] for s in request.hosts])

    def _preflight(self, vms: Sequence[Vm]) -> None:
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

    def _first_zone_requests(self, vms: Sequence[Vm]) -> list[VmRequest]:
        """Each VM's request in the zone it is tried in first (what the quotas count)."""
        return [replace(vm.request, zone=self._zones_for(vm)[0]) for vm in vms]

    def _follow_effective_os_login(self, vm: Vm) -> None:
        """OS Login can be on where the project's metadata says nothing (an organisation
        policy, compute.requireOsLogin): the first VM's effective value, as GCE resolved it
        (`resourceStatus.effectiveInstanceMetadata`), decides, before any login. On: the key
        goes into the OS Login profile now; PreflightError when that cannot work (no account,
        no role, 2-step verification), and the acquire deletes its VMs."""
        from provisioning.gce.access import two_factor_problem
        from provisioning.gce.preflight import PreflightError

        if self.os_login or self._effective_read:
            return
        self._effective_read = True
        try:
            on = self.api.effective_os_login(vm.zone, vm.name)
        except ProvisionError as error:
            log.warning("gce: cannot read VM %s's effective OS Login value (%s); logging in "
                        "with ssh-keys", vm.name, error)
            return
        if not on:
            return
        log.warning("gce: OS Login is on for VM %s although project %s's metadata does not "
                    "turn it on (an organisation policy): importing the key into the OS Login "
                    "profile", vm.name, self.api.project)
        self.os_login = True
        problem = two_factor_problem(self.api.project, self.api.project_info().metadata) \
            or self._use_os_login("(an organisation policy, not its metadata)")
        if problem is not None:
            raise PreflightError([problem])

    def _use_os_login(self, why: str = "(enable-oslogin=TRUE)") -> str | None:
        """The project ignores `ssh-keys` metadata (OS Login): import our key into the OS
        Login profile and log in as its POSIX user; a line saying why not, else None."""
        try:
            user = self.api.os_login_user()
        except ProvisionError as error:  # token info unreachable, credentials not refreshable
            return (f"provider.os_login_user: project {self.api.project} has OS Login on "
                    f"{why} and the credentials' account could not be learnt ({error}); set "
                    "it to the e-mail of the account whose OS Login profile gets the tool's key")
        if not user:
            return (f"provider.os_login_user: project {self.api.project} has OS Login on "
                    f"{why}, so VMs ignore the ssh-keys metadata, and the "
                    "credentials name no account (anonymous, or no e-mail in their token "
                    "info); set it to the e-mail of the account whose OS Login profile gets "
                    "the tool's key")
        try:
            self._login_user = self.api.import_os_login_key(user, self._public_key())
        except ProvisionError as error:
            return (f"provider.os_login_user: project {self.api.project} has OS Login on and "
                    f"the key could not be imported for {user} ({error}); it needs the role "
                    "roles/compute.osAdminLogin (or osLogin) in the project")
        return None

    def _plan_vms(self, run_id: str, specs: Sequence[HostSpec]) -> list[Vm]:
        """One `Vm` per machine of the plan; colocated roles join their owner's VM."""
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
        return [Vm(request=self._vm_request(run_id, slot, group), run_id=run_id, slot=slot,
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

    def _zones_for(self, vm: Vm, same_region: str | None = None) -> list[str]:
        zones = [z for z in dict.fromkeys([vm.zone_hint, vm.specs[0].zone, *self.config.zones])
                 if z]
        if same_region is not None:
            zones = [z for z in zones if region_of(z) == same_region]
        if not zones:
            raise BadRequestError(f"provider.zones: no zone for host {vm.slot!r} (set its zone "
                                  "in the cluster or list zones in provider.zones)")
        return zones

    # --- runners (the SSH backend) ---------------------------------------------------------

    def runner(self, host: Host) -> HostRunner:
        """The SSH runner of `host` (the same object per host); connects to its VM on first
        use, checking the host key pinned from guest attributes."""
        vm = self.vm_of(host.id)
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
        self._raise_if_out_of_contact(cluster)
        return states

    def _raise_if_out_of_contact(self, cluster: Cluster) -> None:
        """ContactLostError when every VM of the cluster that has a connection lost it for
        the grace (our network, not theirs: the run stops resumable instead of restarting on
        VMs it cannot reach either). One VM out of contact while others answer is REVOKED."""
        names = {self._host_vm.get(h.id, "") for h in cluster.hosts}
        opened = [vm.ssh for name in names if (vm := self._vms.get(name)) is not None
                  and not vm.deleted and vm.ssh is not None and vm.ssh.opened]
        if opened and all(ssh.contact_lost() for ssh in opened):
            raise ContactLostError(
                f"no VM has answered over SSH for {self.config.unreachable_grace_s:g} s "
                f"(provider.unreachable_grace_s)"
                + (" and the Compute API is unreachable" if self._api_down else "")
                + ": the orchestrator's network is down, most likely; the roles end on their "
                "own within their lease, the VMs on theirs (provider.lease_s)")

    def state_lag_s(self) -> float:
        """poll() answers from one listing per `poll_interval_s`: a preempted VM's processes
        can be seen dead (over SSH) up to that long before the listing says STOPPING."""
        return self.config.poll_interval_s

    def _revocation_reason(self, vm: Vm) -> str:
        """'preempted' when GCE recorded a preemption of the VM, else 'gone' (one call, once)."""
        try:
            return "preempted" if self.api.was_preempted(vm.zone, vm.name) else "gone"
        except ProvisionError:
            return "gone"

    # --- replace ---------------------------------------------------------------------------

    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        lost_vms: dict[str, Vm] = {}
        for host_id in cluster.same_machine(list(lost)):  # KeyError for a stranger
            vm = self.vm_of(host_id)
            lost_vms[vm.name] = vm
        old = list(lost_vms.values())
        self._close_ssh(old)
        self._delete(old)
        # The slot's zone first. keep_endpoints: also the lost VM's internal IP, so the
        # replacement has the endpoint in TensorFlow's fixed cluster spec (an internal address
        # holds only within its region's subnet).
        fresh = [Vm(request=self._vm_request(
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

    def checkpoint_store(self, run_id: str, folder: Path) -> CheckpointStore:
        """With `provider.storage = gs://...`: the local folder mirrored to the bucket
        (`storage.GcsCheckpointStore`); otherwise the default folder store."""
        if not self.config.storage:
            return super().checkpoint_store(run_id, folder)
        from provisioning.gce.storage import GcsCheckpointStore, GcsStore

        return GcsCheckpointStore(folder, self.config.storage, run_id,
                                  store=GcsStore(cfg=self.config))  # provider.credentials

    def dataset_store(self) -> DatasetStore | None:
        """With `provider.storage = gs://...`: the bucket, which the VMs download a dataset
        from themselves (`storage.GcsDatasetStore`); otherwise none (a push per VM)."""
        if not self.config.storage:
            return None
        from provisioning.gce.storage import GcsDatasetStore

        return GcsDatasetStore(self.config.storage, self.config)

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
