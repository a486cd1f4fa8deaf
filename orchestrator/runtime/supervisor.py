"""Deploy a run and follow it to its end: trainer events, host losses, injected revocations,
recovery, stragglers and the online sync policy. A machine lost during the first deployment
(`Supervisor.deploy`) is decided by the same recovery policies as any later loss.

One loop, one thread. Each turn handles at most one trainer event, then a tick (every TICK_S,
and at once when a recovery decision is due or the background replacement woke the loop: a
lost worker's replacement process starts milliseconds after its exit, not ticks later):

1. the provider is polled for the whole cluster, once per POLL_INTERVAL_S (one API call,
   whatever the cluster's size): hosts that left RUNNING become losses, deduplicated against
   process exits, with the cause the provider reports (REVOKED = revoked, else crashed);
   process exits whose cause the provider has not yet given are decided (see below);
2. revocations whose time or step has come → ``fleet.revoke`` (with the configured notice);
3. recovery decisions whose time has come → replace workers / restart from a checkpoint, and a
   restart attempt that did not resume training before its deadline fails (another attempt);
4. straggler injection episodes starting or ending → events;
5. the sync policy → the control file, when it wants another protocol.

The cause of a loss comes from the cloud (the provider's poll) or from the injected revocation
schedule, whichever says so first, never from the order in which the signals arrive: a process
that dies unexpectedly on a host the provider still calls RUNNING is *held* until the provider
has had time to answer (`Provider.state_lag_s`, plus one poll); it is a revocation if the
provider then reports the host REVOKED (or our schedule revoked it), a crash otherwise. So
``revocations`` in the summary counts the preemptions that happened, on every backend.

The recovery policies decide; the supervisor acts through the :class:`Fleet`, the one owner of
the current cluster. Every trainer event is recorded with the orchestrator's receipt time
(``time``) and the role's own clock as ``role_time``; run time is measured on the receipt
clock. The clock (``now_s``) is seconds since the chief's first ``train_start``; before it,
seconds since the supervisor started. Every event the supervisor records is folded into
``run_state`` (:class:`~orchestrator.rundir.record.RunState`, the one record of the run's
numbers, which ``summarize`` turns into the summary); the supervisor reads it and never edits it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import killpoints
from orchestrator.config.schema import ExperimentConfig
from orchestrator.rundir import results
from orchestrator.rundir.record import RunState
from orchestrator.runtime.control import ControlChannel
from orchestrator.runtime.deploy import (
    EVENT_PROCESS_EXIT,
    DeployError,
    MachinesLostError,
    TrainerEvent,
)
from orchestrator.runtime.fleet import Fleet
from orchestrator.runtime.progress import RunProgress
from orchestrator.transient import stragglers
from orchestrator.transient.recovery import (
    EVENT_REVOCATION_NOTICE,
    Action,
    HostLoss,
    LossCause,
    RecordedEvent,
    RecoveryDecision,
    RecoveryPlanner,
    TrainingProgress,
    hosts_to_replace,
)
from orchestrator.transient.revocation import RevocationSchedule
from orchestrator.transient.silence import ChiefWatch, watch_chief
from provisioning.base import Cluster, Host, HostId, HostState, ProvisionError, Role
from trainer import events, layout

TICK_S = 0.2  # longest wait for a trainer event before the periodic checks run
#: How often the provider is asked about the whole cluster (one `poll(cluster)` call). A lost
#: host whose processes do not exit (a preempted VM, a cut link) is noticed within this, plus
#: what the backend itself needs to notice it.
POLL_INTERVAL_S = 1.0
FINAL_EVAL_TIMEOUT_S = 120.0  # how long the evaluator may take after the chief is done
# After a PS's preemption notice the chief checkpoints this long (or 2x the last checkpoint's
# duration) before the deadline: late enough to lose few steps, early enough to finish.
NOTICE_MARGIN_S = 1.0
# A run preempted by its sweep's queue waits this long for the checkpoint it asks for
STOP_CHECKPOINT_TIMEOUT_S = 60.0


@dataclass
class LoopState:
    """What the loop itself needs to know to end: the run's numbers are in ``run_state``."""

    start_time: float = field(default_factory=time.time)
    chief_done: bool = False
    evaluator_done: bool = False
    error: str | None = None


class Supervisor:
    """Runs the loop above for one run on `fleet` (which owns the cluster and its roles).

    A restart attempt must see the chief's ``train_start`` within ``restart_timeout_s`` (None
    = the provider's ``ready_timeout_s``) of its roles being started; a role that exits first,
    a restart that raises, or the deadline passing closes the attempt as failed and decides its
    losses again, so a restart never hangs and never ends the run while restarts are left."""

    def __init__(self, cfg: ExperimentConfig, fleet: Fleet, rec: results.RunRecorder,
                 progress: RunProgress, control: ControlChannel,
                 revocations: RevocationSchedule, restart_timeout_s: float | None = None,
                 poll_interval_s: float = POLL_INTERVAL_S) -> None:
        self.cfg, self.fleet, self.rec, self.progress, self.control, self.revocations = (
            cfg, fleet, rec, progress, control, revocations)
        self.state = LoopState()
        self.run_state = RunState()  # the fold of every event recorded (rundir/record.py)
        self.planner = RecoveryPlanner(cfg.cluster.recovery)
        self.injections = stragglers.InjectionSchedule(cfg.straggler.injections,
                                                       cfg.straggler.enabled)
        self.detector = stragglers.StragglerDetector.from_config(cfg.straggler.detection)
        self.chief_watch = ChiefWatch.from_config(cfg)  # a training chief's silence (silence.py)
        self.policy = stragglers.get_sync_policy(cfg.sync.policy)
        self.restart_timeout_s = (cfg.provider.ready_timeout_s if restart_timeout_s is None
                                  else restart_timeout_s)
        self.poll_interval_s = poll_interval_s
        self.pending: list[RecoveryDecision] = []
        self.awaiting_restart: RecoveryDecision | None = None
        # the decision whose new hosts are provisioned in the background (Fleet.begin_replace)
        self.replacing: RecoveryDecision | None = None
        self.restart_deadline = 0.0  # monotonic
        self.lost: set[HostId] = set()  # hosts already turned into losses (dedup)
        self.revoked_here: set[HostId] = set()  # hosts our revocation schedule took
        # unexpected exits whose cause the provider has not given yet: host -> (exit, deadline)
        self.held: dict[HostId, tuple[TrainerEvent, float]] = {}
        self.states: dict[HostId, HostState] = {}  # the provider's answer at the last poll
        self.next_poll = 0.0  # monotonic
        self.noticed_ids: set[str] = set()  # hosts we sent a preemption notice ourselves
        self.checkpoint_at: list[float] = []  # run seconds at which to ask for a checkpoint
        self.injected: set[int] = set()
        self.schedule_protocol: str | None = None  # the phase schedule's protocol now

    @property
    def cluster(self) -> Cluster:
        """The fleet's current cluster (never a copy)."""
        return self.fleet.cluster

    # --- clock and records -------------------------------------------------------------------
    def now_s(self) -> float:
        return time.time() - (self.run_state.train_t0 or self.state.start_time)

    def emit(self, kind: str, **fields: Any) -> None:
        """Record an event and fold it into ``run_state``."""
        self.run_state.apply(self.rec.event(kind, **fields))

    def record(self, events: Any) -> None:
        for event in events if isinstance(events, list | tuple) else [events]:
            if isinstance(event, RecordedEvent):
                self.emit(event.kind, **event.fields)

    # --- the first deployment ----------------------------------------------------------------
    def deploy(self) -> None:
        """Deploy the roles for the first time. A machine lost while it is set up or its roles
        start (a Spot VM preempted before the first step: `MachinesLostError`) is a loss like
        any later one, decided by the same policies: a worker is replaced or the cluster
        shrinks without it (`cluster.recovery.on_revocation`; no capacity for a replacement
        shrinks it too), a PS's or the chief's machine is re-acquired (a restart from
        checkpoint, at step 0: it counts against `max_restarts`); then the roles are deployed
        again on the cluster that results. Sets `state.error` when recovery gives up."""
        while self.state.error is None:
            try:
                self.fleet.deploy()
                self.state.start_time = time.time()  # the loop's clock starts with the roles
                return
            except MachinesLostError as lost:
                self.fleet.stop_roles()  # what the failed deployment started elsewhere
                self.recover_before_training(lost.hosts)

    def recover_before_training(self, hosts: list[Host]) -> None:
        """Decide and execute the losses of `hosts` while nothing trains (see `deploy`): no
        background replacement, no roles to restart, the policies' delays waited out."""
        self.refresh_states()
        losses = [self.loss_of(h) for h in hosts]
        queue = self.planner.decide(losses, self.progress_now(losses), self.now_s())
        while queue and self.state.error is None:
            decision = queue.pop(0)
            self.record(list(decision.events))
            if decision.action == Action.fail:
                self.state.error = decision.reason
                return
            time.sleep(max(0.0, decision.execute_at_s - self.now_s()))
            if decision.action == Action.proceed:  # shrink: the next spec names them no more
                self.fleet.drop([loss.host_id for loss in decision.losses])
                continue
            restart = decision.action == Action.restart
            ids, keep = hosts_to_replace(self.cluster, self.refresh_states(),
                                         decision.replace_host_ids, restart=restart)
            try:
                new_hosts = self.fleet.replace(ids, keep) if ids else []
            except ProvisionError as ex:
                reason = f"{type(ex).__name__}: {ex}"
                if restart:  # another attempt while max_restarts allows, else the failure
                    self.record(self.planner.attempt_failed(decision, reason, self.now_s()))
                    lost = list(decision.losses)
                    queue.insert(0, self.planner.retry_restart(lost, self.progress_now(lost),
                                                               self.now_s()))
                else:  # no capacity for a worker: the cluster shrinks instead
                    self.replace_failed(decision, ex)
                    self.fleet.drop(ids)
                    if not self.cluster.hosts_for(Role.WORKER):
                        self.state.error = (f"every worker was lost before training and none "
                                            f"could be replaced: {reason}")
                continue
            self.replaced(decision, self.now_s(), new_hosts)

    # --- the loop ----------------------------------------------------------------------------
    def follow(self) -> None:
        """Return when the run is done (state.error None) or failed (state.error set)."""
        eval_deadline: float | None = None
        next_tick = 0.0
        while self.state.error is None:
            event = self.fleet.deployment.next_event(self.due_in())
            if event is not None:
                self.handle(event)
            if time.monotonic() >= next_tick or event is None or self.due_in() == 0:
                self.tick()
                next_tick = time.monotonic() + TICK_S
            if self.pending or self.awaiting_restart or self.held or self.replacing:
                continue
            state = self.state
            if state.chief_done and (state.evaluator_done or not self.cfg.cluster.evaluator):
                return
            if state.chief_done and eval_deadline is None:
                eval_deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
            if eval_deadline is not None and time.monotonic() > eval_deadline:
                state.error = "evaluator did not report the final accuracy in time"

    def checkpoint_before_stop(self, timeout_s: float = STOP_CHECKPOINT_TIMEOUT_S) -> int | None:
        """Before a stop that will be resumed (the sweep's queue preempts the run): ask the
        chief for a checkpoint now and wait until it is written and synced to the store (the
        ``checkpoint`` event's handling), so the resumed run loses no steps. The step saved;
        None when training had not started, was over, or no checkpoint came in ``timeout_s``
        (the run then resumes from the last periodic one). Only steps, checkpoints, evals and
        the training's end are acted on meanwhile; other events are recorded (no recovery
        starts now)."""
        state = self.state
        if self.run_state.train_t0 is None or state.chief_done or self.awaiting_restart:
            return None
        self.control.request_checkpoint()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            event = self.fleet.deployment.next_event(TICK_S)
            if event is None:
                continue
            if event.kind in (events.EVENT_STEP, events.EVENT_CHECKPOINT, events.EVENT_EVAL,
                              events.EVENT_TRAIN_END):
                self.handle(event)  # a checkpoint or the end: synced to the store
            else:
                self.emit(event.kind, role=event.role, time_s=event.received,
                          index=event.index, role_time=event.time, **event.fields)
            if event.role != Role.CHIEF:
                continue
            if event.kind == events.EVENT_CHECKPOINT and event.fields.get("reason") == "control":
                return int(event.fields.get("step") or 0)
            if event.kind in (EVENT_PROCESS_EXIT, events.EVENT_TRAIN_END):
                return None
        return None

    # --- trainer events ----------------------------------------------------------------------
    def handle(self, event: TrainerEvent) -> None:
        """A trainer event: record it (folded into ``run_state``), then act on it."""
        fields, state, run = event.fields, self.state, self.run_state
        at = event.received  # the orchestrator's clock; the role's stays in role_time
        self.emit(event.kind, role=event.role, time_s=at, index=event.index,
                  role_time=event.time, **fields)
        wall, kind = at - state.start_time, event.kind
        self.chief_watch.heard(event.role, kind, fields)
        if kind == events.EVENT_TRAIN_START:
            self.progress.status("training")
            if self.awaiting_restart is not None:
                decision = self.awaiting_restart
                # the new chief skipped a damaged checkpoint (checkpoint_skipped): the steps
                # after the one it used are lost too (the fold counts them as well)
                resumed = int(fields.get("step") or 0)
                if decision.resume_step is not None and resumed < decision.resume_step:
                    extra = decision.resume_step - resumed
                    decision = replace(decision, resume_step=resumed,
                                       lost_steps=decision.lost_steps + extra)
                self.record(self.planner.end(decision, self.now_s()))
                self.awaiting_restart = None
        elif kind == events.EVENT_STEP:
            if event.role == Role.CHIEF:
                killpoints.hit("train_step")
            self.rec.metric(wall, int(fields.get("step", 0)), run.last_steps_per_sec,
                            run.last_loss)
            self.progress.update(run.global_step, run.last_steps_per_sec, run.last_loss)
        elif kind == events.EVENT_EVAL:
            self.rec.metric(wall, int(fields.get("step", 0)), eval_accuracy=run.final_accuracy)
            self.progress.update(accuracy=run.final_accuracy)
            state.evaluator_done = state.evaluator_done or bool(fields.get("final"))
        elif kind == events.EVENT_CHECKPOINT:
            self.fleet.sync_checkpoints()  # durable before a loss can take the chief's host
        elif kind == events.EVENT_PHASE_START:  # protocol: in force now; scheduled: the phase's own
            self.schedule_protocol = str(fields.get("scheduled", fields.get("protocol")))
        elif kind == events.EVENT_TRAIN_END:  # the chief wrote DONE just before
            self.fleet.sync_checkpoints()
            killpoints.hit("final_eval")  # the evaluator's final accuracy is still to come
            self.progress.update(run.global_step)
        elif kind in (events.EVENT_WORKER_STEPS, events.EVENT_PS_UNRESPONSIVE,
                      events.EVENT_PS_RESPONSIVE):
            self.record(stragglers.judge_trainer_event(self.detector, kind, fields, self.now_s()))
        elif kind == events.EVENT_PREEMPTION_NOTICE and event.role == Role.PS and \
                fields.get("host_id") not in self.noticed_ids:
            # a notice we did not send (a cloud's own preemption): checkpoint now
            self.control.request_checkpoint()
        elif kind == events.EVENT_FAILURE and fields.get("error_kind") == events.DISK_FULL \
                and state.error is None:
            # before its process exit reaches recovery: a restart would fill the same disk
            state.error = events.disk_full_line(f"{event.role} {event.index}", fields.get("path"),
                                                fields.get("free_bytes"))
        elif kind == events.EVENT_FAILURE and event.role == Role.EVALUATOR and state.error is None \
                and self.awaiting_restart is None:
            # chief, PS and worker failures are handled by recovery when their process exits
            state.error = f"{event.role} {event.index}: {fields.get('error')}"
        elif kind == EVENT_PROCESS_EXIT:
            self.on_exit(event)

    def on_exit(self, event: TrainerEvent, held: bool = False) -> None:
        """A role's process exited. Unexpected: its host's loss is decided now, or held for
        the provider's word on the cause (:meth:`hold`); ``held`` True: the hold is over."""
        fields, state = event.fields, self.state
        code = fields.get("exit_code")
        if fields.get("expected", True):
            if event.role == Role.CHIEF and code == 0:
                state.chief_done = True
            if event.role == Role.EVALUATOR and code == 0:
                state.evaluator_done = True
            return
        try:
            host = self.cluster.host(str(fields.get("host_id", "")))
        except KeyError:
            return  # a host already replaced out of the cluster
        if self.awaiting_restart is not None:  # the restarted cluster lost a role: next attempt
            self.fail_attempt(f"{event.role} {event.index} exited with code {code} before "
                              f"training resumed", [host])
            return
        if any(d.action == Action.restart for d in self.pending) or host.id in self.lost:
            return  # the restart under way re-deploys every role / already a known loss
        self.refresh_states()
        if not held and self.hold(host, event):
            return
        if event.role == Role.CHIEF and code == layout.EXIT_PS_UNAVAILABLE:
            hosts = [h for h in self.cluster.hosts_for(Role.PS) if not self.running(h)] or [host]
        else:
            hosts = [host]
        hosts += [h for h in self.cluster.hosts  # whatever else its machine took down
                  if h.machine == host.machine and h not in hosts and not self.running(h)]
        self.decide(hosts)

    # --- hosts and losses --------------------------------------------------------------------
    def hold(self, host: Host, event: TrainerEvent) -> bool:
        """Whether the exit of a role on ``host`` waits for the provider: the host still
        RUNNING by its last answer, not revoked by our schedule, and a provider whose answer
        may lag (a GCE listing is up to `poll_interval_s` old when a preempted VM's processes
        are seen dead over SSH). The first signal must not decide the cause."""
        if host.id in self.held:
            return True
        lag = self.fleet.state_lag_s()
        if lag <= 0 or not self.running(host) or host.id in self.revoked_here:
            return False
        self.held[host.id] = (event, time.monotonic() + lag + self.poll_interval_s)
        return True

    def release_held(self) -> None:
        """Decide the held exits the provider has answered for (the host left RUNNING: a
        poll made it a loss with the provider's cause, or will now) or whose wait is over
        (still RUNNING: a crash)."""
        for host_id, (event, deadline) in list(self.held.items()):
            host = next((h for h in self.cluster.hosts if h.id == host_id), None)
            if host is not None and host_id not in self.lost and self.running(host) \
                    and time.monotonic() < deadline:
                continue
            del self.held[host_id]
            if host is not None and host_id not in self.lost:
                self.on_exit(event, held=True)

    def refresh_states(self) -> dict[HostId, HostState]:
        """Ask the provider about the whole cluster (one call) and remember the answer."""
        self.states = self.fleet.poll()
        self.next_poll = time.monotonic() + self.poll_interval_s
        return self.states

    def running(self, host: Host) -> bool:
        return self.states.get(host.id, HostState.RUNNING) == HostState.RUNNING

    def loss_of(self, host: Host) -> HostLoss:
        state = self.states.get(host.id, HostState.RUNNING)
        revoked = state == HostState.REVOKED or host.id in self.revoked_here
        cause = LossCause.revoked if revoked else LossCause.crashed
        return HostLoss(host.id, host.spec.name, host.role, self.now_s(), cause,
                        host_gone=state != HostState.RUNNING or revoked)

    def progress_now(self, losses: list[HostLoss]) -> TrainingProgress:
        lost = {loss.host_id for loss in losses} | self.lost
        alive = sum(1 for h in self.cluster.hosts_for(Role.WORKER)
                    if h.id not in lost and self.running(h))
        return TrainingProgress(self.run_state.global_step,
                                self.run_state.last_checkpoint_step, alive)

    def decide(self, hosts: list[Host]) -> None:
        losses = [self.loss_of(h) for h in hosts]
        self.lost.update(h.id for h in hosts)
        for decision in self.planner.decide(losses, self.progress_now(losses), self.now_s()):
            self.apply(decision)

    def apply(self, decision: RecoveryDecision) -> None:
        self.record(list(decision.events))
        for loss in decision.losses:
            if loss.role == Role.WORKER:
                self.record(self.detector.forget(self.cluster.index_of(
                    self.cluster.host(loss.host_id)), self.now_s()))
        if decision.action == Action.fail:
            self.state.error = decision.reason
        elif decision.action == Action.restart:
            self.progress.status("restarting from checkpoint")
            self.fleet.stop_roles()
            self.detector.release()  # the new chief's heartbeat starts afresh
            self.held.clear()  # the restart re-deploys every role and replaces gone hosts
            self.state.chief_done = self.state.evaluator_done = False
            self.pending.append(decision)
        elif decision.action == Action.replace:
            self.pending.append(decision)

    def poll_losses(self) -> None:
        """Hosts that left RUNNING since the last poll, and were not already losses."""
        self.refresh_states()
        gone = [h for h in self.cluster.hosts if not self.running(h) and h.id not in self.lost]
        if not gone:
            return
        if self.awaiting_restart is not None:
            self.fail_attempt("a host was lost before training resumed: "
                              + ", ".join(h.spec.name for h in gone), gone)
        elif any(d.action == Action.restart for d in self.pending):
            return  # the restart replaces every host that is not running
        else:
            self.decide(gone)

    def fail_attempt(self, reason: str, hosts: list[Host]) -> None:
        """Close the restart attempt under way as failed and decide again: another attempt
        (while max_restarts allows) or the run's failure."""
        decision, self.awaiting_restart = self.awaiting_restart, None
        assert decision is not None
        self.record(self.planner.attempt_failed(decision, reason, self.now_s()))
        self.fleet.stop_roles()
        self.refresh_states()
        hosts = hosts + [h for h in self.cluster.hosts if not self.running(h) and h not in hosts]
        losses = [self.loss_of(h) for h in hosts or self.cluster.hosts_for(Role.CHIEF)]
        self.lost.update(loss.host_id for loss in losses)
        self.apply(self.planner.retry_restart(losses, self.progress_now(losses), self.now_s()))

    # --- periodic checks ---------------------------------------------------------------------
    def due_in(self) -> float:
        """Seconds until a pending recovery decision may be executed, TICK_S at most (0: now;
        none while a replacement is under way: one change of hosts at a time). The loop waits
        no longer for an event, and ticks at once when one is due."""
        if self.replacing is not None or not self.pending:
            return TICK_S
        first = min(d.execute_at_s for d in self.pending)
        return min(TICK_S, max(0.0, first - self.now_s()))

    def tick(self) -> None:
        now = self.now_s()
        if time.monotonic() >= self.next_poll:
            self.poll_losses()
        if self.held:
            self.release_held()
        if self.awaiting_restart is not None and time.monotonic() > self.restart_deadline:
            self.fail_attempt(f"training did not resume within {self.restart_timeout_s:g} s "
                              f"of the restart", [])
        watch_chief(self)  # a training chief silent too long is killed: its exit restarts it
        if self.run_state.train_t0 is not None and not self.awaiting_restart:
            self.fire_revocations(now)
            self.request_due_checkpoints(now)
        if self.replacing is not None:
            self.finish_replace()
        for decision in [d for d in self.pending if d.execute_at_s <= now]:
            if self.replacing is not None:
                break  # one change of hosts at a time: it waits for the one under way
            self.pending.remove(decision)
            self.execute(decision, now)
            if self.state.error is not None:
                return
        if self.run_state.train_t0 is not None:
            self.track_injections(now)
            self.apply_policy(now)

    def fire_revocations(self, now: float) -> None:
        alive = [h.spec.name for h in self.cluster.hosts if self.running(h)]
        for event in self.revocations.due(now, self.run_state.global_step, alive):
            host = next(h for h in self.cluster.hosts if h.spec.name == event.host_name)
            # the schedule is the cause of whatever this takes down (the machine's other roles)
            self.revoked_here.update(self.cluster.same_machine([host.id]))
            if event.notice_s > 0:
                self.emit(EVENT_REVOCATION_NOTICE, host=host.spec.name, host_id=host.id,
                          role=str(host.role), notice_s=event.notice_s)
                self.noticed_ids.add(host.id)
                if host.role == Role.PS:  # save what the PS holds as late as is safe
                    margin = max(NOTICE_MARGIN_S, 2 * self.run_state.last_checkpoint_s)
                    self.checkpoint_at.append(now + max(0.0, event.notice_s - margin))
            self.fleet.revoke(host, event.notice_s)

    def request_due_checkpoints(self, now: float) -> None:
        due = [t for t in self.checkpoint_at if t <= now]
        if due:
            self.checkpoint_at = [t for t in self.checkpoint_at if t > now]
            self.control.request_checkpoint()

    def execute(self, decision: RecoveryDecision, now: float) -> None:
        killpoints.hit("recovery")
        if decision.action == Action.replace:
            self.execute_replace(decision, now)
        else:
            self.execute_restart(decision, now)

    def execute_replace(self, decision: RecoveryDecision, now: float) -> None:
        """Fresh hosts for the gone ones, provisioned off the loop (`finish_replace` starts
        their roles); a role that crashed on a host still running is started again there at
        once (replacing it would take its machine's other roles down). A replacement keeps
        the lost hosts' endpoints (`hosts_to_replace`), as `Fleet.begin_replace` does."""
        ids, _ = hosts_to_replace(self.cluster, self.refresh_states(),
                                  decision.replace_host_ids, restart=False)
        in_place = [self.cluster.host(i) for i in ids if self.running(self.cluster.host(i))
                    and i not in self.revoked_here]  # a revoked host is never reused
        gone = [i for i in ids if i not in {h.id for h in in_place}]
        try:
            self.start_roles(in_place)
        except (ProvisionError, OSError) as ex:
            self.replace_failed(decision, ex)
            return
        if gone:  # new hosts take minutes on a cloud: the loop goes on meanwhile
            self.fleet.begin_replace(gone)
            self.replacing = decision
        else:
            self.replaced(decision, now, [])

    def finish_replace(self) -> None:
        """Start the roles on the background replacement's hosts once they are ready (not
        when a restart is pending, which deploys every role, nor after training ended)."""
        decision = self.replacing
        assert decision is not None
        try:
            new_hosts = self.fleet.finish_replace()
            if new_hosts is None:
                return  # still provisioning
            self.replacing = None
            if not (self.state.chief_done
                    or any(d.action == Action.restart for d in self.pending)):
                self.start_roles(new_hosts)
        except (ProvisionError, OSError) as ex:
            self.replacing = None
            self.replace_failed(decision, ex)
            return
        self.replaced(decision, self.now_s(), new_hosts)

    def start_roles(self, hosts: list[Host]) -> None:
        for host in hosts:
            self.fleet.start_role(host)
            self.lost.discard(host.id)
            self.revoked_here.discard(host.id)  # running again: a later loss is new

    def replace_failed(self, decision: RecoveryDecision, ex: BaseException) -> None:
        self.record(self.planner.replacement_failed(decision, f"{type(ex).__name__}: {ex}"))
        self.record(self.planner.end(decision, self.now_s(), ok=False))

    def replaced(self, decision: RecoveryDecision, now: float, new_hosts: list[Host]) -> None:
        for host in new_hosts:
            self.revocations.on_replacement(host.spec.name, now)
        self.record(self.planner.replaced(decision, new_hosts, now))
        self.record(self.planner.end(decision, self.now_s()))

    def execute_restart(self, decision: RecoveryDecision, now: float) -> None:
        """Every role again on the current hosts (gone ones replaced); the chief resumes from
        the checkpoint store. Pending worker replacements are done by this too."""
        self.awaiting_restart = decision
        try:
            new_hosts = self.fleet.restart(decision.replace_host_ids)
        except (DeployError, ProvisionError, OSError) as ex:
            gone = [h for h in self.cluster.hosts if not self.running(h)]
            self.fail_attempt(f"restart failed: {type(ex).__name__}: {ex}", gone)
            return
        self.restart_deadline = time.monotonic() + self.restart_timeout_s
        self.lost = set()  # a fresh deployment: every host is watched again
        self.revoked_here = set()
        self.refresh_states()
        for host in new_hosts:
            self.revocations.on_replacement(host.spec.name, now)
        self.record(self.planner.replaced(decision, new_hosts, now))
        for other in [d for d in self.pending if d.action == Action.replace]:
            self.pending.remove(other)
            self.record(self.planner.end(other, now))

    def track_injections(self, now: float) -> None:
        delays = self.injections.delays_at(now, self.run_state.global_step)
        for worker in sorted(set(delays) - self.injected):
            self.emit(stragglers.EVENT_STRAGGLER_INJECTION_START, worker=worker,
                      delay_s=delays[worker])
        for worker in sorted(self.injected - set(delays)):
            self.emit(stragglers.EVENT_STRAGGLER_INJECTION_END, worker=worker)
        self.injected = set(delays)

    def apply_policy(self, now: float) -> None:
        if self.schedule_protocol is None:
            return
        decision = self.policy.decide(now, self.schedule_protocol, self.detector.stragglers)
        if decision.event is not None:
            self.record(decision.event)
        if decision.changed:
            self.control.set_protocol(decision.protocol if decision.override else None)
