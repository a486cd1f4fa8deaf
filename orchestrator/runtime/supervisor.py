"""Follow a deployed run to its end: trainer events, injected revocations, recovery, stragglers
and the online sync policy.

One loop, one thread (the main one: the local provider ties its children's lifetime to the
thread that starts them). Each turn handles at most one trainer event, then a tick:

1. revocations whose time or step has come → ``provider.revoke`` (with the configured notice);
2. recovery decisions whose time has come → replace workers / restart from a checkpoint;
3. straggler injection episodes starting or ending → events;
4. the sync policy → the control file, when it wants another protocol.

The clock (``now_s``) is seconds since the chief's first ``train_start``; before it, seconds
since the supervisor started. Trainer events update :class:`RunState`, whose fields become the
summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import results
from orchestrator.config.schema import ExperimentConfig
from orchestrator.runtime.control import ControlChannel
from orchestrator.runtime.deploy import EVENT_PROCESS_EXIT, Deployment, TrainerEvent
from orchestrator.runtime.progress import RunProgress
from orchestrator.transient.recovery import (
    EVENT_REPLACEMENT_READY,
    Action,
    HostLoss,
    LossCause,
    RecordedEvent,
    RecoveryDecision,
    RecoveryPlanner,
    TrainingProgress,
)
from orchestrator.transient.revocation import RevocationSchedule
from orchestrator.transient.stragglers import InjectionSchedule, StragglerDetector, get_sync_policy
from provisioning.base import Cluster, Host, HostState, Provider, Role

TICK_S = 0.2  # longest wait for a trainer event before the periodic checks run
FINAL_EVAL_TIMEOUT_S = 120.0  # how long the evaluator may take after the chief is done
PS_LOSS_EXIT_CODE = 3  # the chief's exit code when it lost a parameter server
# After a PS's preemption notice the chief checkpoints this long (or 2x the last checkpoint's
# duration) before the deadline: late enough to lose few steps, early enough to finish.
NOTICE_MARGIN_S = 1.0


@dataclass
class RunState:
    """What the event stream has told us so far."""

    start_time: float = field(default_factory=time.time)
    train_t0: float | None = None  # first train_start: the clock of revocations and stragglers
    global_step: int = 0
    train_start: float | None = None
    train_time_s: float | None = None
    last_loss: float | None = None
    last_sps: float | None = None
    final_accuracy: float | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_s: float = 0.0  # how long the last checkpoint took
    protocol: str | None = None  # what the chief runs now
    chief_done: bool = False
    evaluator_done: bool = False
    error: str | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    switch_overhead_s: float = 0.0
    stragglers_detected: int = 0
    stragglers_injected: int = 0
    open_phase: dict[str, Any] | None = None

    def open(self, protocol: str, step: int, when: float) -> None:
        self.close(step, when)
        self.open_phase = {"protocol": protocol, "start_step": step, "t": when}
        self.protocol = protocol

    def close(self, step: int, when: float, wall_s: float | None = None) -> None:
        if self.open_phase is None:
            return
        p = self.open_phase
        self.phases.append({"protocol": p["protocol"], "start_step": p["start_step"],
                            "end_step": step,
                            "wall_s": round(wall_s if wall_s is not None else when - p["t"], 3)})
        self.open_phase = None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


class Supervisor:
    """Runs the loop above for one run. ``restart_cluster`` re-deploys every role on a cluster
    (the caller rewrites the trainer spec) and returns the new Deployment."""

    def __init__(self, cfg: ExperimentConfig, provider: Provider, cluster: Cluster,
                 deployment: Deployment, rec: results.RunRecorder, progress: RunProgress,
                 control: ControlChannel, revocations: RevocationSchedule,
                 restart_cluster: Callable[[Cluster], Deployment]) -> None:
        self.cfg, self.provider, self.cluster = cfg, provider, cluster
        self.deployment, self.rec, self.progress, self.control = deployment, rec, progress, control
        self.restart_cluster = restart_cluster
        self.state = RunState()
        self.revocations = revocations
        self.planner = RecoveryPlanner(cfg.cluster.recovery)
        self.injections = InjectionSchedule(cfg.straggler.injections, cfg.straggler.enabled)
        self.detector = StragglerDetector.from_config(cfg.straggler.detection)
        self.policy = get_sync_policy(cfg.sync.policy)
        self.pending: list[RecoveryDecision] = []
        self.awaiting_restart: RecoveryDecision | None = None
        self.revoked_ids: set[str] = set()
        self.noticed_ids: set[str] = set()  # hosts we sent a preemption notice ourselves
        self.checkpoint_at: list[float] = []  # run seconds at which to ask for a checkpoint
        self.injected: set[int] = set()
        self.schedule_protocol: str | None = None  # the phase schedule's protocol now

    # --- clock and records -------------------------------------------------------------------
    def now_s(self) -> float:
        return time.time() - (self.state.train_t0 or self.state.start_time)

    def record(self, events: Any) -> None:
        for e in events if isinstance(events, list | tuple) else [events]:
            if isinstance(e, RecordedEvent):
                self.rec.event(e.kind, **e.fields)

    # --- the loop ----------------------------------------------------------------------------
    def follow(self) -> None:
        """Return when the run is done (state.error None) or failed (state.error set)."""
        eval_deadline: float | None = None
        next_tick = 0.0
        while self.state.error is None:
            event = self.deployment.next_event(TICK_S)
            if event is not None:
                self.handle(event)
            if time.monotonic() >= next_tick or event is None:
                self.tick()
                next_tick = time.monotonic() + TICK_S
            if self.pending or self.awaiting_restart:
                continue
            s = self.state
            if s.chief_done and (s.evaluator_done or not self.cfg.cluster.evaluator):
                return
            if s.chief_done and eval_deadline is None:
                eval_deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
            if eval_deadline is not None and time.monotonic() > eval_deadline:
                s.error = "evaluator did not report the final accuracy in time"

    # --- trainer events ----------------------------------------------------------------------
    def handle(self, event: TrainerEvent) -> None:
        f, s = event.fields, self.state
        self.rec.event(event.kind, role=event.role, time_s=event.time, index=event.index, **f)
        step = f.get("step")
        if isinstance(step, int | float) and event.role == "chief":
            s.global_step = max(s.global_step, int(step))
        wall = event.time - s.start_time
        kind = event.kind
        if kind == "train_start":
            s.train_start = event.time
            if s.train_t0 is None:
                s.train_t0 = event.time
            self.progress.status("training")
            if self.awaiting_restart is not None:
                decision = self.awaiting_restart
                # the new chief skipped a damaged checkpoint (checkpoint_skipped): the steps
                # after the one it used are lost too
                resumed = int(f.get("step") or 0)
                if decision.resume_step is not None and resumed < decision.resume_step:
                    extra = decision.resume_step - resumed
                    decision = replace(decision, resume_step=resumed,
                                                   lost_steps=decision.lost_steps + extra)
                    self.planner.tally.lost_steps += extra
                    s.last_checkpoint_step = resumed
                self.record(self.planner.end(decision, self.now_s()))
                self.awaiting_restart = None
        elif kind == "step":
            s.last_loss, s.last_sps = _num(f.get("loss")), _num(f.get("steps_per_sec"))
            self.rec.metric(wall, int(f.get("step", 0)), s.last_sps, s.last_loss)
            self.progress.update(s.global_step, s.last_sps, s.last_loss)
        elif kind == "eval":
            s.final_accuracy = _num(f.get("accuracy"))
            self.rec.metric(wall, int(f.get("step", 0)), eval_accuracy=s.final_accuracy)
            self.progress.update(accuracy=s.final_accuracy)
            s.evaluator_done = s.evaluator_done or bool(f.get("final"))
        elif kind == "checkpoint":
            s.last_checkpoint_step = int(f.get("step", 0))
            s.last_checkpoint_s = _num(f.get("duration_s")) or s.last_checkpoint_s
        elif kind == "phase_start":  # protocol: in force now; scheduled: the phase's own
            self.schedule_protocol = str(f.get("scheduled", f.get("protocol")))
            s.open(str(f.get("protocol")), int(f.get("step", 0)), event.time)
        elif kind == "phase_end":
            s.switch_overhead_s += _num(f.get("switch_s")) or 0.0
            s.close(int(f.get("step", 0)), event.time, _num(f.get("wall_s")))
        elif kind == "protocol_switch":
            s.switch_overhead_s += _num(f.get("switch_s")) or 0.0
            s.open(str(f.get("to")), int(f.get("step", 0)), event.time)
        elif kind == "train_end":
            s.train_time_s = _num(f.get("train_time_s"))
            s.close(s.global_step, event.time)
            self.progress.update(s.global_step)
        elif kind == "worker_steps":
            self.observe_worker(int(f.get("worker", -1)), _num(f.get("step_time_s")))
        elif kind == "preemption_notice" and event.role == "ps" and \
                f.get("host_id") not in self.noticed_ids:
            # a notice we did not send (a cloud's own preemption): checkpoint now
            self.control.request_checkpoint()
        elif kind == "failure" and event.role == "evaluator" and s.error is None:
            # chief, PS and worker failures are handled by recovery when their process exits
            s.error = f"{event.role} {event.index}: {f.get('error')}"
        elif kind == EVENT_PROCESS_EXIT:
            self.on_exit(event)

    def on_exit(self, event: TrainerEvent) -> None:
        f, s = event.fields, self.state
        code = f.get("exit_code")
        if f.get("expected", True):
            if event.role == "chief" and code == 0:
                s.chief_done = True
            if event.role == "evaluator" and code == 0:
                s.evaluator_done = True
            return
        if self.awaiting_restart is not None or any(
                d.action == Action.restart for d in self.pending):
            return  # the restart under way re-deploys every role anyway
        host_id = str(f.get("host_id", ""))
        try:
            host = self.cluster.host(host_id)
        except KeyError:
            return  # a host already replaced out of the cluster
        if event.role == "chief" and code == PS_LOSS_EXIT_CODE:
            losses = [self.loss_of(h) for h in self.cluster.hosts_for(Role.PS)
                      if self.host_state(h) != HostState.RUNNING] or [self.loss_of(host)]
        else:
            losses = [self.loss_of(host)]
        self.decide(losses)

    def host_state(self, host: Host) -> HostState:
        return self.provider.poll(Cluster(self.cluster.run_id, [host]))[host.id]

    def loss_of(self, host: Host) -> HostLoss:
        gone = self.host_state(host) != HostState.RUNNING
        cause = LossCause.revoked if host.id in self.revoked_ids else LossCause.crashed
        return HostLoss(host.id, host.spec.name, host.role, self.now_s(), cause, gone)

    def decide(self, losses: list[HostLoss]) -> None:
        alive = sum(1 for h in self.cluster.hosts_for(Role.WORKER)
                    if h.id not in {loss.host_id for loss in losses}
                    and self.host_state(h) == HostState.RUNNING)
        progress = TrainingProgress(self.state.global_step, self.state.last_checkpoint_step,
                                    alive)
        for decision in self.planner.decide(losses, progress, self.now_s()):
            self.record(list(decision.events))
            for loss in decision.losses:
                if loss.role == Role.WORKER:
                    self.record(self.detector.forget(self.cluster.index_of(
                        self.cluster.host(loss.host_id)), self.now_s()))
            if decision.action == Action.fail:
                self.state.error = decision.reason
            elif decision.action == Action.restart:
                self.progress.status("restarting from checkpoint")
                self.deployment.teardown()
                self.state.chief_done = self.state.evaluator_done = False
                self.pending.append(decision)
            elif decision.action == Action.replace:
                self.pending.append(decision)

    # --- periodic checks ---------------------------------------------------------------------
    def tick(self) -> None:
        now = self.now_s()
        if self.state.train_t0 is not None and not self.awaiting_restart:
            self.fire_revocations(now)
            self.request_due_checkpoints(now)
        for decision in [d for d in self.pending if d.execute_at_s <= now]:
            self.pending.remove(decision)
            self.execute(decision, now)
        if self.state.train_t0 is not None:
            self.track_injections(now)
            self.apply_policy(now)

    def fire_revocations(self, now: float) -> None:
        alive = [h.spec.name for h in self.cluster.hosts
                 if self.host_state(h) == HostState.RUNNING]
        for event in self.revocations.due(now, self.state.global_step, alive):
            host = next(h for h in self.cluster.hosts if h.spec.name == event.host_name)
            self.revoked_ids.add(host.id)
            if event.notice_s > 0:
                self.rec.event("revocation_notice", host=host.spec.name, host_id=host.id,
                               role=str(host.role), notice_s=event.notice_s)
                self.noticed_ids.add(host.id)
                if host.role == Role.PS:  # save what the PS holds as late as is safe
                    margin = max(NOTICE_MARGIN_S, 2 * self.state.last_checkpoint_s)
                    self.checkpoint_at.append(now + max(0.0, event.notice_s - margin))
            self.provider.revoke(host, event.notice_s)

    def request_due_checkpoints(self, now: float) -> None:
        due = [t for t in self.checkpoint_at if t <= now]
        if due:
            self.checkpoint_at = [t for t in self.checkpoint_at if t > now]
            self.control.request_checkpoint()

    def execute(self, decision: RecoveryDecision, now: float) -> None:
        result = self.planner.complete(decision, self.provider, self.cluster, now)
        self.record(list(result.events))
        if result.ok:
            self.cluster = result.cluster
        if decision.action == Action.replace:
            for host in result.new_hosts:
                self.deployment.start_role(host, self.cluster)
                self.revocations.on_replacement(host.spec.name, now)
            self.record(self.planner.end(decision, self.now_s(), ok=result.ok))
        else:  # restart: every role again; the chief resumes from the latest checkpoint
            new_hosts = list(result.new_hosts) + self.replace_gone_hosts(now)
            for host in new_hosts:
                self.revocations.on_replacement(host.spec.name, now)
            self.control.reset()
            self.state.protocol = None
            self.deployment = self.restart_cluster(self.cluster)
            self.awaiting_restart = decision

    def replace_gone_hosts(self, now: float) -> list[Host]:
        """Before a restart: every host still gone (a worker awaiting its replacement, say)
        is replaced now, and the replace decisions waiting for it are done: the restart
        re-deploys every role anyway."""
        gone = [h for h in self.cluster.hosts if self.host_state(h) != HostState.RUNNING]
        if not gone:
            return []
        self.cluster = self.provider.replace(self.cluster, [h.id for h in gone])
        names = {h.spec.name for h in gone}
        new_hosts = [h for h in self.cluster.hosts if h.spec.name in names]
        events = [RecordedEvent(EVENT_REPLACEMENT_READY, {
            "host": h.spec.name, "host_id": h.id, "endpoint": h.endpoint, "wait_s": 0.0,
            "reason": "restart"}) for h in new_hosts]
        self.planner.tally.count(events)
        self.record(events)
        for decision in [d for d in self.pending if d.action == Action.replace]:
            self.pending.remove(decision)
            self.record(self.planner.end(decision, now))
        return new_hosts

    def track_injections(self, now: float) -> None:
        delays = self.injections.delays_at(now, self.state.global_step)
        for worker in sorted(set(delays) - self.injected):
            self.state.stragglers_injected += 1
            self.rec.event("straggler_injection_start", worker=worker, delay_s=delays[worker])
        for worker in sorted(self.injected - set(delays)):
            self.rec.event("straggler_injection_end", worker=worker)
        self.injected = set(delays)

    def observe_worker(self, worker: int, step_time_s: float | None) -> None:
        if worker < 0 or step_time_s is None:
            return
        event = self.detector.observe(worker, step_time_s, self.now_s())
        if event is not None:
            self.state.stragglers_detected += event.kind == "straggler_start"
            self.record(event)

    def apply_policy(self, now: float) -> None:
        if self.schedule_protocol is None:
            return
        decision = self.policy.decide(now, self.schedule_protocol, self.detector.stragglers)
        if decision.event is not None:
            self.record(decision.event)
        if decision.changed:
            self.control.set_protocol(decision.protocol if decision.override else None)

    # --- summary -----------------------------------------------------------------------------
    def summary_extras(self) -> dict[str, Any]:
        s = self.state
        return {**self.planner.tally.to_summary(), "phases": list(s.phases),
                "switch_overhead_s": round(s.switch_overhead_s, 3),
                "stragglers": s.stragglers_detected,
                "stragglers_injected": s.stragglers_injected}
