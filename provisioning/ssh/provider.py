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
import posixpath
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from provisioning.base import (
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
    HostSpec,
    HostState,
    Provider,
    ProvisionError,
    ResourceJournal,
)
from provisioning.ssh.config import SshHostConfig, SshProviderConfig, assign
from provisioning.ssh.connection import SshTimeouts, set_handshake_limit
from provisioning.ssh.host_runner import SshHostRunner
from provisioning.ssh.machine import Machine
from provisioning.ssh.runner import group_alive_command, kill_groups_command
from provisioning.ssh.setup import ensure_environment, wheel_cache

log = logging.getLogger(__name__)

#: File in the run directory recording host keys pinned on first use (public fingerprints).
PINNED_KEYS_FILE = "ssh_pinned_host_keys.jsonl"
#: How long release() and clean_up() try to reach a machine that was lost.
RETRY_LOST_CONNECT_S = 3.0
KILL_CONFIRM_S = 5.0  # after KILL, how long a leftover group may take to be gone (reaped)


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

    def record_pin(self, hostname: str, fingerprint: str) -> None:
        log.warning("ssh: pinned the host key of %s on first use: %s", hostname, fingerprint)
        if self._run_dir is not None:
            self._run_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError), open(self._run_dir / PINNED_KEYS_FILE, "a") as f:
                f.write(json.dumps({"host": hostname, "fingerprint": fingerprint,
                                    "known_hosts": self.config.known_hosts,
                                    "time": time.time()}) + "\n")

    # --- setup -------------------------------------------------------------------------------

    def setup_machines(self, machines: Sequence[Machine]) -> None:
        cache = None  # looked up (a scan of the sources) only when a machine needs it
        for machine in machines:
            with machine.lock:
                if machine.setup_future is None and machine.alive():
                    assert machine.connection is not None
                    cache = cache or wheel_cache(self.config.wheelhouse, self.config.extra,
                                                  self.config.index_url)
                    machine.setup_future = self._setup_pool.submit(
                        ensure_environment, machine.connection, machine.root,
                        machine.inventory.python, cache, self.config.extra)

    def setup_all_placed(self) -> None:
        """Set up every machine in use at once (the first setup() of a run pays for all)."""
        with self._lock:
            machines = [m for m in self._machines.values() if m.alive()]
        self.setup_machines(machines)

    # --- the rest of the contract -----------------------------------------------------------

    def runner(self, host: Host) -> SshHostRunner:
        try:
            return self._runners[host.id]
        except KeyError:
            raise HostLostError(host.id, f"host {host.id} was not acquired here") from None

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        """A machine that dropped its connection stays RUNNING while it is reconnected (its
        roles run on) and is REVOKED once the graces say it is lost (`judge_unreachable`);
        ContactLostError once no machine has answered for `outage_grace_s`."""
        self.judge_unreachable()
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

    def judge_unreachable(self) -> None:
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
