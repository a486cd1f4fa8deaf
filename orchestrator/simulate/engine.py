"""A planned run as a SimPy discrete-event simulation: same config, same plan, same decisions.

What happens, in order (every duration from :class:`orchestrator.simulate.models.SimModels`):

1. every host is requested at t = 0 and starts after a VM start-up drawn per host (on-demand or
   transient); TensorFlow starts (cold) on the slowest; ``train_start`` follows.
2. training advances in segments at the cluster's current rate (ASP or BSP, see ``models``),
   each worker's step time the speed model's times a factor drawn once per run and GPU type
   from the model's held-out error (``sim.speed_error``; ``SimModels.speed_factor``);
   a segment ends at the next checkpoint, phase end, step-triggered event, or as soon as the
   state changes (a revocation, a replacement joining, a straggler, a policy switch).
3. revocations come from :class:`orchestrator.transient.revocation.RevocationSchedule`: the
   experiment's ``revocation`` model when it has one, otherwise the simulated cloud's: the
   measured lifetimes per GPU and region, on the market of
   :func:`orchestrator.simulate.cloud.cloud_market` (the 24 h cap only for preemptible VMs).
   A notice lets the chief checkpoint; the kill becomes a ``HostLoss`` handed to the real
   :class:`orchestrator.transient.recovery.RecoveryPlanner`, whose decisions (continue,
   replace, restart, fail) are executed here against :class:`provisioning.sim.SimProvider`.
4. stragglers come from :class:`orchestrator.transient.stragglers.InjectionSchedule`; the real
   ``StragglerDetector`` sees the slowed step times and the real sync policy decides switches.
5. cost: every host is billed from its request until its revocation or the end of the run.

The cloud's part (market, lifetimes, replacement start-ups, billing) is
:mod:`orchestrator.simulate.cloud`; this module plays the run.

``simulate(cfg, plan, seed)`` returns a :class:`SimResult` (summary, events, metrics rows) and
writes nothing; :mod:`orchestrator.simulate.run` writes it as a run directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import simpy

from orchestrator.config.schema import ExperimentConfig, Protocol
from orchestrator.plan import RunPlan
from orchestrator.rundir import results
from orchestrator.rundir.record import fold, summarize
from orchestrator.simulate.cloud import Billing, cloud_revocations, provision_delay
from orchestrator.simulate.models import CPU, SimModels
from orchestrator.transient.recovery import (
    EVENT_REVOCATION_NOTICE,
    Action,
    HostLoss,
    RecordedEvent,
    RecoveryDecision,
    RecoveryPlanner,
    TrainingProgress,
    hosts_to_replace,
)
from orchestrator.transient.revocation import (
    RevocationEvent,
)
from orchestrator.transient.stragglers import (
    EVENT_STRAGGLER_INJECTION_END,
    EVENT_STRAGGLER_INJECTION_START,
    InjectionSchedule,
    StragglerDetector,
    get_sync_policy,
)
from provisioning.base import ClusterRequest, Host, Role
from provisioning.sim import SimProvider
from trainer import events
from trainer.layout import ROLE_CHIEF, ROLE_EVALUATOR, ROLE_PS, ROLE_WORKER

_EPS = 1e-9


def stream(seed: int, *parts: object) -> random.Random:
    """An independent random stream per purpose, reproducible from the seed."""
    key = "/".join(str(p) for p in (seed, *parts)).encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


@dataclass
class SimResult:
    """A simulated run: ``summary`` (results.SUMMARY_FIELDS + transient fields), ``events``
    (``t`` = seconds since the command started) and ``metrics`` rows."""

    summary: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)


class Simulation:
    """One simulated run; build, then :meth:`run`."""

    def __init__(self, cfg: ExperimentConfig, plan: RunPlan, seed: int,
                 models: SimModels | None = None, *, metrics: bool = True,
                 plan_dict: dict[str, Any] | None = None) -> None:
        """``metrics``: False records no metrics rows (a band or the planner reads only the
        summary; they were 15 % of a run's time); ``plan_dict``: ``plan.to_dict()`` made once
        for many runs of one plan (its deep copy per run was another 14 %)."""
        self.cfg, self.plan, self.seed = cfg, plan, seed
        self.keep_metrics, self.plan_dict = metrics, plan_dict
        self.models = models or SimModels.load()
        self.env = simpy.Environment()
        self.rng = stream(seed, "engine")
        self.events: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.hparam = cfg.job.hparam_set
        # the worker step times fail early (NoModelError) when the speed model has no answer;
        # each run draws how far the model is off per GPU type (its held-out error), so a band
        # covers what the speed model does not know, not only the revocations
        gpus = sorted({h.gpu or CPU for h in plan.hosts if h.role == ROLE_WORKER})
        self.speed_factor = {g: self.models.speed_factor(self.hparam, None if g == CPU else g,
                                                         seed)
                             if cfg.sim.speed_error else 1.0 for g in gpus}
        self.base_step_s = {h.name: self.models.step_time_s(self.hparam, h.gpu,
                                                            cfg.job.batch_size)
                            * self.speed_factor[h.gpu or CPU]
                            for h in plan.hosts if h.role == ROLE_WORKER}
        self.ckpt_s = self.models.checkpoint_s(self.hparam)
        self.provider = SimProvider()
        self.cluster = self.provider.acquire(ClusterRequest(f"sim-{seed}", plan.host_specs(),
                                                            Path(".")))
        self.by_name = {h.name: h for h in plan.hosts}
        self.alive: set[str] = set()
        self.bill = Billing()
        self.rcfg = dataclasses.replace(cfg.cluster.recovery)
        self.planner = RecoveryPlanner(self.rcfg)
        self.revocations = cloud_revocations(cfg, plan, seed, self.models)
        self.injection = InjectionSchedule(cfg.straggler.injections, cfg.straggler.enabled)
        self.detector = StragglerDetector.from_config(cfg.straggler.detection)
        self.policy = get_sync_policy(cfg.sync.policy)
        # training state
        self.t0: float | None = None
        self.step = 0.0
        self.last_ckpt: int | None = None
        self.phase = 0
        self.override: str | None = None
        self.delays: dict[int, float] = {}
        self.paused = False
        self.ckpt_request = False
        self.error: str | None = None
        self.seg_start = 0.0
        self.seg_rate = 0.0
        self.seg_target = 0.0
        self.wake = self.env.event()
        self.sched_wake = self.env.event()
        self.done = self.env.event()
        self.train_end: float | None = None

    # --- set-up -------------------------------------------------------------------------
    def now_s(self) -> float:
        """Run seconds (since train_start), the clock of revocations, injections and policies."""
        return self.env.now - (self.t0 if self.t0 is not None else self.env.now)

    def record(self, kind: str, role: str = results.ROLE_ORCHESTRATOR, **fields: Any) -> None:
        self.events.append({"t": round(self.env.now, 3), "kind": kind, "role": role, **fields})

    def record_all(self, recorded: list[RecordedEvent] | tuple[RecordedEvent, ...]) -> None:
        for event in recorded:
            if event is not None:
                self.record(event.kind, **event.fields)

    def rate_changed(self) -> None:
        """Wake the trainer: the state changed, so the current segment's rate is stale."""
        old, self.wake = self.wake, self.env.event()
        old.succeed()

    # --- rates ----------------------------------------------------------------------------
    def protocol(self) -> str:
        return self.override or self.plan.phases[self.phase].protocol

    def worker_times(self) -> list[tuple[float, str | None]]:
        out = []
        for h in self.plan.hosts:
            if h.role == ROLE_WORKER and h.name in self.alive:
                out.append((self.base_step_s[h.name] + self.delays.get(h.index, 0.0), h.gpu))
        return out

    def rate(self) -> float:
        """Global steps per second now (0 when nobody can train)."""
        times = self.worker_times()
        if self.paused or not times or not self._servers_up():
            return 0.0
        if self.protocol() == Protocol.asp.value:
            return self.models.asp_rate(times, self.hparam, self.plan.parameter_servers)
        return 1.0 / self.models.bsp_step_s([t for t, _ in times])

    def _servers_up(self) -> bool:
        return all(h.name in self.alive for h in self.plan.hosts if h.role in (ROLE_PS, ROLE_CHIEF))

    def advance(self) -> None:
        """Account the steps done since the segment began (called before any state change)."""
        if self.seg_rate > 0:
            self.step = min(self.seg_target, self.step + self.seg_rate
                            * (self.env.now - self.seg_start))
        self.seg_start = self.env.now

    # --- the processes --------------------------------------------------------------------
    def run(self) -> SimResult:
        self.env.process(self.startup())
        self.env.run(until=self.done)
        return self.result()

    def startup(self) -> Any:
        rng = stream(self.seed, "startup")
        self.record(results.EVENT_PROVISION, hosts=len(self.plan.hosts),
                    provider=self.plan.provider)
        ready = 0.0
        for h in self.plan.hosts:
            self.bill.start(h.name, self.env.now)
            if h.colocate_with is None:  # a colocated role starts with its owner's VM
                ready = max(ready, self.models.vm_startup_s(h.transient, rng))
        yield self.env.timeout(ready)
        self.alive = {h.name for h in self.plan.hosts}
        self.record(results.EVENT_PROVISIONED, hosts=[h.name for h in self.plan.hosts])
        yield self.env.timeout(self.models.tf_start_s(True, rng))
        self.record(events.EVENT_READY)
        self.t0 = self.env.now
        self.record(events.EVENT_TRAIN_START, role=ROLE_CHIEF, step=0,
                    workers=self.plan.workers, resumed_from=None)
        self.env.process(self.revoker())
        if self.injection.injections:
            self.env.process(self.stragglers())
        self.env.process(self.trainer())

    def checkpoint_steps(self) -> list[int]:
        every = [f for f in (self.cfg.job.checkpoint_frequency, self.cfg.job.eval_frequency)
                 if f > 0]
        return every

    def next_boundary(self) -> float:
        step = int(self.step + _EPS)
        end = self.plan.phases[self.phase].end_step
        cands = [end] + [(step // f + 1) * f for f in self.checkpoint_steps()]
        cands += [e.at_step for e in self.revocations.pending
                  if e.at_step is not None and e.at_step > self.step + _EPS]
        cands += [inj.start_step for inj in self.injection.injections
                  if inj.start_step is not None and inj.start_step > self.step + _EPS]
        return float(min(cands))

    def trainer(self) -> Any:
        self.phase_start(0.0)
        while self.error is None:
            if self.ckpt_request and not self.paused:
                self.ckpt_request = False
                yield from self.checkpoint("notice")
                continue
            rate = self.rate()
            target = self.next_boundary()
            self.seg_start, self.seg_rate, self.seg_target = self.env.now, rate, target
            wake = self.wake
            if rate > 0:
                yield self.env.timeout(max(0.0, (target - self.step) / rate)) | wake
            else:
                yield wake
            self.advance()
            self.seg_rate = 0.0
            if self.error is not None or self.paused:
                continue
            if self.step + _EPS < target:
                continue  # woken by a state change: recompute the rate
            self.step = target
            if self.keep_metrics:
                self.metric()
            self.fire_step_events()
            step = round(self.step)
            end = self.plan.phases[self.phase].end_step
            if step >= end and self.phase == len(self.plan.phases) - 1:
                self.phase_end()
                yield from self.checkpoint("final")
                self.train_end = self.env.now
                self.record(events.EVENT_TRAIN_END, role=ROLE_CHIEF, step=step,
                            train_time_s=round(self.env.now - (self.t0 or 0.0), 3))
                break
            if step >= end:
                protocol = self.plan.phases[self.phase + 1].protocol
                cost = self.switch_cost(protocol)
                # the switch's time is on the phase_end, as the trainer records it, unless a
                # protocol_switch says it (a control override in force that the schedule ends)
                announced = self.override is not None and self.override != protocol
                self.phase_end(switch_s=0.0 if announced else cost)
                self.phase += 1
                yield from self.switch(protocol, cost)
                self.phase_start(self.step)
                continue
            if any(step % f == 0 for f in self.checkpoint_steps()):
                yield from self.checkpoint("schedule")
        self.finish()

    def checkpoint(self, reason: str) -> Any:
        yield self.env.timeout(self.ckpt_s)
        self.last_ckpt = round(self.step)
        self.record(events.EVENT_CHECKPOINT, role=ROLE_CHIEF, step=self.last_ckpt,
                    duration_s=round(self.ckpt_s, 3), reason=reason)

    def switch_cost(self, protocol: str) -> float:
        """In place (ours): the switch ends when one step of the new protocol is applied."""
        times = [t for t, _ in self.worker_times()] or [0.0]
        return self.models.bsp_step_s(times) if protocol == Protocol.bsp.value else min(times)

    def switch(self, protocol: str, cost: float) -> Any:
        before = self.protocol()
        yield self.env.timeout(cost)
        if before != protocol:
            self.record(events.EVENT_PROTOCOL_SWITCH, role=ROLE_CHIEF, step=int(self.step),
                        switch_s=round(cost, 3), reason="schedule",
                        **{"from": before, "to": protocol})

    def phase_start(self, step: float) -> None:
        self._phase_t = self.env.now
        self._phase_step = round(step)
        self.record(events.EVENT_PHASE_START, role=ROLE_CHIEF, protocol=self.protocol(),
                    step=self._phase_step, phase=self.phase)

    def phase_end(self, switch_s: float = 0.0) -> None:
        wall = round(self.env.now - self._phase_t, 3)
        protocol = self.plan.phases[self.phase].protocol
        self.record(events.EVENT_PHASE_END, role=ROLE_CHIEF, protocol=protocol,
                    step=round(self.step), phase=self.phase, wall_s=wall,
                    switch_s=round(switch_s, 3))

    def metric(self) -> None:
        self.metrics.append({"wall_time_s": round(self.env.now, 3),
                             "global_step": round(self.step),
                             "steps_per_sec": round(self.rate(), 4) if self.rate() else None})

    # --- revocations and recovery ---------------------------------------------------------
    def revoker(self) -> Any:
        while self.error is None and not self.done.triggered:
            nxt = self.revocations.next_at_s()
            waits = [self.sched_wake]
            if nxt is not None:
                waits.append(self.env.timeout(max(1e-6, nxt - self.now_s())))  # progress
            yield self.env.any_of(waits)
            if self.sched_wake.triggered:
                self.sched_wake = self.env.event()
            self.fire_due()

    def fire_step_events(self) -> None:
        self.fire_due()
        if any(inj.start_step is not None for inj in self.injection.injections):
            self.refresh_stragglers()

    def fire_due(self) -> None:
        self.advance()
        for event in self.revocations.due(self.now_s() + 1e-6, int(self.step + _EPS), self.alive):
            self.env.process(self.revoke(event))

    def revoke(self, event: RevocationEvent) -> Any:
        name = event.host_name
        assert name is not None
        host = self.by_name[name]
        if event.notice_s > 0:
            self.record(EVENT_REVOCATION_NOTICE, host=name, role=host.role, notice_s=event.notice_s)
            chief_vm = host.role == ROLE_CHIEF or any(
                h.role == ROLE_CHIEF and h.colocate_with == name for h in self.plan.hosts)
            if chief_vm and event.notice_s >= self.ckpt_s:
                self.ckpt_request = True  # the chief checkpoints on its own host's notice
                self.rate_changed()
            yield self.env.timeout(event.notice_s)
        if name not in self.alive or self.done.triggered:
            return
        self.advance()
        names = [name] + [h.name for h in self.plan.hosts
                          if h.colocate_with == name and h.name in self.alive]
        losses = []
        for lost in names:
            self.alive.discard(lost)
            self.bill.stop(lost, self.env.now)
            chost = next(h for h in self.cluster.hosts if h.spec.name == lost)
            self.provider.revoke(chost)
            losses.append(HostLoss(chost.id, lost, Role(self.by_name[lost].role),
                                   round(self.now_s(), 3)))
        self.rcfg.replacement_delay_s = provision_delay(
            self.models, host, stream(self.seed, "replacement", len(self.events)))
        workers_alive = sum(1 for h in self.plan.hosts
                            if h.role == ROLE_WORKER and h.name in self.alive)
        progress = TrainingProgress(int(self.step + _EPS), self.last_ckpt, workers_alive)
        for decision in self.planner.decide(losses, progress, self.now_s()):
            self.record_all(decision.events)
            if host.role == ROLE_WORKER:
                self.record_all([self.detector.forget(host.index, self.now_s())])
            if decision.action == Action.fail:
                self.error = decision.reason
                self.rate_changed()
            elif decision.action == Action.restart:
                self.paused = True
                self.step = float(decision.resume_step or 0)
                self.env.process(self.complete(decision, restart=True))
            elif decision.action == Action.replace:
                self.env.process(self.complete(decision, restart=False))
        self.rate_changed()

    def complete(self, decision: RecoveryDecision, restart: bool) -> Any:
        yield self.env.timeout(max(0.0, decision.execute_at_s - self.now_s()))
        if self.error is not None or self.done.triggered:
            return
        new_hosts = self.replace_hosts(decision, restart)
        self.record_all(self.planner.replaced(decision, new_hosts, self.now_s()))
        if restart:  # every role restarts: TF starts cold on new VMs, warm on the others
            rng = stream(self.seed, "restart", decision.attempt)
            yield self.env.timeout(self.models.tf_start_s(bool(new_hosts), rng))
        self.advance()
        for new in new_hosts:
            name = new.spec.name
            self.alive.add(name)
            # billed from its request, when the first loss was seen
            self.bill.start(name, self.env.now - max(
                0.0, self.now_s() - min(loss.at_s for loss in decision.losses)))
            self.revocations.on_replacement(name, self.now_s())
        if not self.sched_wake.triggered:
            self.sched_wake.succeed()
        self.record_all([self.planner.end(decision, self.now_s())])
        if restart:
            self.paused = False
            self.record(events.EVENT_TRAIN_START, role=ROLE_CHIEF, step=int(self.step),
                        workers=len(self.worker_times()), resumed_from=decision.resume_step)
        self.rate_changed()

    def replace_hosts(self, decision: RecoveryDecision, restart: bool) -> list[Host]:
        """What the real run's Fleet does with the provider, by the same rule
        (:func:`orchestrator.transient.recovery.hosts_to_replace`); the simulated cloud always
        has capacity."""
        known = {h.id for h in self.cluster.hosts}
        ids, keep_endpoints = hosts_to_replace(self.cluster, self.provider.poll(self.cluster),
                                               decision.replace_host_ids, restart)
        if not ids:
            return []
        self.cluster = self.provider.replace(self.cluster, ids, keep_endpoints)
        return [h for h in self.cluster.hosts if h.id not in known]

    # --- stragglers and the sync policy ---------------------------------------------------
    def stragglers(self) -> Any:
        while not self.done.triggered:
            now = self.now_s()
            changes = sorted({t for e in self.injection.episodes()
                              for t in (e.start_s, e.end_s) if t is not None and t > now + _EPS})
            if not changes:
                self.refresh_stragglers()
                return
            self.refresh_stragglers()
            yield self.env.timeout(changes[0] - now)
            self.refresh_stragglers()

    def refresh_stragglers(self) -> None:
        delays = self.injection.delays_at(self.now_s(), int(self.step + _EPS))
        if delays == self.delays:
            return
        self.advance()
        for worker in sorted(set(delays) - set(self.delays)):
            self.record(EVENT_STRAGGLER_INJECTION_START, worker=worker, delay_s=delays[worker])
        for worker in sorted(set(self.delays) - set(delays)):
            self.record(EVENT_STRAGGLER_INJECTION_END, worker=worker)
        self.delays = delays
        self.rate_changed()
        self.env.process(self.detect())

    def detect(self) -> Any:
        """The detector sees ``m`` reports of every live worker's step time, one step apart;
        the policy decides then, and again once ``calm_s`` / ``min_dwell_s`` have passed."""
        m = max(1, self.cfg.straggler.detection.m)
        for _ in range(m):
            times = self.worker_times()
            yield self.env.timeout(max(t for t, _ in times) if times else 1.0)
            for h in self.plan.hosts:
                if h.role == ROLE_WORKER and h.name in self.alive:
                    event = self.detector.observe(h.index, self.base_step_s[h.name]
                                                  + self.delays.get(h.index, 0.0), self.now_s())
                    if event is not None:
                        self.record(event.kind, **event.fields)
        self.apply_policy()
        pol = self.cfg.sync.policy
        for wait in sorted({pol.calm_s, pol.min_dwell_s}):
            yield self.env.timeout(wait + _EPS)
            self.apply_policy()

    def apply_policy(self) -> None:
        if self.done.triggered:
            return
        decision = self.policy.decide(self.now_s(), self.plan.phases[self.phase].protocol,
                                      self.detector.stragglers)
        if decision.event is not None:
            self.record(decision.event.kind, **decision.event.fields)
        if decision.changed:
            self.advance()
            before = self.protocol()
            self.override = decision.protocol if decision.override else None
            if before != self.protocol():
                times = [t for t, _ in self.worker_times()] or [0.0]
                cost = min(times)  # in place: one step of the new protocol (paid in rate)
                self.record(events.EVENT_PROTOCOL_SWITCH, role=ROLE_CHIEF, step=int(self.step),
                            switch_s=round(cost, 3), reason="control",
                            **{"from": before, "to": self.protocol()})
            self.rate_changed()

    # --- the end --------------------------------------------------------------------------
    def finish(self) -> None:
        if self.error is not None:  # where training stopped (a completed run's train_end says)
            self.record(events.EVENT_STEP, role=ROLE_CHIEF, step=round(self.step))
        elif self.train_end is not None:
            self.record_final_accuracy()
        self.bill.stop_all(self.env.now)
        self.record(results.EVENT_TEARDOWN)
        if not self.done.triggered:
            self.done.succeed()

    def cost_usd(self, roles: tuple[str, ...] | None = None, training_only: bool = False
                 ) -> float:
        """What the VMs cost: every host from its request to its revocation or the end; with
        ``training_only`` only the part inside train_start..train_end (the papers' rule)."""
        lo = (self.t0 or 0.0) if training_only else 0.0
        hi = (self.train_end or self.env.now) if training_only else float("inf")
        return self.bill.cost_usd(self.by_name, roles, lo, hi)

    def record_final_accuracy(self) -> None:
        """The evaluator's final ``eval`` of a completed run: the accuracy the fitted models
        give this setup (none when they cannot), and where it comes from (``source``)."""
        cfg, plan = self.cfg, self.plan
        transient = any(h.transient for h in plan.hosts if h.role == ROLE_WORKER)
        bsp = sum(p.bsp_equivalent_steps for p in plan.phases if p.protocol == "bsp")
        budget = sum(p.bsp_equivalent_steps for p in plan.phases)
        found = self.models.accuracy(self.hparam, cfg.job.problem, plan.workers,
                                     bsp / budget if budget else 0.0, round(budget), transient)
        if found is not None:
            accuracy, source = found
            self.record(events.EVENT_EVAL, role=ROLE_EVALUATOR, step=round(self.step),
                        accuracy=accuracy, final=True, source=source)

    def result(self) -> SimResult:
        """The run as the real one records it: events, metrics, and the summary made from the
        events by the one builder (:func:`orchestrator.rundir.record.summarize`)."""
        completed = self.error is None and self.train_end is not None
        state = fold({results.EVENT_TIME: event["t"], **event} for event in self.events)
        # a simulated run is its own prediction: the plan's band is not compared with it
        plan = {**(self.plan_dict or self.plan.to_dict()), "prediction": None}
        summary = summarize(
            state, plan, run_id=f"{self.cfg.name}-sim-{self.seed}",
            status=results.STATUS_COMPLETED if completed else results.STATUS_FAILED,
            wall_s=self.env.now, cost_usd=self.cost_usd(), error=self.error,
            ended_at=self.env.now, sim_seed=self.seed,
            sim_speed_factor={g: round(f, 4) for g, f in self.speed_factor.items()})
        return SimResult(summary.to_dict(), self.events, self.metrics)


def simulate(cfg: ExperimentConfig, plan: RunPlan, seed: int | None = None,
             models: SimModels | None = None, *, metrics: bool = True,
             plan_dict: dict[str, Any] | None = None) -> SimResult:
    """Simulate one run of ``plan``; ``seed`` None = ``cfg.sim.seed``. Deterministic.
    ``metrics``, ``plan_dict``: see :class:`Simulation` (the summary is the same either way)."""
    return Simulation(cfg, plan, cfg.sim.seed if seed is None else seed, models,
                      metrics=metrics, plan_dict=plan_dict).run()
