"""The BSP runner on the chief: one-step rounds with the barrier on the chief, and groups of
K rounds in one closure per worker with the barrier on the PS.

What a BSP global step costs, per worker (the crossings are pinned by
tests/trainer/test_bsp_cost.py; "per PS" is one tensor for each parameter server holding
weights, trainer/packing.py):

- A one-step round (`Steps.bsp_accumulate`): the chief dispatches one closure per worker;
  each brings the weights in and sends its gradients out (one tensor per PS each, as an
  ASP step), adds them to the packed accumulator (one add per PS) and takes the round's
  ticket; the N-th ticket applies the mean and moves the global step in the same PS-side
  call (`Steps.apply_accumulated`). The chief's barrier (`barrier`, trainer/waits.py) waits
  for the N results (each copied to the chief: one RPC per closure), then dispatches the
  next round. Where a worker waits: from its closure's end until the slowest worker's
  gradient is in and the chief has seen every result and dispatched again (a few ms of the
  chief's Python and RPCs per round, most of a round's cost on 2 loaded cores). Where the
  chief waits: on the slowest closure of the round.
- A round of a group (K rounds in one closure per worker): the weights in and the
  gradients out, one tensor per PS each, nothing else crosses. With one worker
  (`Steps.bsp_rounds(K)`, unrolled) its gradient is the round's mean, applied as it comes
  and masked by the group's checks as ASP's steps are by their ticket (`Steps.ps_round`);
  its group covers every full closure of the stretch (opened once, `Steps.bsp_open`), and
  its closures are double-buffered as ASP's chunks: SOLE_BATCH closures of K rounds are
  scheduled while the batch before still runs, so the worker never waits for the chief's
  turnaround (until 2026-11-28 a group was 8 closures waited for, and the worker idled for
  the turnaround, about 24 ms, once per 8 K steps, about 1 s; measured). With N
  workers the round's barrier is one PS-side call (`Steps.barrier_round`): add, ticket,
  the N-th applies and wakes the N workers through one FIFO queue per admission
  slot on the PS, each worker waits on its queue (a blocking dequeue: no poll, no RPC, none
  of the PS's threads held). Where a worker waits: from its gradient's arrival on the PS
  to the slowest's and the apply. The chief pays one dispatch and one result per worker
  per K steps, and waits for the group's end.

Automatic K is chosen as for ASP (`auto_steps_per_closure` from the sampled one-step
rounds' step time). The looped group closure (`Steps.bsp_looped`: a graph loop over a K
given as a tensor) is traced and run on each worker by `warm`, before training, and serves
any K until the chosen K's unrolled closure, traced in the background, takes over
(`closure_unrolled`). That K comes out about twice ASP's (14 to 17 against 7: the one-step
round's clock leaves out the update, ASP's includes the wait for it), and its trace took 4
to 10 s on 2 cores. Timing the update too gave K = 3 to 5, whose groups ran at 60 to 95
global steps/s against 107 to 124 at K = 14 to 17: kept as it is. Looped throughout,
2-worker BSP ran at 39 to 47 steady global steps/s, 0.62 of ASP's examples/s (median of 3
pairs); with the unrolled closure taking over, 48 to 60, 0.97 (2026-11-28, 2 cores). Until
2026-11-28 the sole worker ran one-step rounds during its trace (44 to 57 global steps/s,
against 47 to 67 looped, in 4 runs). An explicit `job.steps_per_closure` runs
the unrolled closure of that K, traced by `warm`. A stretch's last rounds, fewer than K, run
in the looped closure too (one-step rounds, a barrier on the chief each, took up to 0.3 s at
the end of a 1-worker run: 7 to 17 steps at 24 to 50 global steps/s, against ASP's short
last closure at 70 to 90). A mid-run trace has a price (for ASP's
too): a worker that hangs before it is registered holds the chief until the worker
resumes (trainer/closures.py `prepare_unrolled`).

Before 2026-11-25: automatic K was 1 for every BSP run, each round ended with an apply
call from the chief after its barrier, each worker added one tensor per weight to its own
accumulator, and the group closure looped its rounds in a `tf.while_loop` (split into a
worker loop and a PS loop kept in step by RPCs on every iteration). Until the wake
queues (2026-11-25, later), automatic K was 1 with several workers: a group's waiting
workers polled the PS (the round's outcome back, then one int64 pair per poll) and
measured slower than one-step rounds (20 against 30 global steps/s, 2 workers, 2 loaded
cores).

Exactly once: a group of K global steps is N closures, one per worker, each running the
same K rounds; a group needs all N workers at once (each worker runs one closure at a
time, so N closures land on N workers). The sole worker's group runs its closures one after
the other, each round applied only at the step it expects and below the group's stop; the
steps of its batches are reported to the loop when scheduled, as ASP's, and those an
abandoned group did not apply are taken back (a negative count: the loop runs them again). Every round is one update from one gradient of
every worker, and the group stops at the step the chief opened it for (`bsp_stop`). When
a worker fails or is named hung during a group, the chief closes it (`Steps.bsp_close`):
the survivors' remaining rounds apply nothing, the coordinator's rerun of the lost closure
finds the group closed (or full: its admission ticket comes late) and applies nothing, and
the round in flight is discarded (`Steps.bsp_discard`): the rounds already applied stay.
The close wakes every slot's queue, so a survivor waiting at the barrier goes on at once
(its remaining rounds apply nothing).
While a worker is lost or named hung, one-step rounds run and the survivors take its
share: its closure is scheduled again for a survivor by `barrier` (hung) or by the
coordinator (lost), so every step still averages N gradients. A closure that ends late (a
hung worker's, resumed) adds its gradient to a later round, whose mean divides by the
count: at least once, as after a worker loss; the apply itself checks the step it was
expected for, so no round is applied twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer import events, tfcompat
from trainer.closures import (
    CLOSURES_PER_CHUNK_PER_WORKER,
    MAX_AUTO_STEPS_PER_CLOSURE,
    auto_steps_per_closure,
    median_step_time,
    prepare_unrolled,
)
from trainer.steps import Steps
from trainer.variables import BSP_CLOSED
from trainer.waits import (
    CHUNK_POLL_S,
    SETTLE_POLL_S,
    Membership,
    all_hung,
    any_hung,
    barrier,
    finished,
    pause,
    warm_on_every_worker,
)

AUTO_SAMPLE_STEPS = 4  # one-step rounds measured (after the first) before choosing K
# The sole worker's closures per batch: two batches in flight, as ASP's double buffer
SOLE_BATCH = CLOSURES_PER_CHUNK_PER_WORKER // 2


class BspRunner:
    """run(n): up to `n` BSP global steps; returns (steps applied, or with the sole worker
    scheduled, as ASP's, less those it reported before and lost; closure results).

    `steps_per_closure` 0 = automatic: after AUTO_SAMPLE_STEPS one-step rounds (and the
    first, which includes the trace), K from the median step time as for ASP, reported
    through `on_choice(K, step_time_s)`; its unrolled group closure is traced in the
    background (trainer/closures.py `prepare_unrolled`) and the looped closure traced by
    `warm` serves meanwhile, and serves a stretch's last rounds fewer than K.
    `groups` counts the multi-step groups run.
    """

    def __init__(self, coordinator: Any, steps: Steps, args: tuple, workers: int,
                 steps_per_closure: int = 1, membership: Membership | None = None,
                 on_choice: Callable[[int, float], None] | None = None) -> None:
        self.coordinator, self.steps, self.args, self.workers = coordinator, steps, args, workers
        self.k, self.membership = steps_per_closure, membership or Membership()
        self.on_choice = on_choice
        self.groups = 0  # multi-step groups run (this process)
        self.samples: list[list[Any]] = []  # automatic K: one-step rounds' results
        self.ready: dict[int, Callable] = {}  # K -> group closure, traced
        self.requested: set[int] = set()  # K whose group closure is (being) traced
        self.looped: Callable | None = None  # the looped group closure, traced by `warm`
        self.counts: dict[int, Any] = {}  # K -> its int64 tensor (the looped closure's)
        self.abandoned: list[Any] = []  # hung workers' closures of abandoned groups
        # the sole worker's open group: its batches in flight (oldest first), the steps it
        # may still schedule, the global step after every step reported to the loop
        self.inflight: list[list[Any]] = []
        self.group_left, self.reported_end, self.disruptions = 0, 0, 0
        self.group_id: Any = None

    def __call__(self, n: int) -> tuple[int, list[Any]]:
        if self.k > 1 and self.k not in self.requested:  # chosen, or an explicit K not warmed
            self._prepare(self.k)
        # No group while a hung worker's closure of an abandoned group still runs (it has
        # resumed and not yet left): seen 2026-11-28, a group opened then never ended (its
        # first worker waited in the round, the resumed worker's thread sat idle), in 1
        # run of 3 under load; 0 of 5 with this rule. One-step rounds serve meanwhile.
        self.abandoned = [r for r in self.abandoned if not finished(r)]
        size = self._group_size(n)
        if not size or self.membership.lost or any_hung() or self.abandoned:
            if self.inflight:  # the sole worker's group first (its end, or its abandon)
                done, lost = self._wait_sole(0)
                if lost:
                    return -lost, done  # reported, never applied: the loop asks again
            self.group_left = 0  # the sole worker's group ends (the rest: one-step rounds)
            return self._one_step()  # a group needs every worker; one step reschedules
        if self.workers == 1:
            return self._sole_batch(n)
        return self._group(size)

    def drain(self) -> list[Any]:
        """Wait for the sole worker's batches in flight; its group ends here (a switch to
        ASP may move the global step past its stop before the next stretch opens another)."""
        done, _ = self._wait_sole(0)  # lost steps: the loop's accounting reads the step
        self.group_left = 0
        return done

    def warm(self, groups: bool = True) -> None:
        """Trace BSP's functions now, before a worker can hang: a function first traced
        mid-run is registered with every worker then, which waits for a hung one
        (trainer/closures.py `prepare_unrolled`). With `groups`, the looped group closure
        too, which serves every K until the chosen K's unrolled closure is traced, and a
        stretch's last rounds fewer than K; with an explicit K, that K's unrolled closure as
        well. Each is run once on each worker (`warm_on_every_worker`: a worker
        instantiates a function at its first run of it) for a group that is not open (it
        applies nothing)."""
        import tensorflow as tf

        steps = self.steps
        with self.coordinator.strategy.scope():  # where `schedule` looks the trace up
            steps.bsp_accumulate.get_concrete_function(*tfcompat.schedule_specs(self.args))
        scalar = tf.TensorSpec([], tf.int64)
        steps.bsp_apply.get_concrete_function()
        steps.bsp_open.get_concrete_function(scalar, scalar)
        steps.bsp_close.get_concrete_function()
        steps.bsp_discard.get_concrete_function()
        if not groups:
            return
        closed = tf.constant(BSP_CLOSED - 1, tf.int64)
        looped_args = (*self.args, closed, self._count(1))
        with self.coordinator.strategy.scope():
            self.looped = steps.bsp_looped.get_concrete_function(
                *tfcompat.schedule_specs(looped_args))
        warm_on_every_worker(self.coordinator, self.looped, looped_args, self.workers)
        if self.k:
            self._prepare(self.k, background=False)
            if self.k in self.ready:
                warm_on_every_worker(self.coordinator, self.ready[self.k], (
                    *self.args, tf.constant(BSP_CLOSED - 1, tf.int64)), self.workers)

    def _prepare(self, k: int, background: bool = True) -> None:
        """Trace the group closure of `k` rounds (now, or in the background)."""
        import tensorflow as tf

        if not 1 < k <= MAX_AUTO_STEPS_PER_CLOSURE or k in self.requested:
            return
        self.requested.add(k)

        started = time.time()

        def use(fn: Callable) -> None:
            self.ready[k] = fn
            events.emit(events.EVENT_CLOSURE_UNROLLED, steps=k,
                        trace_s=round(time.time() - started, 3), protocol="bsp")

        prepare_unrolled(self.steps.bsp_rounds(k), (*self.args, tf.constant(0, tf.int64)),
                         use, background, self.coordinator.strategy.scope)

    def _one_step(self) -> tuple[int, list[Any]]:
        results = [self._schedule_accumulate() for _ in range(self.workers)]
        # the barrier; a dead worker's closure is rerun on a survivor, a hung one's too
        results = barrier(results, self._schedule_accumulate, self.coordinator)
        if not self.k:
            self.samples.append(results)
            if len(self.samples) > AUTO_SAMPLE_STEPS:  # the first one traced the step
                self._choose([r for results in self.samples[1:] for r in results])
                self.samples.clear()
        return 1, results

    def _group_size(self, n: int) -> int:
        """Rounds per closure of the next group for a stretch with `n` steps left: K once
        its closure (or the looped one) is traced; the last `n` < K in the looped closure
        (one-step rounds, with a barrier on the chief each, took up to a third of a second
        at a stretch's end); 0: one-step rounds."""
        if self.k > 1 and n >= self.k and self._closure(self.k) is not None:
            return self.k
        if self.group_left or (1 < n < self.k and self.looped is not None):
            return n  # (the sole worker's open group: its last rounds, if only one)
        return 0

    def _closure(self, k: int) -> tuple[Callable, tuple] | None:
        """The group closure of `k` rounds and its arguments after the group's; None where
        none is traced (one-step rounds serve)."""
        if k in self.ready:
            return self.ready[k], ()
        if self.looped is not None and k >= 1:
            return self.looped, (self._count(k),)
        return None

    def _count(self, k: int) -> Any:
        import tensorflow as tf

        if k not in self.counts:
            self.counts[k] = tf.constant(k, tf.int64)
        return self.counts[k]

    def _schedule_accumulate(self) -> Any:
        return self.coordinator.schedule(self.steps.bsp_accumulate, args=self.args)

    def _choose(self, results: list[Any]) -> None:
        """K from the sampled one-step rounds' median step time, as for ASP."""
        step_time = median_step_time(results)
        if step_time is None:
            return  # every sample was lost with a worker: measure again
        self.k = auto_steps_per_closure(step_time)
        self._prepare(self.k)  # the looped closure (`warm`) serves meanwhile
        if self.on_choice is not None:
            self.on_choice(self.k, step_time)

    def _open(self, steps: int) -> int:
        """Open the next group for `steps` global steps; returns its first global step."""
        import tensorflow as tf

        self.groups += 1
        self.group_id = tf.constant(self.groups, tf.int64)
        self.disruptions = self.membership.disruptions
        return int(self.steps.bsp_open(self.group_id, tf.constant(steps, tf.int64)))

    def _schedule_group(self, sizes: list[int]) -> list[Any]:
        """One closure of the open group per item of `sizes` (its rounds)."""
        results = []
        for size in sizes:
            found = self._closure(size)
            assert found is not None  # `__call__` runs groups only when one is traced
            closure, extra = found
            results.append(self.coordinator.schedule(
                closure, args=(*self.args, self.group_id, *extra)))
        return results

    def _sole_batch(self, n: int) -> tuple[int, list[Any]]:
        """The sole worker's groups, double-buffered as ASP's chunks: one group for the
        stretch's `n` steps (its full closures only, where no looped closure is traced for
        the last rounds), scheduled SOLE_BATCH closures at a time;
        each call schedules a batch, then waits for the one before (for all at the group's
        end), so the worker never idles for the chief's turnaround. Returns (steps
        scheduled, less those reported before and lost with an abandoned group; results)."""
        k = self.k
        if not self.group_left:  # with no looped closure, the rest < K runs one step each
            self.group_left = n if self.looped is not None else (n // k) * k
            self.reported_end = self._open(self.group_left)
        sizes, left = [], min(self.group_left, n)
        while len(sizes) < SOLE_BATCH and left > 0:
            sizes.append(min(k, left))  # K, or the last rounds (`_group_size`)
            left -= sizes[-1]
        self.inflight.append(self._schedule_group(sizes))
        self.group_left -= sum(sizes)
        self.reported_end += sum(sizes)
        done, lost = self._wait_sole(1 if self.group_left else 0)
        return sum(sizes) - lost, done

    def _wait_sole(self, keep: int) -> tuple[list[Any], int]:
        """Wait until at most `keep` of the sole worker's batches are in flight; returns
        (their finished results, steps reported and not applied). A failed closure or the
        worker named hung ends the group (`_abandon`) with every batch in flight."""
        done: list[Any] = []
        waited = len(self.inflight) > keep
        while len(self.inflight) > keep:
            running = [r for r in self.inflight[0] if not finished(r)]
            if not running:
                done += self.inflight.pop(0)
                continue
            if self.membership.disruptions != self.disruptions or any_hung(running):
                results = [r for batch in self.inflight for r in batch]
                self.inflight, self.group_left = [], 0
                step = self._abandon(results, [r for r in results if not finished(r)])
                return done + [r for r in results if finished(r)], self.reported_end - step
            if not tfcompat.watchable(running[0]):
                self.coordinator.join()  # TF internals moved: no failure detection mid-group
                done += [r for batch in self.inflight for r in batch]
                self.inflight = []
                break
            tfcompat.wait_returned(running[0], CHUNK_POLL_S)
        if waited and not self.inflight:
            # raises a closure's error, if any; not when nothing was waited for: a hung
            # worker's closure left from an abandoned group would hold it
            self.coordinator.join()
        return done, 0

    def _group(self, k: int) -> tuple[int, list[Any]]:
        """A group of `k` global steps with several workers: one closure of `k` rounds per
        worker, waited for."""
        start = self._open(k)
        disruptions = self.disruptions
        results = self._schedule_group([k] * self.workers)
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
        return k, results

    def _abandon(self, results: list[Any], running: list[Any]) -> int:
        """A closure failed, or one is held by a hung worker: end the group; the survivors
        leave (a rerun, or the hung closure when it resumes, finds it closed). Returns the
        global step after the round in flight was discarded."""
        self.steps.bsp_close()
        while any(not finished(r) for r in results) and not all_hung(
                [r for r in results if not finished(r)]):
            pause(running[0], SETTLE_POLL_S)
        self.abandoned += [r for r in results if not finished(r)]  # held by hung workers
        return int(self.steps.bsp_discard())
