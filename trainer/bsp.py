"""The BSP runner on the chief: one-step rounds with the barrier on the chief, or groups of
K rounds with the barrier held on the PS.

- One step (n == 1, K == 1, a worker lost or named hung, or K still being measured): one
  accumulate closure per worker (`Steps.bsp_accumulate`), `barrier` (trainer/waits.py: a
  dead worker's closure is rerun on a survivor by the coordinator, a hung worker's by the
  barrier once the heartbeat names it), then one apply on the PS (`Steps.bsp_apply`) that
  averages the accumulated gradients by their count, so the average stays right if a
  closure ran twice.
- A group of K global steps: N closures, one per worker, each running the same K rounds
  (`Steps.bsp_rounds`, trainer/steps.py); the worker holding a round's N-th ticket applies.
  A group needs all N workers at once (each worker runs one closure at a time, so N
  closures land on N workers). When a worker fails or is named hung during a group, the
  chief closes it (`Steps.bsp_close`): the survivors leave at their next check, the
  coordinator's rerun of the lost closure finds the group closed and does nothing, and the
  round in flight is discarded (`Steps.bsp_discard`): the rounds already applied stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer import tfcompat
from trainer.closures import auto_steps_per_closure, median_step_time
from trainer.steps import BSP_CLOSED, Steps
from trainer.waits import (
    CHUNK_POLL_S,
    SETTLE_POLL_S,
    Membership,
    all_hung,
    any_hung,
    barrier,
    fetch_or_none,
    finished,
    pause,
)

AUTO_SAMPLE_STEPS = 4  # one-step rounds measured (after the first) before choosing K
# Groups pay off when the chief's dispatch and barrier are a noticeable share of a round
# (fast devices, many workers); below this share of the round's wall time K stays 1. Set to
# 1.0 (automatic K is always 1 for BSP) until groups are shown faster on a quiet machine and
# with a hung worker in a group (an explicit job.steps_per_closure > 1 still runs groups).
BSP_MIN_CHIEF_SHARE = 1.0


class BspRunner:
    """run(n): up to `n` BSP global steps; returns (steps applied, closure results).

    `steps_per_closure` 0 = automatic: after AUTO_SAMPLE_STEPS one-step rounds (and the
    first, which includes the trace), K = 1 when the chief's share of a round is small
    (`_choose`), else from the median step time as for ASP; reported through
    `on_choice(K, step_time_s)`. `groups` counts the multi-step groups run.
    """

    def __init__(self, coordinator: Any, steps: Steps, args: tuple, workers: int,
                 steps_per_closure: int = 1, membership: Membership | None = None,
                 on_choice: Callable[[int, float], None] | None = None) -> None:
        self.coordinator, self.steps, self.args, self.workers = coordinator, steps, args, workers
        self.k, self.membership = steps_per_closure, membership or Membership()
        self.on_choice = on_choice
        self.groups = 0  # multi-step groups run (this process)
        self.samples: list[tuple[list[Any], float]] = []  # automatic K: (results, wall s)

    def __call__(self, n: int) -> tuple[int, list[Any]]:
        if n <= 1 or self.k in (0, 1) or self.membership.lost or any_hung():
            return self._one_step()  # a group needs every worker; one step reschedules
        return self._group(min(self.k, n))

    def drain(self) -> list[Any]:
        return []  # nothing is left in flight

    def warm(self, groups: bool = True) -> None:
        """Trace BSP's functions now, before a worker can hang: a function first traced
        mid-run is registered with every worker then, which waits for a hung one
        (trainer/asp.py `prepare_unrolled`). With `groups`, the group closure too, run once
        for a group that is not open (it does nothing)."""
        import tensorflow as tf

        steps = self.steps
        with self.coordinator.strategy.scope():  # where `schedule` looks the trace up
            steps.bsp_accumulate.get_concrete_function(*tfcompat.schedule_specs(self.args))
        scalar = tf.TensorSpec([], tf.int64)
        steps.bsp_apply.get_concrete_function()
        steps.bsp_open.get_concrete_function(scalar, scalar)
        steps.bsp_close.get_concrete_function()
        steps.bsp_discard.get_concrete_function()
        if groups:
            self.coordinator.schedule(steps.bsp_rounds, args=(
                *self.args, tf.constant(BSP_CLOSED - 1, tf.int64)))
            self.coordinator.join()

    def _one_step(self) -> tuple[int, list[Any]]:
        started = time.perf_counter()
        results = [self._schedule_accumulate() for _ in range(self.workers)]
        # the barrier; a dead worker's closure is rerun on a survivor, a hung one's too
        results = barrier(results, self._schedule_accumulate, self.coordinator)
        self.steps.bsp_apply()
        if not self.k:
            self.samples.append((results, time.perf_counter() - started))
            if len(self.samples) > AUTO_SAMPLE_STEPS:  # the first one traced the step
                self._choose(self.samples[1:])
                self.samples.clear()
        return 1, results

    def _schedule_accumulate(self) -> Any:
        return self.coordinator.schedule(self.steps.bsp_accumulate, args=self.args)

    def _choose(self, samples: list[tuple[list[Any], float]]) -> None:
        """K from the sampled one-step rounds: 1 when the chief's share of a round (its wall
        time beyond the slowest worker's step) is below BSP_MIN_CHIEF_SHARE, since a group
        saves only that share and its waiting workers poll the PS; else as for ASP."""
        step_time = median_step_time([r for results, _ in samples for r in results])
        shares = []
        for results, wall in samples:
            fetched = [r for r in map(fetch_or_none, results) if r is not None]
            if fetched and wall > 0:
                shares.append(max(0.0, wall - max(float(r[2]) for r in fetched)) / wall)
        if step_time is None or not shares:
            return  # every sample was lost with a worker: measure again
        share = sorted(shares)[len(shares) // 2]
        self.k = 1 if share < BSP_MIN_CHIEF_SHARE else auto_steps_per_closure(step_time)
        if self.on_choice is not None:
            self.on_choice(self.k, step_time)

    def _group(self, n: int) -> tuple[int, list[Any]]:
        import tensorflow as tf

        self.groups += 1
        group_id = tf.constant(self.groups, tf.int64)
        disruptions = self.membership.disruptions
        start = int(self.steps.bsp_open(group_id, tf.constant(n, tf.int64)))
        results = [self.coordinator.schedule(self.steps.bsp_rounds,
                                             args=(*self.args, group_id))
                   for _ in range(self.workers)]
        while True:
            running = [r for r in results if not finished(r)]
            if not running:
                break
            if self.membership.disruptions != disruptions or any_hung(running):
                return self._abandon(results, running) - start, results
            if not tfcompat.watchable(running[0]):
                self.coordinator.join()  # TF internals moved: no failure detection mid-group
                break
            tfcompat.wait_returned(running[0], CHUNK_POLL_S)
        self.coordinator.join()  # raises a closure's error, if any
        return n, results

    def _abandon(self, results: list[Any], running: list[Any]) -> int:
        """A closure failed, or one is held by a hung worker: end the group; the survivors
        leave (a rerun, or the hung closure when it resumes, finds it closed). Returns the
        global step after the round in flight was discarded."""
        self.steps.bsp_close()
        while any(not finished(r) for r in results) and not all_hung(
                [r for r in results if not finished(r)]):
            pause(running[0], SETTLE_POLL_S)
        return int(self.steps.bsp_discard())
