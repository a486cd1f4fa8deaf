"""Step functions (ASP and BSP) over the same PS variables, and the chief's runners.

- ASP: every closure computes a gradient on a worker and applies it to the PS directly.
- BSP: a global step schedules one accumulate closure per worker, waits for all of them
  (`barrier`), then one apply on the PS averages the accumulated gradients by their count
  and updates the weights. A lost worker's closure is rescheduled on a survivor by the
  coordinator, a hung worker's by `barrier` once the heartbeat names it, so the barrier
  never waits on a dead or hung worker; dividing by the count (not by the worker count)
  keeps the average right if that closure ran twice.

Steps per closure: one closure may run several steps in a loop on its worker, so that the
chief's cost per closure (Python dispatch, one RPC round) is paid once per K steps.
`job.steps_per_closure` fixes K; 0 picks it from the measured on-worker step time so that a
closure lasts about TARGET_CLOSURE_S (`auto_steps_per_closure`); the first steps of each
protocol run one per closure to measure it (BSP keeps K = 1 when the chief's share of a round
is small: a group saves only that share, `bsp_runner`). Counts are tensor arguments (or PS variables),
so a short last closure keeps budgets exact without a retrace.

- ASP: each step of a closure has its own batch, gradient and update, exactly as if the steps
  had been scheduled one by one. A full closure of K steps runs the K steps unrolled (one
  traced function per K, `asp_unrolled`), not in a `tf.range` loop: a loop over steps that
  read and update PS variables is split into a worker loop and a PS loop kept in step by RPCs
  on every iteration (measured: unrolled ~14 % more steps/s at K = 8 on the digits CNN).
- BSP (`bsp_runner`): a *group* of K global steps is N closures, one per worker, each running
  the same K synchronous rounds. A round is the barrier of one global step, held on the PS
  instead of by the chief: every worker adds its gradient to the accumulators, then takes a
  ticket (`ResourceCountUpTo` on a PS counter: an atomic fetch-and-increment); the worker
  holding the N-th ticket applies the mean of the N gradients, resets the accumulators and
  only then increments the global step; the others wait until it moved (polling the PS,
  pauses from BARRIER_POLL_S doubling to BARRIER_POLL_MAX_S), then start the next round on
  the new weights. So every global step is still exactly one update from one gradient of every worker, and
  the group stops exactly at the step the chief opened it for (`bsp_stop`). A group needs all
  N workers at once (each worker runs one closure at a time, so N closures land on N
  workers); while a worker is lost, BSP runs one step per closure as before (the barrier on
  the chief, a dead worker's closure rerun on a survivor). When a worker fails during a
  group, the chief closes the group (`bsp_group`): the survivors leave at their next
  check, the coordinator's rerun of the lost closure finds the group closed and does
  nothing (a late `bsp_joined` ticket also keeps reruns out of a group still open), and the
  round in flight is discarded (its partial gradients zeroed, no update): the lost worker
  loses at most the closure in flight, the rounds already applied stay.

Every worker closure returns the float64 vector `[loss, worker_id, step_time_s, steps]`:
`loss` of its last step, `worker_id` the index of the worker that ran it (a per-worker
resource, re-created by the coordinator when a worker comes back), `step_time_s` the mean
time of its `steps` steps, each measured with `tf.timestamp()` on the worker from before the
batch is read to when the loss (so the gradient) is computed; the update RPCs to the PS that
follow are not included. It includes an injected straggler delay (`spec.stragglers`), which
sleeps inside the step on the worker (a tf.data sleep: no CPU is burnt; tf.py_function
would not run on a remote worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer import events
from trainer.spec import StragglerSpec

CLOSURES_PER_CHUNK_PER_WORKER = 8  # ASP closures scheduled between two host syncs
MIN_CLOSURES_PER_CHUNK_PER_WORKER = 2  # with several steps per closure: keep double-buffering
CHUNK_POLL_S = 0.005  # how often the chief re-counts a chunk's unfinished closures
SETTLE_POLL_S = 0.05  # how often a drain re-counts (and re-reads the hung workers)
COPY_POLL_S = 0.001  # how often a wait re-checks a result being copied to the chief
UNKNOWN_WORKER = -1
# Automatic steps per closure: a closure should last about this long on its worker, so the
# chief's per-closure cost (a few ms of Python and RPC) stays a small share of it, while a
# control request or a phase boundary still waits at most this long for a closure to end.
TARGET_CLOSURE_S = 0.05
MAX_AUTO_STEPS_PER_CLOSURE = 32
TRACE_NICE = 10  # the background trace of an unrolled closure (prepare_unrolled)
AUTO_SAMPLE_STEPS = 4  # BSP: one-step closures measured (after the first) before choosing K
# BSP groups pay off when the chief's dispatch and barrier are a noticeable share of a round
# (fast devices, many workers); below this share of the round's wall time K stays 1. Set to
# 1.0 (automatic K is always 1 for BSP) until groups are shown faster on a quiet machine and
# with a hung worker in a group (an explicit job.steps_per_closure > 1 still runs groups).
BSP_MIN_CHIEF_SHARE = 1.0
BSP_CLOSED = -1  # `bsp_group` value of no open group
BARRIER_POLL_S = 0.0005  # first pause of a BSP worker waiting at a round's barrier
BARRIER_POLL_MAX_S = 0.016  # the pause doubles up to this
TICKET_LIMIT = 2 ** 62  # ResourceCountUpTo needs a limit; never reached


class Membership:
    """What the chief knows of its workers' health, fed by the coordinator's log records
    (trainer/meter.py): `disruptions` counts every failed closure (a lost worker or a
    transient failure whose closure is put back), `lost` holds the workers failed and not
    rejoined. Written by the coordinator's threads, read by the chief's main thread."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.disruptions = 0
        self.lost: set[int] = set()

    def failed(self, worker: int | None, lost: bool) -> None:
        with self._lock:
            self.disruptions += 1
            if lost and worker is not None:
                self.lost.add(worker)

    def rejoined(self, worker: int) -> None:
        with self._lock:
            self.lost.discard(worker)


def fetch_or_none(remote: Any) -> Any:
    """A closure's value, or None if the worker that computed it is gone.

    A finished closure's result lives on its worker: after a worker loss, fetching it raises
    UnavailableError even though the coordinator already moved on (or reran the closure
    elsewhere). Monitoring must never take the chief down for a lost worker.
    """
    import tensorflow as tf

    try:
        return remote.fetch()
    except (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
            tf.errors.NotFoundError, tf.errors.InternalError):
        return None
    except Exception as exc:  # the coordinator's own wrapper of a worker failure
        if "job:ps" in str(exc) or "job:worker" not in str(exc):
            raise
        return None


def per_worker_ids(coordinator: Any, workers: int) -> Any:
    """A PerWorkerValues whose slice on worker i is the int32 scalar i.

    TF has no public way to build one (`input_context.input_pipeline_id` is 0 on every PSS
    worker), so this uses the coordinator's per-worker resource closures, the mechanism
    behind per-worker datasets: they are re-run when a worker recovers. Falls back to the
    constant UNKNOWN_WORKER if those internals moved.
    """
    import tensorflow as tf

    try:
        from tensorflow.python.distribute.coordinator.values import PerWorkerValues

        def id_fn(i: int) -> Callable:
            return tf.function(lambda: tf.constant(i, tf.int32))

        return PerWorkerValues(tuple(w.create_resource(id_fn(w.worker_index))
                                     for w in coordinator._cluster.workers))
    except (AttributeError, ImportError, TypeError, AssertionError) as exc:
        print(f"[chief] per-worker ids unavailable ({exc!r}): worker_steps report -1",
              flush=True)
        return tf.constant(UNKNOWN_WORKER, tf.int32)


def straggler_delay(stragglers: list[StragglerSpec], worker_id: Any, elapsed_s: Any,
                    step: Any) -> Any:
    """In-graph: the delay (float64 seconds) for this worker now; the longest active one."""
    import tensorflow as tf

    delay = tf.constant(0.0, tf.float64)
    step = tf.cast(step, tf.int64)
    for s in stragglers:
        member = tf.reduce_any(tf.equal(tf.cast(worker_id, tf.int32),
                                        tf.constant(s.workers, tf.int32)))
        active = tf.constant(False)
        if s.start_s is not None:
            within = elapsed_s >= s.start_s
            if s.end_s is not None:
                within = tf.logical_and(within, elapsed_s < s.end_s)
            active = tf.logical_or(active, within)
        if s.start_step is not None:
            within = step >= s.start_step
            if s.end_step is not None:
                within = tf.logical_and(within, step < s.end_step)
            active = tf.logical_or(active, within)
        delay = tf.maximum(delay, tf.where(tf.logical_and(member, active),
                                           tf.constant(s.delay_s, tf.float64), 0.0))
    return delay


def sleep(seconds: Any) -> Any:
    """In-graph sleep on the device running the function; returns a tensor to depend on."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    micros = tf.cast(seconds * 1e6, tf.int64)
    ds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).apply(testing.sleep(micros))
    return ds.take(1).reduce(tf.constant(0, tf.int64), lambda a, b: a + b)


@dataclass
class Steps:
    """The tf.functions of both protocols (see the module docstring)."""

    asp: Callable  # worker: (iterator, worker_id, steps) -> result vector
    asp_unrolled: Callable[[int], Callable]  # K -> worker fn (iterator, worker_id): K steps
    asp_open: Callable  # chief: (stop) -> None; ASP steps past global step `stop` are dropped
    bsp_accumulate: Callable  # worker: (iterator, worker_id) -> result vector
    bsp_apply: Callable  # chief, ops on the PS: one update from the accumulated gradients
    bsp_rounds: Callable  # worker: (iterator, worker_id, group) -> result vector
    bsp_open: Callable  # chief: (group, steps) -> global step at the group's start
    bsp_close: Callable  # chief: () -> None; the open group's closures leave at their next check
    bsp_discard: Callable  # chief, after the group ended: drop its partial round; -> global step


def build_steps(strategy: Any, model: Any, optimizer: Any, job: Any, v: Any,
                stragglers: list[StragglerSpec], workers: int) -> Steps:
    """The step functions over the PS variables in `v`: global_step, grad_count,
    accumulators, bsp_gradients, bsp_updates, train_epoch (unix s of the chief's
    train_start, for time-based straggler episodes), ASP's asp_tickets and asp_stop, and the
    BSP group's bsp_group, bsp_stop, bsp_joined, bsp_tickets. `workers`: the gradients per
    BSP round."""
    import tensorflow as tf

    from trainer.optim import lr_tensor, tf_var
    from trainer.packing import Packing

    # the weights come in and the gradients go out as one tensor per PS (trainer/packing.py);
    # the model runs on those values (Keras' stateless call), and its new statistics (batch
    # norm's moving averages) are written back as its own call would have written them
    weights = Packing(optimizer.variables)  # model.trainable_variables, in order
    statistics = Packing([tf_var(s) for s in model.non_trainable_variables])
    decayed = [len(w.shape) > 1 for w in weights.variables]  # weight decay skips biases, BN

    def loss_and_grads(batch: Any) -> tuple[Any, list[Any]]:
        """The loss, and the gradients placed on their variables' parameter servers."""
        images, labels = batch
        values, stats = weights.read(), statistics.read()
        with tf.GradientTape() as tape:
            tape.watch(values)
            logits, new_stats = model.stateless_call(values, stats, images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
            if job.weight_decay:
                loss += job.weight_decay * tf.add_n(
                    [tf.nn.l2_loss(w) for w, d in zip(values, decayed, strict=True) if d])
        grads = tape.gradient(loss, values)
        for var, value in zip(statistics.variables, statistics.to_variables(new_stats),
                              strict=True):
            var.assign(value, read_value=False)
        return loss, weights.to_variables(grads)

    def current_lr() -> Any:
        # computed where the step counter lives: the updates on the PS use it, and a worker
        # would otherwise fetch two scalars and send the rate back on every step
        with tf.device(v.global_step.device):
            return lr_tensor(v.global_step, job, optimizer.learning_rate)

    def timed(iterator: Any, worker_id: Any, body: Callable) -> Any:
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            if stragglers:
                delay = straggler_delay(stragglers, worker_id,
                                        started - v.train_epoch.read_value(),
                                        v.global_step.read_value())
                slept = tf.cond(delay > 0, lambda: sleep(delay),
                                lambda: tf.constant(0, tf.int64))
                deps = [slept]
            else:
                deps = []
        with tf.control_dependencies(deps):
            batch = next(iterator)
        loss = strategy.run(body, args=(batch,))
        with tf.control_dependencies([loss]):
            ended = tf.timestamp()
        return tf.cast(loss, tf.float64), ended - started

    def result(loss: Any, worker_id: Any, seconds: Any, steps: Any) -> Any:
        # one float64 vector, not four tensors: the coordinator copies every closure output
        # to the chief, one RPC per tensor
        return tf.stack([loss, tf.cast(worker_id, tf.float64), seconds,
                         tf.cast(steps, tf.float64)])

    def ticket(var: Any) -> Any:
        """Atomic fetch-and-increment of an int64 PS variable: the value before."""
        return tf.raw_ops.ResourceCountUpTo(resource=var.handle, limit=TICKET_LIMIT,
                                            T=tf.int64)

    # The updates are not chained to the returned loss: forcing that order serialises the
    # PS round trips and cost ~15 % of ASP throughput. The function still ends only after
    # every update (automatic control dependencies); step_time_s ends at the loss.
    def asp_body(batch: Any) -> Any:
        loss, grads = loss_and_grads(batch)
        # the step's ticket, taken on the PS once its gradient is there: below the stretch's
        # stop, the update is applied and counted; past it (a closure TensorFlow ran again
        # after a worker loss, or one a hung worker finished late), the step is dropped
        with tf.device(v.global_step.device), tf.control_dependencies(grads):
            take = ticket(v.asp_tickets) < v.asp_stop.read_value()
        optimizer.apply(grads, current_lr(), take)
        with tf.device(v.global_step.device):
            v.global_step.assign_add(tf.cast(take, tf.int64))
        return loss

    def accumulate_body(batch: Any) -> Any:
        loss, grads = loss_and_grads(batch)
        for acc, grad in zip(v.accumulators, grads, strict=True):
            acc.assign_add(grad)
        v.grad_count.assign_add(1.0)
        return loss

    def asp_steps(iterator: Any, worker_id: Any, loop: Any, steps: Any) -> Any:
        """`steps` ASP steps, one per item of `loop`: a `tf.range` (a graph loop) or a Python
        `range` (unrolled at trace time)."""
        loss, total = tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)
        for _ in loop:
            loss, seconds = timed(iterator, worker_id, asp_body)
            total += seconds
        return result(loss, worker_id, total / tf.cast(tf.maximum(steps, 1), tf.float64), steps)

    @tf.function
    def asp_step(iterator: Any, worker_id: Any, steps: Any) -> Any:
        # `steps` is an int64 tensor: one trace serves every closure length
        return asp_steps(iterator, worker_id, tf.range(steps), steps)

    unrolled: dict[int, Callable] = {}

    def asp_unrolled(k: int) -> Callable:
        """The ASP closure of exactly `k` steps, unrolled in Python (one traced function per
        K): the same steps as `asp_step`'s loop without its cost. A `tf.range` loop whose
        body reads and updates variables on the PS becomes a while loop split between the
        worker and the PS, synchronised by RPCs on every iteration (A/B on the digits CNN at
        K = 8: 50 steps/s looped, 57 unrolled; docs/benchmarks.md has the dispatch
        figures). Each step still reads the weights
        the previous one updated: ops on the same variable run in program order."""
        if k not in unrolled:
            @tf.function
            def asp_k(iterator: Any, worker_id: Any) -> Any:
                return asp_steps(iterator, worker_id, range(k), k)

            unrolled[k] = asp_k
        return unrolled[k]

    @tf.function
    def bsp_accumulate(iterator: Any, worker_id: Any) -> Any:
        loss, seconds = timed(iterator, worker_id, accumulate_body)
        return result(loss, worker_id, seconds, 1)

    with tf.device(v.global_step.device):  # one applier at a time: check, then apply
        exclusive = tf.CriticalSection(name="bsp_apply")

    def apply_accumulated(expected: Any, group: Any = None) -> Any:
        """One update from the mean of the accumulated gradients, then the accumulators and
        tickets reset and the counters moved, the global step last (a BSP round's waiters go
        on when it moves), if the global step is still `expected` (and the BSP group `group`
        still open); returns the global step after.

        Exactly one update per global step, whoever dies when: every op runs on a PS, its
        inputs read there, so once the PS holds the request it completes the update, the
        resets and the step together even if the worker that sent it is killed meanwhile.
        (An op left on the worker, as `tf.zeros_like` and a cast were, made the PS wait for
        it: a worker killed in the apply left the update applied and the step unmoved, one
        update too many.) The check of the step and the group and the apply hold a mutex on
        the PS (`tf.CriticalSection`), so of two appliers of one round (a closure of a closed
        group, hung or rerun, that took a ticket in a later round) one applies, and a stale
        one never does."""
        ps = v.global_step.device

        def apply() -> Any:
            count = v.grad_count.read_value()
            means = []
            for acc in v.accumulators:
                with tf.device(acc.device):
                    means.append(acc.read_value() / count)
            with tf.control_dependencies(optimizer.apply(means, current_lr())):
                resets = []
                for acc in v.accumulators:
                    with tf.device(acc.device):
                        resets.append(acc.assign(tf.zeros(acc.shape, acc.dtype),
                                                 read_value=False))
                resets += [v.grad_count.assign(0.0, read_value=False),
                           v.bsp_tickets.assign(0, read_value=False),
                           v.bsp_gradients.assign_add(tf.cast(count, tf.int64),
                                                      read_value=False),
                           v.bsp_updates.assign_add(1, read_value=False)]
            with tf.control_dependencies(resets):
                return v.global_step.assign_add(1)

        def check_and_apply() -> Any:
            current = v.global_step.read_value()
            go = tf.equal(current, expected)
            if group is not None:
                go = tf.logical_and(go, tf.equal(v.bsp_group.read_value(), group))
            return tf.cond(go, apply, lambda: current)

        with tf.device(ps):
            return exclusive.execute(check_and_apply, exclusive_resource_access=False)

    @tf.function
    def bsp_apply() -> None:
        # on the chief, after the barrier: the only applier of a one-step round
        with tf.device(v.global_step.device):
            apply_accumulated(v.global_step.read_value())

    # BSP rounds (module docstring): the barrier of each global step is held on the PS
    quorum = tf.constant(workers, tf.int64)
    pending: list[Any] = []  # the accumulate ops of the round being built

    def rounds_body(batch: Any) -> Any:
        loss, grads = loss_and_grads(batch)
        pending[:] = [acc.assign_add(grad, read_value=False)
                      for acc, grad in zip(v.accumulators, grads, strict=True)]
        pending.append(v.grad_count.assign_add(1.0, read_value=False))
        return loss

    def wait_round(step: Any, group: Any) -> Any:
        # polls the PS until the applier moved the global step or the chief closed the group;
        # the pause doubles from BARRIER_POLL_S to BARRIER_POLL_MAX_S, so a short wait costs
        # little latency and a long one (a straggler) few RPCs. Not a blocking dequeue on the
        # PS: a call blocked for a while draws gRPC keepalive pings without data, which TF's
        # servers answer with GOAWAY "too many pings" (measured: the run failed)
        def waiting(seen: Any, open_group: Any, pause: Any) -> Any:
            return tf.logical_and(tf.equal(seen, step), tf.equal(open_group, group))

        def poll(seen: Any, open_group: Any, pause: Any) -> tuple[Any, Any, Any]:
            with tf.control_dependencies([seen, open_group]):
                slept = sleep(pause)
            with tf.control_dependencies([slept]):
                return (v.global_step.read_value(), v.bsp_group.read_value(),
                        tf.minimum(pause * 2.0, BARRIER_POLL_MAX_S))

        with tf.control_dependencies([step]):
            first = (v.global_step.read_value(), v.bsp_group.read_value(),
                     tf.constant(BARRIER_POLL_S, tf.float64))
        seen, _, _ = tf.while_loop(waiting, poll, first)
        return seen

    @tf.function
    def bsp_rounds(iterator: Any, worker_id: Any, group: Any) -> Any:
        joined = ticket(v.bsp_joined)  # a rerun of a lost worker's closure comes late
        with tf.control_dependencies([joined]):
            step = v.global_step.read_value()
            stop, open_group = v.bsp_stop.read_value(), v.bsp_group.read_value()
        go = tf.logical_and(tf.logical_and(joined < quorum, tf.equal(open_group, group)),
                            step < stop)
        zero = tf.constant(0.0, tf.float64)

        def round_(go: Any, step: Any, rounds: Any, loss: Any, total: Any) -> tuple:
            with tf.control_dependencies([go, step]):  # after the previous round ended
                loss, seconds = timed(iterator, worker_id, rounds_body)
            with tf.control_dependencies([*pending, loss]):
                mine = ticket(v.bsp_tickets)
            # from the N-th ticket on, every gradient of the round is in the accumulators; a
            # stale closure's ticket may come first, so every such holder tries: the apply's
            # check lets one through (`apply_accumulated`), the others then find it moved
            after = tf.cond(mine + 1 >= quorum, lambda: apply_accumulated(step, group),
                            lambda: wait_round(step, group))
            with tf.control_dependencies([after]):
                stop, open_group = v.bsp_stop.read_value(), v.bsp_group.read_value()
            moved = after > step
            go = tf.logical_and(tf.logical_and(moved, after < stop),
                                tf.equal(open_group, group))
            return go, after, rounds + tf.cast(moved, tf.int64), loss, total + seconds

        _, _, rounds, loss, total = tf.while_loop(
            lambda go, *_: go, round_, (go, step, tf.constant(0, tf.int64), zero, zero))
        return result(loss, worker_id, total / tf.cast(tf.maximum(rounds, 1), tf.float64),
                      rounds)

    @tf.function
    def asp_open(stop: Any) -> None:
        """ASP steps from now on are applied until the global step reaches `stop`: the
        tickets left are set to the steps left. The tickets are read before the step, so a
        step landing between the two reads (a hung worker's, late) leaves the stretch one
        step short, never one over: the chief then runs that step in its next stretch."""
        with tf.device(v.global_step.device):
            taken = v.asp_tickets.read_value()
            with tf.control_dependencies([taken]):
                step = v.global_step.read_value()
            v.asp_stop.assign(taken + stop - step, read_value=False)

    @tf.function
    def bsp_open(group: Any, steps: Any) -> Any:
        start = v.global_step.read_value()
        resets = [v.bsp_joined.assign(0, read_value=False),
                  v.bsp_tickets.assign(0, read_value=False),
                  v.bsp_stop.assign(start + steps, read_value=False)]
        with tf.control_dependencies(resets):
            v.bsp_group.assign(group, read_value=False)
        return start

    @tf.function
    def bsp_close() -> None:
        v.bsp_group.assign(BSP_CLOSED, read_value=False)

    @tf.function
    def bsp_discard() -> Any:
        # called only when every closure of the group has ended: nothing races the resets
        resets = [acc.assign(tf.zeros_like(acc), read_value=False) for acc in v.accumulators]
        resets += [v.grad_count.assign(0.0, read_value=False),
                   v.bsp_tickets.assign(0, read_value=False)]
        with tf.control_dependencies(resets):
            return v.global_step.read_value()

    return Steps(asp_step, asp_unrolled, asp_open, bsp_accumulate, bsp_apply, bsp_rounds,
                 bsp_open, bsp_close, bsp_discard)


def auto_steps_per_closure(step_time_s: float) -> int:
    """K such that K steps of `step_time_s` last about TARGET_CLOSURE_S (1..MAX)."""
    if step_time_s <= 0:
        return MAX_AUTO_STEPS_PER_CLOSURE
    return max(1, min(MAX_AUTO_STEPS_PER_CLOSURE, round(TARGET_CLOSURE_S / step_time_s)))


def median_step_time(results: list[Any]) -> float | None:
    """The median on-worker step time of finished closures (None if all were lost)."""
    times = [float(r[2]) for r in map(fetch_or_none, results) if r is not None and r[3] > 0]
    return sorted(times)[len(times) // 2] if times else None


def asp_runner(coordinator: Any, asp_step: Callable, args: tuple, workers: int,
               steps_per_closure: int = 1,
               on_choice: Callable[[int, float], None] | None = None,
               unrolled: Callable[[int], Callable] | None = None,
               ) -> Callable[[int], tuple[int, list[Any]]]:
    """run(n): schedule up to `n` ASP steps (one chunk of closures of `steps_per_closure`
    steps each, the last one shorter if `n` says so); returns (steps scheduled, results),
    results being RemoteValues of closures that have (almost all) finished.

    Chunks are double-buffered: after scheduling chunk k we wait for the end of chunk k-1,
    so workers never idle while the queue (and so the step overshoot) stays bounded.
    `drain()` waits for everything scheduled (before a protocol switch or a checkpoint).
    `steps_per_closure` 0 = automatic: the first chunk runs one step per closure, then K is
    chosen from its measured step times and reported through `on_choice(K, step_time_s)`.

    `unrolled(K)` (Steps.asp_unrolled) gives the closure of exactly K steps without a loop,
    used for every full closure once traced, the looped `asp_step` meanwhile and for shorter
    ones: an explicit K is traced by `warm()`, an automatic one in a background thread once
    chosen (`prepare_unrolled`).
    """
    import tensorflow as tf

    previous: list[list[Any]] = []
    state = {"k": steps_per_closure}
    counts: dict[int, Any] = {}
    ready: dict[int, Callable] = {}  # K -> unrolled closure, traced

    def prepare(k: int, background: bool = True) -> None:
        if unrolled is None or not 1 < k <= MAX_AUTO_STEPS_PER_CLOSURE:
            return
        started = time.time()

        def use(fn: Callable) -> None:
            ready[k] = fn
            events.emit("closure_unrolled", steps=k, trace_s=round(time.time() - started, 3))

        prepare_unrolled(unrolled(k), args, use, background, coordinator.strategy.scope)

    def count_tensor(k: int) -> Any:
        if k not in counts:
            counts[k] = tf.constant(k, tf.int64)
        return counts[k]

    def choose(done: list[Any]) -> None:
        step_time = median_step_time(done)
        if step_time is None:
            return  # every sample was lost with a worker: try again with the next chunk
        state["k"] = auto_steps_per_closure(step_time)
        prepare(state["k"])
        if on_choice is not None:
            on_choice(state["k"], step_time)

    lagging: list[Any] = []  # closures of earlier chunks not finished when those were

    def run(n: int) -> tuple[int, list[Any]]:
        k = state["k"] or 1
        per_worker = max(MIN_CLOSURES_PER_CHUNK_PER_WORKER, CLOSURES_PER_CHUNK_PER_WORKER // k)
        scheduled, current = 0, []
        while scheduled < n and len(current) < per_worker * workers:
            size = min(k, n - scheduled)
            if size == k and k in ready:
                current.append(coordinator.schedule(ready[k], args=args))
            else:
                current.append(coordinator.schedule(asp_step, args=(*args, count_tensor(size))))
            scheduled += size
        done: list[Any] = []
        if previous:
            done, late = wait_for_chunk(previous.pop() + lagging, workers)
            lagging[:] = late
        previous.append(current)
        if scheduled == n:  # end of a stretch: drain so that the global step is exact
            done += drain()
        if not state["k"] and done:
            state["chunks"] = state.get("chunks", 0) + 1
            if state["chunks"] > 1:  # the first chunk's steps include the workers' warm-up
                choose(done)
        return scheduled, done

    def drain() -> list[Any]:
        pending = (previous.pop() if previous else []) + lagging
        done, late = settle(pending, coordinator)
        lagging[:] = late
        return done

    def warm() -> None:
        """Trace and instantiate the step now with a closure of zero steps (no batch read, no
        update), so that a later switch to ASP does not pay for it."""
        coordinator.schedule(asp_step, args=(*args, count_tensor(0)))
        coordinator.join()
        # an explicit K: its unrolled closure now too, before the clock starts (an automatic
        # K is known only later, and traced then in the background)
        prepare(steps_per_closure, background=False)

    run.drain = drain  # type: ignore[attr-defined]
    run.warm = warm  # type: ignore[attr-defined]
    return run


def prepare_unrolled(fn: Callable, args: tuple, on_ready: Callable[[Callable], Any],
                     background: bool = True, scope: Callable[[], Any] | None = None) -> None:
    """Trace `fn` for `coordinator.schedule(fn, args)` in a daemon thread (or now, when not
    `background`), then call `on_ready(concrete function)`, which the chief schedules as it
    is; the chief keeps scheduling meanwhile. `scope`: the distribution strategy's scope,
    which `schedule` traces in.

    Tracing a K-step closure takes seconds (K copies of the model's step), and a new
    function is registered on every worker (`TFE_ContextAddFunction`), a call that waits
    for each worker to answer while it holds the GIL: with a worker hung then, every thread
    of the chief stopped, the heartbeat's included, until the worker resumed (seen: 30 s of
    no step and no `worker_unresponsive`). So the trace runs off the chief's thread, only
    while no worker is named hung (a worker that hangs within the registration's
    milliseconds still holds it), and `schedule` gets the concrete function: given the
    plain function it looks the trace up under its own key (the strategy's scope is part
    of it) and, missing, traced and registered it again on the chief's thread. A trace that
    fails (a PS lost meanwhile) leaves the looped closure in use."""
    import contextlib
    import threading

    from trainer.heartbeat import HEARTBEAT_S, unresponsive
    from trainer.server import lower_thread_priority
    from trainer.tfcompat import schedule_specs

    def trace() -> None:
        try:
            with (scope or contextlib.nullcontext)():
                concrete = fn.get_concrete_function(*schedule_specs(args))
        except Exception as exc:  # the looped closure stays in use
            print(f"[chief] unrolled closure not traced ({type(exc).__name__}: {exc}); "
                  "steps stay in a loop", flush=True)
            return
        on_ready(concrete)

    def low_priority_trace() -> None:
        # on a shared host (the local backend) the trace's CPU would come out of the
        # workers' steps meanwhile; at low priority they keep running the looped closure
        lower_thread_priority(TRACE_NICE)
        while unresponsive():  # registering now would wait for the hung worker (above)
            time.sleep(HEARTBEAT_S)
        trace()

    if background:
        threading.Thread(target=low_priority_trace, name="trace-unrolled", daemon=True).start()
    else:
        trace()


def finished(remote: Any) -> bool:
    """Whether a closure is done, its result copied to the chief (or failed), so that
    reading it never waits. Private TF state; where it moved, everything counts as finished
    once waited for.

    The function's return (its updates to the PS done) sets the status; the coordinator
    then copies the result to the chief, which on a worker hung at that moment waits for the
    worker, and so would anything that reads the result, or `coordinator.join()`."""
    event = getattr(remote, "_status_available_event", None)
    if event is None:
        return True
    if not event.is_set():
        return False
    return (getattr(remote, "_has_fetched_to_local", True)
            or getattr(remote, "_values", None) is None)  # failed, aborted or no result


def pause(remote: Any, seconds: float) -> None:
    """Wait up to `seconds` for `remote`'s status; when it has one already and only its copy
    to the chief is pending (a millisecond on a live worker), a short sleep."""
    event = remote._status_available_event
    if event.is_set():
        time.sleep(min(seconds, COPY_POLL_S))
    else:
        event.wait(seconds)


def all_hung(running: list[Any]) -> bool:
    """Whether every closure in `running` (non-empty) is held by a worker that the chief's
    heartbeat names hung (trainer/heartbeat.py, trainer/tfcompat.py `held_by`)."""
    from trainer.heartbeat import unresponsive
    from trainer.tfcompat import held_by

    hung = unresponsive()
    held = held_by(hung) if hung else None
    return bool(held) and all(id(r) in held for r in running)


def any_hung(running: list[Any] | None = None) -> bool:
    """Whether a worker is named hung now (and, given `running`, holds one of those closures)."""
    from trainer.heartbeat import unresponsive
    from trainer.tfcompat import held_by

    hung = unresponsive()
    if not hung or running is None:
        return bool(hung)
    held = held_by(hung)
    return bool(held) and any(id(r) in held for r in running)


def wait_for_chunk(chunk: list[Any], workers: int) -> tuple[list[Any], list[Any]]:
    """Wait until the closures of `chunk` are finished except at most one per other worker
    (`workers - 1`); returns (finished, still running).

    A worker that hangs without dying (SIGSTOP, a frozen host) holds its closure until gRPC
    keepalive declares it lost (~10 s); waiting for every closure would stall the chief and
    so every other worker for that long. The ones left behind are carried to the next
    chunk, so at most `workers - 1` are ever outstanding beyond the double buffer.
    """
    if getattr(chunk[-1], "_status_available_event", None) is None:
        fetch_or_none(chunk[-1])  # TF internals moved: wait for the chunk's last closure
        return chunk, []
    allowed = workers - 1
    while True:
        running = [r for r in chunk if not finished(r)]
        if len(running) <= allowed:
            late = {id(r) for r in running}
            return [r for r in chunk if id(r) not in late], running
        pause(running[0], CHUNK_POLL_S)


def settle(pending: list[Any], coordinator: Any) -> tuple[list[Any], list[Any]]:
    """Wait for every closure in `pending` (all that were scheduled) except those held by
    hung workers; returns (finished, still running).

    A closure on a worker that hangs without dying ends only when the worker resumes or
    gRPC keepalive declares it lost (then it is rerun on another worker); waiting for it
    at a checkpoint or a budget end (`coordinator.join()`) would stall the whole run. Once
    the chief's heartbeat names hung workers (trainer/heartbeat.py), the closures they hold
    (`all_hung`) are left running and carried on; the accounting reads the PS global step,
    so their steps are charged when they land (at most one closure per hung worker).
    """
    if not pending:
        return [], []  # nothing in flight but, maybe, closures left to hung workers
    if getattr(pending[-1], "_status_available_event", None) is None:
        coordinator.join()  # TF internals moved: the plain barrier
        return pending, []
    while True:
        running = [r for r in pending if not finished(r)]
        if not running or all_hung(running):
            coordinator.done()  # raises a closure's error, as join() did, without waiting
            late = {id(r) for r in running}
            return [r for r in pending if id(r) not in late], running
        pause(running[0], SETTLE_POLL_S)


def barrier(results: list[Any], reschedule: Callable[[], Any],
            coordinator: Any) -> list[Any]:
    """Wait for a BSP step's gradient closures; returns those that delivered one.

    A dead worker's closure is rerun on a survivor by the coordinator. A hung worker's is
    not (it is neither finished nor failed until the worker resumes or keepalive gives up,
    minutes at worst): once the chief's heartbeat names hung workers (trainer/heartbeat.py)
    and only closures they hold are left (`all_hung`), each is scheduled again for a
    survivor, so the step waits about UNRESPONSIVE_S, not for the hung worker. A left closure that ends
    later adds its gradient to a later step, whose mean divides by the count: at least
    once, as after a worker loss.
    """
    if getattr(results[-1], "_status_available_event", None) is None:
        coordinator.join()  # TF internals moved: the plain barrier
        return results
    done: list[Any] = []
    waiting = results
    while True:
        running = [r for r in waiting if not finished(r)]
        done += [r for r in waiting if finished(r)]
        if not running:
            coordinator.done()  # raises a closure's error, as join() did, without waiting
            return done
        if all_hung(running):
            waiting = [reschedule() for _ in running]  # the hung closures are left behind
            continue
        waiting = running
        pause(running[0], SETTLE_POLL_S)


def bsp_runner(coordinator: Any, steps: Steps, args: tuple, workers: int,
               steps_per_closure: int = 1, membership: Membership | None = None,
               on_choice: Callable[[int, float], None] | None = None,
               ) -> Callable[[int], tuple[int, list[Any]]]:
    """run(n): up to `n` BSP global steps; returns (steps applied, closure results).

    One step (n == 1, K == 1, a worker lost, or K still being measured): one accumulate
    closure per worker, `barrier` (hung workers' closures rescheduled), one apply on the PS. Otherwise
    one group of min(K, n) steps held on the PS (module docstring). `steps_per_closure` 0 =
    automatic: after AUTO_SAMPLE_STEPS one-step rounds (and the first, which includes the
    trace), K = 1 when the chief's share of a round is small (`choose_k`), else from the median
    step time as for ASP; reported through `on_choice(K, step_time_s)`.
    """
    import tensorflow as tf

    membership = membership or Membership()
    state: dict[str, Any] = {"k": steps_per_closure, "group": 0, "samples": []}

    def one_step() -> tuple[int, list[Any]]:
        started = time.perf_counter()
        results = [coordinator.schedule(steps.bsp_accumulate, args=args)
                   for _ in range(workers)]
        # the barrier; a dead worker's closure is rerun on a survivor, a hung one's too
        results = barrier(results, lambda: coordinator.schedule(steps.bsp_accumulate,
                                                                args=args), coordinator)
        steps.bsp_apply()
        if not state["k"]:
            state["samples"].append((results, time.perf_counter() - started))
            if len(state["samples"]) > AUTO_SAMPLE_STEPS:  # the first one traced the step
                choose_k(state["samples"][1:])
                state["samples"].clear()
        return 1, results

    def choose_k(samples: list[tuple[list[Any], float]]) -> None:
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
        state["k"] = 1 if share < BSP_MIN_CHIEF_SHARE else auto_steps_per_closure(step_time)
        if on_choice is not None:
            on_choice(state["k"], step_time)

    def group(n: int) -> tuple[int, list[Any]]:
        state["group"] += 1
        run.groups += 1  # type: ignore[attr-defined]
        group_id = tf.constant(state["group"], tf.int64)
        disruptions = membership.disruptions
        start = int(steps.bsp_open(group_id, tf.constant(n, tf.int64)))
        results = [coordinator.schedule(steps.bsp_rounds, args=(*args, group_id))
                   for _ in range(workers)]
        while True:
            running = [r for r in results if not finished(r)]
            if not running:
                break
            if membership.disruptions != disruptions or any_hung(running):
                # a closure failed, or one is held by a hung worker: end the group; the
                # survivors leave (a rerun, or the hung closure when it resumes, finds it closed)
                steps.bsp_close()
                while any(not finished(r) for r in results) and not all_hung(
                        [r for r in results if not finished(r)]):
                    pause(running[0], SETTLE_POLL_S)
                return int(steps.bsp_discard()) - start, results
            if getattr(running[0], "_status_available_event", None) is None:
                coordinator.join()  # TF internals moved: no failure detection mid-group
                break
            running[0]._status_available_event.wait(CHUNK_POLL_S)
        coordinator.join()  # raises a closure's error, if any
        return n, results

    def run(n: int) -> tuple[int, list[Any]]:
        k = state["k"]
        if n <= 1 or k in (0, 1) or membership.lost or any_hung():
            return one_step()  # a group needs every worker; one step reschedules around them
        return group(min(k, n))

    def warm(groups: bool = True) -> None:
        """Trace BSP's functions now, before a worker can hang: a function first traced
        mid-run is registered with every worker then, which waits for a hung one
        (`prepare_unrolled`). With `groups`, the group closure too, run once for a group
        that is not open (it does nothing)."""
        from trainer.tfcompat import schedule_specs

        with coordinator.strategy.scope():  # where `schedule` looks the trace up
            steps.bsp_accumulate.get_concrete_function(*schedule_specs(args))
        scalar = tf.TensorSpec([], tf.int64)
        steps.bsp_apply.get_concrete_function()
        steps.bsp_open.get_concrete_function(scalar, scalar)
        steps.bsp_close.get_concrete_function()
        steps.bsp_discard.get_concrete_function()
        if groups:
            coordinator.schedule(steps.bsp_rounds, args=(*args, tf.constant(BSP_CLOSED - 1,
                                                                             tf.int64)))
            coordinator.join()

    run.drain = list  # type: ignore[attr-defined]  # nothing is left in flight
    run.warm = warm  # type: ignore[attr-defined]
    run.groups = 0  # type: ignore[attr-defined]  # multi-step groups run (this process)
    return run
