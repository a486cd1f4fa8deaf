"""A sweep's runs sharing a GPU quota: FIFO, shortest-predicted-first and Tiresias' 2D-LAS.

A cloud project's GPU quota is often smaller than what a sweep's runs need together, so runs
queue. Three orders (``queue.policy``), all work-conserving (whenever GPUs are free, start, in
priority order, every waiting run that fits):

* ``fifo`` — sweep order, each run to completion.
* ``spf`` — shortest predicted run first (duration predicted from the speed model and the plan,
  :func:`predict_time_s`; the actual run may differ: revocations, stragglers), to completion.
* ``las`` — Tiresias' discretized two-dimensional least-attained-service (Gu et al., NSDI'19):
  a run's priority is the service it has received, GPUs × time, in queues split at
  ``queue.las_threshold_gpu_h`` and at every doubling of it (FIFO within a queue); a run that
  crosses a boundary drops a queue and may be preempted (it checkpoints and restarts later, paying the checkpoint and a
  TensorFlow warm start from the fitted models). It needs no knowledge of run length.

The simulated durations come from ``provider=sim`` runs; ``python -m orchestrator.simulate.sweep
... queue.quota_gpus=16`` schedules the sweep it just simulated under the quota with every policy
and writes ``queue.json`` beside ``runs.csv``. A real sweep launched concurrently
(``hydra/launcher=parallel``, orchestrator/parallel.py) starts its runs by the same
:func:`priority_key` and :func:`admit` (fifo and spf only: it does not preempt).
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
    order: int
    done_s: float = 0.0  # work done (seconds of the run's own time)
    attained: float = 0.0  # GPU-seconds received
    running: bool = False
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

    Raises ValueError when a run alone needs more GPUs than the quota (it could never start)."""
    policy = QueuePolicy(policy)
    too_big = [r.name for r in runs if r.gpus > quota_gpus]
    if too_big:
        raise ValueError(f"runs {too_big} need more GPUs than queue.quota_gpus={quota_gpus}")
    states = [_State(r, i) for i, r in enumerate(runs)]
    threshold = las_threshold_gpu_h * 3600.0
    now = 0.0
    preemptions = 0

    def priority(s: _State) -> tuple[float, ...]:
        if policy == QueuePolicy.las:  # 2D-LAS: lower queue first, FIFO within one
            return (level(s.attained), s.order)
        return priority_key(policy, s.run, s.order)

    def level(attained: float) -> int:
        """Queue of a run: 0 below the threshold, then one queue per doubling of service."""
        if attained < threshold - _EPS:
            return 0
        return 1 + int(math.log2((attained + _EPS) / threshold))

    def next_boundary(attained: float) -> float:
        return threshold * 2 ** level(attained)

    while any(s.finished_at is None for s in states):
        waiting = sorted((s for s in states if s.finished_at is None), key=priority)
        free = quota_gpus
        chosen = []
        preemptive = policy == QueuePolicy.las
        for s in waiting:  # greedy in priority order: every run that fits starts
            if s.running and not preemptive:
                free -= s.run.gpus
                chosen.append(s)
        chosen += admit([s for s in waiting if s not in chosen], free, lambda s: s.run.gpus)
        for s in states:
            if s.running and s not in chosen:  # preempted (LAS only)
                s.running = False
                s.preemptions += 1
                preemptions += 1
                s.overhead_left = restart_overhead_s
            elif s in chosen:
                s.running = True
        # advance to the next completion or the next threshold crossing
        steps = []
        for s in chosen:
            steps.append(s.overhead_left + s.run.duration_s - s.done_s)
            if policy == QueuePolicy.las:
                steps.append((next_boundary(s.attained) - s.attained) / s.run.gpus)
        dt = max(min(steps), 0.0)
        now += dt
        for s in chosen:
            s.attained += dt * s.run.gpus
            pay = min(dt, s.overhead_left)
            s.overhead_left -= pay
            s.done_s += dt - pay
            if s.done_s >= s.run.duration_s - _EPS:
                s.finished_at, s.running = now, False
    return Schedule(policy.value, {s.run.name: s.finished_at or 0.0 for s in states},
                    preemptions)


def priority_key(policy: QueuePolicy | str, run: QueuedRun, order: int) -> tuple[float, ...]:
    """Sort key of a run in a non-preemptive queue (``fifo``, ``spf``; ties in sweep order).

    An unknown prediction (``math.inf``: no fitted model covers the run) sorts after every
    predicted run under ``spf``."""
    policy = QueuePolicy(policy)
    if policy == QueuePolicy.las:
        raise ValueError("las orders by service received, which needs preemption; "
                         "it has no start order")
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
