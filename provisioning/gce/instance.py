"""The GCE backend's instance code: how the VMs of a run are created (zone and region
fallback, ghosts of inserts that may have succeeded), waited on until RUNNING, checked (host
keys, the GPU; a VM preempted while booting or during these checks is re-created alone), kept
on a lease, and deleted. `GceInstances` is a mixin of `GceProvider` (`provider.py`, the
verbs), whose state it shares: the config, the Compute API, the journal and the table of
VMs (`vm.Vm`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from provisioning.base import (
    BadFieldError,
    BadRequestError,
    CapacityError,
    Host,
    HostId,
    HostLostError,
    HostState,
    ProvisionError,
    ResourceJournal,
)
from provisioning.gce.body import (
    GPU_NAMESPACE,
    LEASE_KEY,
    has_gpu,
    instance_body,
    lease_value,
    remote_workdir,
    vm_name,
)
from provisioning.gce.config import DEFAULT_IMAGE_FAMILY, GceConfig
from provisioning.gce.errors import (
    GuestAttributesOffError,
    QuotaError,
    TransientApiError,
    ZoneCapacityError,
    region_of,
)
from provisioning.gce.ssh import VmSsh
from provisioning.gce.vm import (
    KNOWN_HOSTS_FILE,
    PLACEMENT_FILE,
    STATE_MAP,
    Vm,
    address_held,
)

log = logging.getLogger(__name__)


class _VmGone(Exception):
    """A VM left RUNNING (preempted, stopped, deleted) while its host keys or GPU check were
    awaited; `status` is what the listing said ("gone": not listed)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class GceInstances:
    """Creating, watching and deleting the VMs of `GceProvider` (see the module docstring)."""

    config: GceConfig
    api: Any
    _journal: ResourceJournal | None
    _vms: dict[str, Vm]
    _workdirs: dict[str, Path]
    _lock: threading.RLock
    _lease_thread: threading.Thread | None
    _lease_stop: threading.Event
    lease_renewals: int
    _login_key: str | None
    _login_user: str | None
    #: why guest attributes are refused (`_guest_attributes_off`); None while they work
    guest_attributes_off: str | None = None

    def _keep_ghost(self, vm: Vm) -> None:
        """An insert that raised a transient error may have created the VM anyway: keep its
        name (journalled already) so it is deleted with the run's other leftovers."""
        ghost = Vm(request=vm.request, run_id=vm.run_id, slot=vm.slot, specs=[], created=True)
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

    def _create(self, vms: list[Vm], same_region: str | None = None,
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

    def _create_cluster(self, vms: list[Vm]) -> None:
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

    def _zones_in(self, vm: Vm, region: str) -> list[str]:
        zones = [vm.zone_hint, vm.specs[0].zone, *self.config.zones]
        return [z for z in dict.fromkeys(zones) if z and region_of(z) == region]

    def _record_placement(self, run_id: str, workdir: Path, vms: Sequence[Vm]) -> None:
        """Where the VMs landed: said once (the run's log) and kept in `<run dir>/placement.json`."""
        import json

        zones: dict[str, list[str]] = {}
        for vm in vms:
            zones.setdefault(vm.zone, []).append(vm.slot)
        regions = sorted({region_of(z) for z in zones})
        log.info("gce: %d VMs of run %s in region %s: %s", len(vms), run_id, ", ".join(regions),
                 "; ".join(f"{z}: {', '.join(slots)}" for z, slots in zones.items()))
        record = {"regions": regions, "vms": [
            {"slot": vm.slot, "name": vm.name, "zone": vm.zone, "hosts": [s.name for s in vm.specs],
             # how its SSH host key is trusted: published by the guest agent, or taken on first
             # use (guest attributes refused or not published in time)
             "host_key": "guest attributes" if vm.host_keys else "trust on first use"}
            for vm in vms]}
        if self.guest_attributes_off is not None:
            record["guest_attributes_off"] = self.guest_attributes_off
        with contextlib.suppress(OSError):
            workdir.mkdir(parents=True, exist_ok=True)
            tmp = workdir / (PLACEMENT_FILE + ".tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.replace(workdir / PLACEMENT_FILE)

    def _insert_one(self, vm: Vm) -> None:
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
                if vm.request.network_ip and address_held(error) \
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
        stamp = 0.0
        while not self._lease_stop.wait(interval):
            with self._lock:
                vms = [vm for vm in self._vms.values()
                       if vm.specs and not vm.deleted and vm.revoked_reason is None]
            # The VM times the lease from the stamp's last CHANGE on its own clock
            # (`body.lease_watcher_script`): each round's stamp differs from the last one,
            # even when renewals are under a second apart or this clock steps back.
            stamp = max(time.time() + self.config.lease_s, stamp + 1)
            expires = lease_value(stamp)

            def renew(vm: Vm, value: str = expires) -> None:
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

    def _await_running(self, vms: list[Vm]) -> None:
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

    def _recreate_booting(self, vm: Vm) -> None:
        """A VM preempted before it was ever used (booting, or awaited for its host keys or
        GPU check): delete what is left of it and create it again, alone, in its region
        (another zone first), keeping the rest of the cluster."""
        old_name, old_zone = vm.name, vm.zone
        self._delete([vm])
        with self._lock:
            self._vms.pop(old_name, None)
        self._create([vm], same_region=region_of(old_zone), avoid_zones=frozenset({old_zone}))

    def _pin_host_keys(self, run_id: str, vms: list[Vm]) -> None:
        """Host keys from guest attributes (in parallel), then the Host records."""

        def fetch(vm: Vm) -> None:
            lost = 0
            while True:
                try:
                    self._await_guest(vm)
                    return
                except GuestAttributesOffError as error:
                    self._guest_attributes_off(error)
                    return
                except _VmGone as gone:  # after RUNNING, before any login: re-created alone
                    lost += 1
                    if lost > self.config.boot_preemptions:
                        raise ZoneCapacityError(vm.zone, f"VM {vm.name} went {gone.status} "
                                                f"{lost} times before its first use "
                                                "(provider.boot_preemptions="
                                                f"{self.config.boot_preemptions})") from None
                    log.warning("gce: %s went %s before its first use (preempted): "
                                "re-creating it alone", vm.name, gone.status)
                    vm.host_keys = None
                    self._recreate_booting(vm)
                    self._await_running([vm])

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

    def _await_guest(self, vm: Vm) -> None:
        """The VM's host keys (until `host_key_timeout_s`; none: pinned on first use) and, on
        a GPU VM, its GPU check. Each poll that finds nothing published also asks whether the
        VM is still RUNNING (`_raise_if_gone`): a Spot VM preempted here must not be waited
        for until a timeout that blames something else."""
        deadline = self._clock() + self.config.host_key_timeout_s
        while (keys := self.api.host_keys(vm.zone, vm.name)) is None:
            self._raise_if_gone(vm)
            if self._clock() >= deadline:
                break
            self._sleep(self.config.host_key_poll_s)
        vm.host_keys = keys
        if self.config.gpu_check and has_gpu(vm.request.machine_type, vm.request.gpu):
            self._check_gpu(vm)

    def _raise_if_gone(self, vm: Vm) -> None:
        """_VmGone when the run's listing shows `vm` stopping, stopped, or not at all (asked
        twice, as `_await_running` does: a listing may lag)."""
        for _ in range(2):
            listed = self.api.list_vms(self._run_filter(vm.run_id))
            seen = next((v for v in listed if v.name == vm.name), None)
            if seen is not None:
                if STATE_MAP.get(seen.status) is HostState.REVOKED:
                    raise _VmGone(seen.status)
                return
        raise _VmGone("gone")

    def _guest_attributes_off(self, error: GuestAttributesOffError) -> None:
        """Guest attributes are refused (403/412): the stated fallback, said once per
        provider. Host keys are pinned on first use (each pin is logged and recorded in
        `<run dir>/ssh_pinned_host_keys.jsonl`, and `placement.json` says which VMs were),
        and the GPU is checked only by the trainer (a GPU task whose TensorFlow sees no GPU
        fails at start), instead of stopping the run."""
        with self._lock:
            first, self.guest_attributes_off = self.guest_attributes_off is None, str(error)
        if first:
            log.warning("gce: %s; an organisation policy (compute.disableGuestAttributesAccess) "
                        "or a role keeps them from us: host keys are pinned on first use "
                        "(recorded) and the GPU is checked by the trainer only", error)

    def _check_gpu(self, vm: Vm) -> None:
        """Fail fast on a GPU VM that sees no GPU (driver missing or not loaded), instead of
        training on its CPU: its startup script publishes what nvidia-smi sees
        (`body.gpu_check_script`) as guest attributes, read here with the host keys."""
        deadline = self._clock() + self.config.gpu_timeout_s + 60.0  # the script's wait, then
        what = f"VM {vm.name} ({vm.request.machine_type}, GPU {vm.request.gpu or 'built in'})"
        while (seen := self.api.guest_attributes(vm.zone, vm.name, GPU_NAMESPACE)) is None:
            self._raise_if_gone(vm)  # preempted meanwhile: a loss, not a missing GPU check
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
                                  f"carries it, e.g. {DEFAULT_IMAGE_FAMILY})")

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

    # --- deleting -------------------------------------------------------------------------

    def _close_ssh(self, vms: Sequence[Vm]) -> None:
        """Stop every role on these VMs and close their connections, in parallel."""
        self._parallel(lambda vm: vm.ssh.close() if vm.ssh is not None else None, vms)

    def _delete(self, vms: Sequence[Vm]) -> None:
        """Delete in parallel and wait; a VM that is already gone is fine. Raises the first
        failure after every delete was tried."""

        def delete(vm: Vm) -> None:
            self.api.remove(vm.zone, vm.name, self.config.operation_timeout_s)
            vm.deleted = True
            vm.created = False
            self._record_released(vm)

        errors = [e for e in self._parallel(delete, [vm for vm in vms if not vm.deleted]) if e]
        if errors:
            raise errors[0]

    def _record_released(self, vm: Vm) -> None:
        self._journal_vm(vm, released=True)

    def _journal_vm(self, vm: Vm, released: bool) -> None:
        """Journal a VM before its insert and after its delete (`provisioning.journal.Journal`
        records VMs; a journal of process groups only is skipped)."""
        record = getattr(self._journal, "record_vm", None)
        if record is not None:
            record(backend=self.name, host_id=vm.request.host_ids[0], name=vm.name,
                   address=vm.zone or None, released=released)

    # --- helpers ---------------------------------------------------------------------------

    def vm_of(self, host_id: HostId) -> Vm:
        """The VM this provider holds for ``host_id`` (its name, zone, SSH session, host keys):
        the GCE backend's own, not the Provider contract's, for baking an image from a host,
        the benchmarks and the tests that look at a VM (HostLostError if not acquired here)."""
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
