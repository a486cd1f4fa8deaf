"""The ASP runner on the chief: chunks of closures, double-buffered, of K steps each.

Every ASP closure computes gradients on a worker and applies them to the PS directly
(trainer/steps.py). The chief schedules a chunk of closures, then waits for the end of the
chunk before (so workers never idle while the queue, and so the step overshoot, stays
bounded). A full closure of K steps runs the K steps unrolled (`Steps.asp_unrolled`), traced
off the chief's thread (`prepare_unrolled`); the looped `Steps.asp` serves meanwhile and
for shorter closures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer import events
from trainer.closures import (
    CLOSURES_PER_CHUNK_PER_WORKER,
    MAX_AUTO_STEPS_PER_CLOSURE,
    auto_steps_per_closure,
    median_step_time,
    prepare_unrolled,
)
from trainer.waits import settle, wait_for_chunk, warm_on_every_worker

MIN_CLOSURES_PER_CHUNK_PER_WORKER = 2  # with several steps per closure: keep double-buffering


class AspRunner:
    """run(n): schedule up to `n` ASP steps (one chunk of closures of `steps_per_closure`
    steps each, the last one shorter if `n` says so); returns (steps scheduled, results),
    results being RemoteValues of closures that have (almost all) finished.

    Chunks are double-buffered: after scheduling chunk k we wait for the end of chunk k-1.
    `drain()` waits for everything scheduled (before a protocol switch or a checkpoint).
    `steps_per_closure` 0 = automatic: the first chunk runs one step per closure, then K is
    chosen from its measured step times and reported through `on_choice(K, step_time_s)`.

    `unrolled(K)` (Steps.asp_unrolled) gives the closure of exactly K steps without a loop,
    used for every full closure once traced: an explicit K is traced by `warm()`, an
    automatic one in a background thread once chosen (trainer/closures.py `prepare_unrolled`).
    """

    def __init__(self, coordinator: Any, asp_step: Callable, args: tuple, workers: int,
                 steps_per_closure: int = 1,
                 on_choice: Callable[[int, float], None] | None = None,
                 unrolled: Callable[[int], Callable] | None = None) -> None:
        self.coordinator, self.asp_step, self.args = coordinator, asp_step, args
        self.workers, self.k = workers, steps_per_closure
        self.on_choice, self.unrolled = on_choice, unrolled
        self.previous: list[list[Any]] = []  # the chunk scheduled last, not waited for
        self.lagging: list[Any] = []  # closures of earlier chunks not finished with them
        self.counts: dict[int, Any] = {}  # K -> its int64 tensor
        self.ready: dict[int, Callable] = {}  # K -> unrolled closure, traced
        self.sampled_chunks = 0  # automatic K: chunks measured so far

    def __call__(self, n: int) -> tuple[int, list[Any]]:
        scheduled, current = self._schedule_chunk(n)
        done: list[Any] = []
        if self.previous:
            done, self.lagging = wait_for_chunk(self.previous.pop() + self.lagging,
                                                self.workers)
        self.previous.append(current)
        if scheduled == n:  # end of a stretch: drain so that the global step is exact
            done += self.drain()
        if not self.k and done:
            self.sampled_chunks += 1
            if self.sampled_chunks > 1:  # the first chunk's steps include the workers' warm-up
                self._choose(done)
        return scheduled, done

    def drain(self) -> list[Any]:
        pending = (self.previous.pop() if self.previous else []) + self.lagging
        done, self.lagging = settle(pending, self.coordinator)
        return done

    def warm(self) -> None:
        """Trace and instantiate the step now with a closure of zero steps (no batch read, no
        update) on every worker, so that a later switch to ASP does not pay for it: each
        worker instantiates a function at its first run of it (a switch's first ASP step
        took 0.23 s where it landed on a worker that had not run it, 0.03 s elsewhere)."""
        warm_on_every_worker(self.coordinator, self.asp_step,
                             (*self.args, self._count(0)), self.workers)
        # an explicit K: its unrolled closure now too, before the clock starts (an automatic
        # K is known only later, and traced then in the background)
        self._prepare(self.k, background=False)

    def _schedule_chunk(self, n: int) -> tuple[int, list[Any]]:
        k = self.k or 1
        per_worker = max(MIN_CLOSURES_PER_CHUNK_PER_WORKER, CLOSURES_PER_CHUNK_PER_WORKER // k)
        scheduled, chunk = 0, []
        while scheduled < n and len(chunk) < per_worker * self.workers:
            size = min(k, n - scheduled)
            if size == k and k in self.ready:
                chunk.append(self.coordinator.schedule(self.ready[k], args=self.args))
            else:
                chunk.append(self.coordinator.schedule(
                    self.asp_step, args=(*self.args, self._count(size))))
            scheduled += size
        return scheduled, chunk

    def _count(self, k: int) -> Any:
        import tensorflow as tf

        if k not in self.counts:
            self.counts[k] = tf.constant(k, tf.int64)
        return self.counts[k]

    def _choose(self, done: list[Any]) -> None:
        step_time = median_step_time(done)
        if step_time is None:
            return  # every sample was lost with a worker: try again with the next chunk
        self.k = auto_steps_per_closure(step_time)
        self._prepare(self.k)
        if self.on_choice is not None:
            self.on_choice(self.k, step_time)

    def _prepare(self, k: int, background: bool = True) -> None:
        if self.unrolled is None or not 1 < k <= MAX_AUTO_STEPS_PER_CLOSURE:
            return
        started = time.time()

        def use(fn: Callable) -> None:
            self.ready[k] = fn
            events.emit(events.EVENT_CLOSURE_UNROLLED, steps=k,
                        trace_s=round(time.time() - started, 3), protocol="asp")

        prepare_unrolled(self.unrolled(k), self.args, use, background,
                         self.coordinator.strategy.scope)

