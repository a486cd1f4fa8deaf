"""A sweep's runs sharing a GPU quota: FIFO, shortest-predicted-first, Tiresias' 2D-LAS and
2D-Gittins index.

A cloud project's GPU quota is often smaller than what a sweep's runs need together, so runs
queue. Four orders (``queue.policy``), all work-conserving (whenever GPUs are free, start, in
priority order, every waiting run that fits):

* ``fifo`` — sweep order, each run to completion.
* ``spf`` — shortest predicted run first (duration predicted from the speed model and the plan,
  :func:`predict_time_s`; the actual run may differ: revocations, stragglers), to completion.
* ``las`` — Tiresias' discretized two-dimensional least-attained-service (Gu et al., NSDI'19):
  a run's priority is the service it has received, GPUs × time, in queues split at
  ``queue.las_threshold_gpu_h`` and at every doubling of it (FIFO within a queue); a run that
  crosses a boundary drops a queue and may be preempted (it checkpoints and restarts later,
  paying the checkpoint and a TensorFlow warm start from the fitted models). It needs no
  knowledge of run length.
* ``gittins`` — Tiresias' discretized 2D-Gittins index: the same queues, ranked by the Gittins
  index of their lower boundary given a distribution of run lengths (:class:`Scheduler` has
  the formula), so a run that the distribution says is near its end is not preempted.

:class:`Scheduler` is the one implementation: "which runs should hold GPUs now", given each
run's GPUs, prediction, sweep order and service received. The simulated durations come from
``provider=sim`` runs; ``python -m orchestrator.simulate.sweep ... queue.quota_gpus=16``
schedules the sweep it just simulated under the quota with every policy (:func:`schedule`, which
asks the Scheduler at every completion and queue boundary) and writes ``queue.json`` beside
``runs.csv``. A real sweep launched concurrently (``hydra/launcher=parallel``,
orchestrator/parallel.py) asks the same Scheduler at every poll, and preempts for real under
``las`` and ``gittins``: the point checkpoints, releases its hosts and is resumed later.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.simulate import QueuePolicy
from orchestrator.plan import RunPlan, estimate_train_time_s
from orchestrator.simulate.models import SimModels

_EPS = 1e-9
T = TypeVar("T")


@dataclass(frozen=True)
class QueuedRun:
    """One run of the sweep: GPUs it holds, how long it really takes, what was predicted."""

    name: str
    gpus: int
    duration_s: float
    predicted_s: float


@dataclass
class _State:
    run: QueuedRun
    job: Job
    done_s: float = 0.0  # work done (seconds of the run's own time)
    finished_at: float | None = None
    preemptions: int = 0
    overhead_left: float = 0.0  # restart overhead still to pay before work resumes


@dataclass
class Schedule:
    policy: str
    completion_s: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0

    @property
    def average_s(self) -> float:
        return statistics.fmean(self.completion_s.values())

    @property
    def makespan_s(self) -> float:
        return max(self.completion_s.values())

    @property
    def total_s(self) -> float:
        return sum(self.completion_s.values())

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "average_completion_s": round(self.average_s, 1),
                "makespan_s": round(self.makespan_s, 1),
                "sum_completion_s": round(self.total_s, 1), "preemptions": self.preemptions,
                "completion_s": {k: round(v, 1) for k, v in self.completion_s.items()}}


def schedule(runs: Sequence[QueuedRun], quota_gpus: int, policy: QueuePolicy | str,
             las_threshold_gpu_h: float = 1.0, restart_overhead_s: float = 0.0) -> Schedule:
    """Simulate the queue (all runs submitted at t = 0); completion time of every run.

    Which runs run is decided by :class:`Scheduler`, the same object the real launcher asks;
    ``gittins`` takes its distribution of run lengths from these runs' simulated durations
    (GPUs × seconds: the sweep's own, as Tiresias takes it from the cluster's history).

    Raises ValueError when a run alone needs more GPUs than the quota (it could never start)."""
    too_big = [r.name for r in runs if r.gpus > quota_gpus]
    if too_big:
        raise ValueError(f"runs {too_big} need more GPUs than queue.quota_gpus={quota_gpus}")
    policy = QueuePolicy(policy)
    sched = Scheduler(policy, quota_gpus, las_threshold_gpu_h,
                      lengths_gpu_s=[r.gpus * r.duration_s for r in runs])
    states = [_State(r, Job(r.name, r.gpus, r.predicted_s, i)) for i, r in enumerate(runs)]
    now = 0.0
    preemptions = 0
    while any(s.finished_at is None for s in states):
        waiting = [s for s in states if s.finished_at is None]
        chosen_jobs = sched.running_set([s.job for s in waiting])
        chosen = [s for s in waiting if s.job in chosen_jobs]
        for s in waiting:
            if s.job.running and s not in chosen:  # preempted (las, gittins only)
                s.job.running = False
                s.preemptions += 1
                preemptions += 1
                s.overhead_left = restart_overhead_s
            elif s in chosen:
                s.job.running = True
        # advance to the next completion or the next point where a priority may change
        steps = []
        for s in chosen:
            steps.append(s.overhead_left + s.run.duration_s - s.done_s)
            if sched.preemptive and s.run.gpus > 0:
                steps.append((sched.next_boundary(s.job.attained) - s.job.attained)
                             / s.run.gpus)
        dt = max(min(steps), 0.0)
        now += dt
        for s in chosen:
            s.job.attained += dt * s.run.gpus
            pay = min(dt, s.overhead_left)
            s.overhead_left -= pay
            s.done_s += dt - pay
            if s.done_s >= s.run.duration_s - _EPS:
                s.finished_at, s.job.running = now, False
    return Schedule(policy.value, {s.run.name: s.finished_at or 0.0 for s in states},
                    preemptions)


@dataclass(eq=False)
class Job:
    """A run as the policy sees it, simulated or real: its GPUs, its predicted time, its place
    in the sweep, the service it has received (GPU-seconds) and whether it holds GPUs now."""

    key: Any
    gpus: int
    predicted_s: float
    order: int
    attained: float = 0.0
    running: bool = False


class Scheduler:
    """The one policy of a quota queue: which runs should be running now.

    Both callers ask it the same question with the same numbers: :func:`schedule` (the
    simulated sweep, at every completion and every queue boundary) and the concurrent launcher
    of real sweeps (orchestrator/parallel.py, every poll). ``fifo`` and ``spf`` never preempt:
    running runs keep their GPUs and waiting ones start in priority order into what is free.
    ``las`` and ``gittins`` preempt: every unfinished run is ranked and the top ones that fit
    run, so a running run that falls behind a waiting one yields.

    Queues (``las``, ``gittins``): queue 0 holds runs with less than the threshold of service
    (``queue.las_threshold_gpu_h``), queue k ≥ 1 those with [threshold·2^(k-1),
    threshold·2^k). A run's priority changes only when it crosses a boundary (Tiresias'
    discretization: fewer preemptions than a continuous index), which is also where the
    simulation steps.

    * ``las`` — lower queue first, sweep order within a queue (2D-LAS).
    * ``gittins`` — Tiresias' discretized 2D-Gittins index: the queue whose Gittins index,
      evaluated at the queue's lower boundary a, is highest goes first (then lower queue, then
      sweep order). The index of service a is max over the queue boundaries b > a (and the
      longest run) of P(S ≤ b | S > a) / E[min(S, b) − a | S > a], S a run's total service
      drawn from ``lengths_gpu_s``: the chance of finishing by the next boundary per unit of
      service spent. A run past every known length gets index 0 (behind every run the
      distribution still covers; the distribution was wrong about it). With no lengths at all
      every index is 0 and ``gittins`` orders as ``las``.
    """

    def __init__(self, policy: QueuePolicy | str, quota_gpus: float | None,
                 las_threshold_gpu_h: float = 1.0, lengths_gpu_s: Sequence[float] = (),
                 max_concurrent: int | None = None) -> None:
        self.policy = QueuePolicy(policy)
        if las_threshold_gpu_h <= 0:
            raise ValueError("las_threshold_gpu_h must be > 0")
        self.quota = math.inf if quota_gpus is None else quota_gpus
        self.threshold = las_threshold_gpu_h * 3600.0
        self.lengths = sorted(s for s in lengths_gpu_s if math.isfinite(s) and s > 0)
        self.max_concurrent = max_concurrent
        self._index: dict[int, float] = {}  # queue -> Gittins index at its lower boundary

    @property
    def preemptive(self) -> bool:
        return self.policy in (QueuePolicy.las, QueuePolicy.gittins)

    def level(self, attained: float) -> int:
        """Queue of a run: 0 below the threshold, then one queue per doubling of service."""
        if attained < self.threshold - _EPS:
            return 0
        return 1 + int(math.log2((attained + _EPS) / self.threshold))

    def boundary(self, level: int) -> float:
        """Lower boundary (GPU-seconds) of a queue."""
        return 0.0 if level == 0 else self.threshold * 2 ** (level - 1)

    def next_boundary(self, attained: float) -> float:
        """Service at which a run's priority may next change (inf when it never does)."""
        if not self.preemptive:
            return math.inf
        return self.boundary(self.level(attained) + 1)

    def gittins_index(self, attained: float) -> float:
        """Gittins index (per GPU-second) of a run that has received ``attained`` GPU-seconds,
        the supremum taken over the queue boundaries above it (see the class)."""
        alive = [s for s in self.lengths if s > attained + _EPS]
        if not alive:
            return 0.0
        best = 0.0
        b = self.next_boundary(attained) if self.preemptive else math.inf
        level = self.level(attained)
        while True:
            cut = min(b, alive[-1])
            done = sum(1 for s in alive if s <= cut + _EPS) / len(alive)
            spent = statistics.fmean(min(s, cut) - attained for s in alive)
            if spent > 0:
                best = max(best, done / spent)
            if cut >= alive[-1]:
                return best
            level += 1
            b = self.boundary(level + 1)

    def priority(self, job: Job) -> tuple[float, ...]:
        """Sort key of a run (smaller first)."""
        if self.policy == QueuePolicy.las:
            return (self.level(job.attained), job.order)
        if self.policy == QueuePolicy.gittins:
            level = self.level(job.attained)
            if level not in self._index:
                self._index[level] = self.gittins_index(self.boundary(level))
            return (-self._index[level], level, job.order)
        return priority_key(self.policy, QueuedRun(str(job.key), job.gpus, math.nan,
                                                   job.predicted_s), job.order)

    def running_set(self, jobs: Sequence[Job]) -> list[Job]:
        """The unfinished ``jobs`` that should hold GPUs now, in priority order: a running job
        not among them is to be preempted, a waiting one among them is to start."""
        ranked = sorted(jobs, key=self.priority)
        if self.preemptive:
            return admit(ranked, self.quota, lambda j: j.gpus, self.max_concurrent)
        kept = [j for j in ranked if j.running]
        slots = None if self.max_concurrent is None else max(0, self.max_concurrent - len(kept))
        free = self.quota - sum(j.gpus for j in kept)
        return kept + admit([j for j in ranked if not j.running], free, lambda j: j.gpus, slots)


def priority_key(policy: QueuePolicy | str, run: QueuedRun, order: int) -> tuple[float, ...]:
    """Sort key of a run in a non-preemptive queue (``fifo``, ``spf``; ties in sweep order).

    An unknown prediction (``math.inf``: no fitted model covers the run) sorts after every
    predicted run under ``spf``."""
    policy = QueuePolicy(policy)
    if policy in (QueuePolicy.las, QueuePolicy.gittins):
        raise ValueError(f"{policy} orders by service received, which needs preemption; "
                         "it has no start order (Scheduler.priority has it)")
    return (order,) if policy == QueuePolicy.fifo else (run.predicted_s, order)


def admit(ordered: Sequence[T], free_gpus: float, gpus: Callable[[T], int],
          slots: int | None = None) -> list[T]:
    """Which of ``ordered`` (priority order) start now with ``free_gpus`` free: every run that
    still fits, in order (work-conserving: a wide run may wait while narrower ones behind it
    start), at most ``slots`` of them. The simulated queue and the concurrent sweep launcher
    (orchestrator/parallel.py) both start runs by it."""
    chosen: list[T] = []
    for item in ordered:
        if slots is not None and len(chosen) >= slots:
            break
        if gpus(item) <= free_gpus:
            free_gpus -= gpus(item)
            chosen.append(item)
    return chosen


def predict_time_s(cfg: ExperimentConfig, plan: RunPlan, models: SimModels) -> float:
    """Time of the planned run from the speed model alone (all workers throughout, no
    revocation, mean start-up): what a scheduler can know before the run; the plan's own
    estimate (:func:`orchestrator.plan.estimate_train_time_s`) plus the mean start-up."""
    total = estimate_train_time_s(cfg, plan.hosts, plan.phases, models)
    startup = models.params["startup"]
    vm = startup["vm"]["transient" if any(h.transient for h in plan.hosts) else "on_demand"]
    return total + vm["mean_s"] + startup["tf_start"]["cold"]["mean_s"]


def compare(runs: Sequence[QueuedRun], quota_gpus: int, las_threshold_gpu_h: float,
            restart_overhead_s: float) -> list[Schedule]:
    """Every policy on the same runs, best average completion time first."""
    out = [schedule(runs, quota_gpus, p, las_threshold_gpu_h, restart_overhead_s)
           for p in QueuePolicy]
    return sorted(out, key=lambda s: s.average_s)


def markdown(schedules: Sequence[Schedule], quota_gpus: int, demand_gpus: int) -> list[str]:
    lines = [f"GPU quota {quota_gpus}, sweep demand {demand_gpus} GPUs at once",
             "", "| policy | average completion (h) | makespan (h) | sum of completions (h) | "
             "preemptions |", "|---|---|---|---|---|"]
    for s in schedules:
        lines.append(f"| {s.policy} | {s.average_s / 3600:.2f} | {s.makespan_s / 3600:.2f} | "
                     f"{s.total_s / 3600:.2f} | {s.preemptions} |")
    return lines
