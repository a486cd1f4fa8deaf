"""The one owner of "the current cluster" during a run, and the one place that acts on it.

`Fleet` holds the provider, the current `Cluster` and the `Deployment` running on it. Every
change of hosts goes through it: starting the roles, replacing lost hosts (keeping their slots),
restarting every role from the checkpoint store, revoking a host, syncing checkpoints, and the
final collect-and-release. The supervisor decides when (with the recovery policies); run.py
only builds a fleet and releases it. Nobody else calls `provider.replace`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from orchestrator import killpoints
from orchestrator.rundir import results
from orchestrator.rundir.results import RunRecorder
from orchestrator.runtime import data
from orchestrator.runtime.control import ControlChannel
from orchestrator.runtime.deploy import (
    LEASE_S,
    READY_TIMEOUT_S,
    Deployment,
    raise_if_lost,
    run_polling,
)
from orchestrator.transient.recovery import hosts_to_replace
from provisioning.base import (
    STOP_GRACE_S,
    CheckpointStore,
    Cluster,
    Host,
    HostId,
    HostRunner,
    HostState,
    Provider,
    ProvisionError,
    Role,
)
from trainer import layout
from trainer.events import EVENT_READY
from trainer.spec import TrainerSpec

T = TypeVar("T")


def gpu_tasks(cluster: Cluster) -> dict[str, list[int]]:
    """The spec's `gpu_tasks` for `cluster`: per server job, the task indices of its hosts
    with a GPU (jobs without one left out)."""
    return {job: tasks for job in (Role.PS.value, Role.WORKER.value)
            if (tasks := [i for i, h in enumerate(cluster.hosts_for(job)) if h.spec.gpu])}


class Fleet:
    """The cluster of one run and the processes on it.

    `spec` is the launch spec with any cluster; each deployment gets a copy with the current
    cluster's endpoints and the checkpoint store's location for its chief; the orchestrator
    keeps the one last deployed as `<run_dir>/trainer_spec.json` (the run's record)."""

    def __init__(self, provider: Provider, cluster: Cluster, run_dir: Path, spec: TrainerSpec,
                 store: CheckpointStore, control: ControlChannel, *,
                 rec: RunRecorder | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 stop_grace_s: float = STOP_GRACE_S, command: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None, lease_s: float = LEASE_S) -> None:
        self.provider = provider
        self.lease_s = lease_s  # the roles' lease (deploy.role_lease_s)
        self.cluster = cluster
        self.run_dir = Path(run_dir)
        self.spec = spec
        self.store = store
        self.control = control
        self.rec = rec
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.command = command
        self._replacing: _Replacement | None = None  # hosts being provisioned in the background
        self.env = env
        self.deployments: list[Deployment] = []
        self.dropped: list[Host] = []  # hosts left out of the cluster (`drop`), released last

    @property
    def deployment(self) -> Deployment:
        """The deployment running now (the last one started)."""
        return self.deployments[-1]

    def chief_runner(self) -> HostRunner:
        return self.provider.runner(self.cluster.hosts_for(Role.CHIEF)[0])

    # --- starting -----------------------------------------------------------------------------
    def deploy(self) -> Deployment:
        """Start every role on the current cluster (also after a restart) and wait until the
        servers are ready. Raises MachinesLostError when a machine is lost on the way (the
        supervisor recovers: `Supervisor.deploy`), DeployError / HostLostError as the
        deployment does; what it started is stopped by `stop_roles` or `release`."""
        chief = self._on_chief(self.chief_runner)
        spec = dataclasses.replace(
            self.spec, cluster={job: self.cluster.endpoints(job) for job in layout.CLUSTER_JOBS},
            checkpoint_dir=self.store.location(chief),
            gpu_tasks=gpu_tasks(self.cluster) if self.spec.gpu_tasks else {})
        data_dir = None  # the dataset here; hosts that don't share this machine's files get a copy
        if spec.job.data_dir and not chief.shares_orchestrator_fs:
            data_dir = Path(spec.job.data_dir)
            spec = dataclasses.replace(spec, job=dataclasses.replace(
                spec.job, data_dir=data.staged_path(data_dir)))
        spec_text = spec.to_json(self.run_dir / layout.SPEC_FILE).read_text()
        self._on_chief(lambda: self.store.before_start(chief))
        deployment = Deployment(self.provider, self.cluster, self.run_dir, spec_text,
                                command=self.command, env=self.env,
                                ready_timeout_s=self.ready_timeout_s,
                                stop_grace_s=self.stop_grace_s, data_dir=data_dir,
                                lease_s=self.lease_s)
        self.deployments.append(deployment)
        self.control.attach(chief)
        if self.rec is not None:
            self.rec.event(results.EVENT_START,
                           roles={r.value: len(self.cluster.hosts_for(r)) for r in Role})
        deployment.start()
        killpoints.hit("deploy")
        if self.rec is not None:
            self.rec.event(EVENT_READY)
        return deployment

    def _on_chief(self, call: Callable[[], T]) -> T:
        """`call` (on the chief's machine, e.g. its first login) while the provider is polled,
        as within the deployment (`deploy.run_polling`); its failure on a machine the provider
        calls gone is that machine's loss (MachinesLostError)."""
        chief = self.cluster.hosts_for(Role.CHIEF)[0]
        result: list[T] = []
        errors = run_polling(self.provider, self.cluster, {chief: lambda: result.append(call())})
        if errors:
            raise_if_lost(self.provider, self.cluster, errors)
            raise errors[chief]
        return result[0]

    def start_role(self, host: Host) -> None:
        """Start `host`'s role in the running deployment (a replacement, or a process that
        crashed on a host that still runs)."""
        self.deployment.start_role(host, self.cluster)

    # --- changing hosts -----------------------------------------------------------------------
    def poll(self) -> dict[HostId, HostState]:
        """One provider call for the whole cluster."""
        return self.provider.poll(self.cluster)

    def state_lag_s(self) -> float:
        """How late the provider's poll may learn that a host was taken (`Provider.state_lag_s`)."""
        return self.provider.state_lag_s()

    def replace(self, host_ids: Sequence[HostId], keep_endpoints: bool = True) -> list[Host]:
        """Swap these hosts (and any sharing their machines) for fresh ones in the same slots;
        return the new hosts. Raises what `provider.replace` raises (the cluster is then
        unchanged)."""
        old_ids = {h.id for h in self.cluster.hosts}
        self.cluster = self.provider.replace(self.cluster, list(host_ids), keep_endpoints)
        if self.deployments:  # none yet when the first deployment lost the chief's machine
            self.deployment.cluster = self.cluster
        return [h for h in self.cluster.hosts if h.id not in old_ids]

    def drop(self, host_ids: Sequence[HostId]) -> None:
        """Leave these hosts (and any sharing their machines) out of the cluster: workers lost
        before training under `on_revocation=shrink`. The next deployment's spec no longer
        names them (TensorFlow's cluster cannot start with a task that never comes up); they
        stay the provider's until `release`."""
        ids = set(self.cluster.same_machine(list(host_ids)))
        self.dropped += [h for h in self.cluster.hosts if h.id in ids]
        self.cluster = dataclasses.replace(
            self.cluster, hosts=[h for h in self.cluster.hosts if h.id not in ids])
        if self.deployments:
            self.deployment.cluster = self.cluster

    def begin_replace(self, host_ids: Sequence[HostId]) -> None:
        """`replace` in a background thread, with each new machine's `runner.setup()`: on a
        real cloud a VM takes minutes to create, boot and set up, and the supervisor keeps
        following events, polls and checkpoint syncs meanwhile. One at a time; the cluster
        changes only when `finish_replace` hands the new hosts over; the running deployment's
        `next_event` is woken when it is done, so the supervisor starts their roles at once."""
        assert self._replacing is None, "a replacement is already under way"
        self._replacing = _Replacement(self.provider, self.cluster, list(host_ids),
                                       self._wake)

    def _wake(self) -> None:
        if self.deployments:
            self.deployment.wake()

    @property
    def replacing(self) -> bool:
        """True from `begin_replace` until `finish_replace` has handed the hosts over."""
        return self._replacing is not None

    def finish_replace(self, wait: bool = False) -> list[Host] | None:
        """The new hosts of the background replacement once it is done (the cluster now holds
        them), None while it runs (`wait`: block until it is done). Raises what
        `provider.replace` or a setup raised (the cluster is then unchanged)."""
        job = self._replacing
        if job is None or not job.finished(wait):
            return None
        self._replacing = None
        if job.new is None:  # provider.replace failed: nothing of it stays allocated
            assert job.error is not None
            raise job.error
        old_ids = {h.id for h in self.cluster.hosts}
        self.cluster = job.new  # a failed setup still hands the hosts over, to be released
        if self.deployments:
            self.deployment.cluster = job.new
        if job.error is not None:
            raise job.error
        return [h for h in job.new.hosts if h.id not in old_ids]

    def revoke(self, host: Host, notice_s: float) -> None:
        self.provider.revoke(host, notice_s)

    def stop_roles(self) -> None:
        """Stop every role (TensorBoard fetched first); the hosts stay."""
        if self.deployments:
            self.deployment.collect()
            self.deployment.teardown()

    def restart(self, replace_ids: Sequence[HostId]) -> list[Host]:
        """Restart every role from the checkpoint store: stop what still runs, replace the
        given hosts and every host that is not RUNNING (any endpoint will do: the new spec
        names the new ones), then deploy. Returns the new hosts. Raises CapacityError,
        DeployError, HostLostError: the caller counts a failed attempt."""
        self.stop_roles()
        gone, keep_endpoints = hosts_to_replace(self.cluster, self.poll(), replace_ids,
                                                restart=True)
        new_hosts = self.replace(gone, keep_endpoints) if gone else []
        self.control.reset()
        self.deploy()
        return new_hosts

    def sync_checkpoints(self) -> None:
        """Make the chief's latest checkpoint (and `DONE`) durable, and hand it to evaluators
        on other machines than the chief's, which read checkpoints on their own host."""
        killpoints.hit("checkpoint_sync")
        # lost, or out of contact past the wait: the next checkpoint syncs again
        with contextlib.suppress(ProvisionError, IndexError, OSError):
            chief = self.chief_runner()
            if not self.store.sync(chief):
                return
            for host in self.cluster.hosts_for(Role.EVALUATOR):
                if host.machine != chief.host.machine:
                    self.store.before_start(self.provider.runner(host))

    # --- the end ------------------------------------------------------------------------------
    def release(self) -> None:
        """TensorBoard back, every process stopped, every host released (a replacement still
        being provisioned is waited for, so its hosts are released too). Idempotent."""
        with contextlib.suppress(Exception):  # failed: the provider gave back what it made
            self.finish_replace(wait=True)
        if self.deployments:
            with contextlib.suppress(Exception):  # a host gone mid-fetch must not block release
                self.deployment.collect()
        for deployment in self.deployments:
            deployment.teardown()
        self.provider.release(dataclasses.replace(
            self.cluster, hosts=[*self.cluster.hosts, *self.dropped]))



class _Replacement:
    """`provider.replace(cluster, host_ids)` and the new machines' setup, in a thread;
    `on_done()` once it is over, whatever the outcome."""

    def __init__(self, provider: Provider, cluster: Cluster, host_ids: list[HostId],
                 on_done: Callable[[], None]) -> None:
        self._provider, self._cluster, self._ids = provider, cluster, host_ids
        self._on_done = on_done
        self.new: Cluster | None = None  # what provider.replace returned
        self.error: BaseException | None = None  # what provider.replace or a setup raised
        self._done = threading.Event()  # set before `on_done`: the woken caller finds it over
        self._thread = threading.Thread(target=self._work, name="replace-hosts", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            self.new = self._provider.replace(self._cluster, self._ids)
            old_ids = {h.id for h in self._cluster.hosts}
            machines = {h.machine: h for h in self.new.hosts if h.id not in old_ids}
            for host in machines.values():  # the costly part of starting a role there
                self._provider.runner(host).setup()
        except BaseException as error:  # handed to the supervisor by `Fleet.finish_replace`
            self.error = error
        finally:
            self._done.set()
            self._on_done()

    def finished(self, wait: bool) -> bool:
        if wait:
            self._thread.join()
        return self._done.is_set()
