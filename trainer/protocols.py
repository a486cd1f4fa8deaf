"""Step functions (ASP and BSP) over the same PS variables, and the chief's runners.

- ASP: every closure computes a gradient on a worker and applies it to the PS directly.
- BSP: a global step schedules one accumulate closure per worker, waits for all of them
  (`barrier`), then one apply on the PS averages the accumulated gradients by their count
  and updates the weights. A lost worker's closure is rescheduled on a survivor by the
  coordinator, a hung worker's by `barrier` once the heartbeat names it, so the barrier
  never waits on a dead or hung worker; dividing by the count (not by the worker count)
  keeps the average right if that closure ran twice.

Steps per closure (ASP): one closure may run several steps in a loop on its worker, each
with its own batch, gradient and update, exactly as if they had been scheduled one by one:
the chief's cost per closure (Python dispatch, one RPC round) is then paid once per K steps.
`job.steps_per_closure` fixes K; 0 picks it from the measured on-worker step time so that a
closure lasts about TARGET_CLOSURE_S (`auto_steps_per_closure`). The count is a tensor
argument, so a short last closure keeps budgets exact without a retrace. BSP keeps one step
per closure: its barrier (one gradient from every worker before one update) sits between
two steps, and only the chief can hold it without an in-graph cross-worker lock.

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
from typing import Any

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


def build_steps(strategy: Any, model: Any, optimizer: Any, job: Any, v: Any,
                stragglers: list[StragglerSpec]) -> tuple[Callable, Callable, Callable]:
    """(asp_step, bsp_accumulate, bsp_apply). `v` holds the PS variables: global_step,
    grad_count, accumulators, bsp_gradients, bsp_updates, train_epoch (unix s of the
    chief's train_start, for time-based straggler episodes)."""
    import tensorflow as tf

    from trainer.optim import lr_tensor

    params = model.trainable_variables
    kernels = [p for p in params if len(p.shape) > 1]  # weight decay skips biases and BN

    def loss_and_grads(batch: Any) -> tuple[Any, list[Any]]:
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
            if job.weight_decay:
                loss += job.weight_decay * tf.add_n([tf.nn.l2_loss(k) for k in kernels])
        return loss, tape.gradient(loss, params)

    def current_lr() -> Any:
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

    # The updates are not chained to the returned loss: forcing that order serialises the
    # PS round trips and cost ~15 % of ASP throughput. The function still ends only after
    # every update (automatic control dependencies); step_time_s ends at the loss.
    def asp_body(batch: Any) -> Any:
        loss, grads = loss_and_grads(batch)
        optimizer.apply(grads, current_lr())
        v.global_step.assign_add(1)
        return loss

    def accumulate_body(batch: Any) -> Any:
        loss, grads = loss_and_grads(batch)
        for acc, grad in zip(v.accumulators, grads, strict=True):
            acc.assign_add(grad)
        v.grad_count.assign_add(1.0)
        return loss

    @tf.function
    def asp_step(iterator: Any, worker_id: Any, steps: Any) -> Any:
        # `steps` is an int64 tensor: one trace serves every closure length
        loss, total = tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64)
        for _ in tf.range(steps):
            loss, seconds = timed(iterator, worker_id, asp_body)
            total += seconds
        return result(loss, worker_id, total / tf.cast(tf.maximum(steps, 1), tf.float64), steps)

    @tf.function
    def bsp_accumulate(iterator: Any, worker_id: Any) -> Any:
        loss, seconds = timed(iterator, worker_id, accumulate_body)
        return result(loss, worker_id, seconds, 1)

    @tf.function
    def bsp_apply() -> None:
        # Runs on the chief, but every op is placed with its PS variable: one RPC round trip,
        # no weights or gradients travel. Auto control deps order read -> apply -> reset.
        count = v.grad_count.read_value()
        means = []
        for acc in v.accumulators:
            with tf.device(acc.device):
                means.append(acc.read_value() / count)
        optimizer.apply(means, current_lr())
        for acc in v.accumulators:
            acc.assign(tf.zeros_like(acc))
        v.grad_count.assign(0.0)
        v.bsp_gradients.assign_add(tf.cast(count, tf.int64))
        v.bsp_updates.assign_add(1)
        v.global_step.assign_add(1)

    return asp_step, bsp_accumulate, bsp_apply


def auto_steps_per_closure(step_time_s: float) -> int:
    """K such that K steps of `step_time_s` last about TARGET_CLOSURE_S (1..MAX)."""
    if step_time_s <= 0:
        return MAX_AUTO_STEPS_PER_CLOSURE
    return max(1, min(MAX_AUTO_STEPS_PER_CLOSURE, round(TARGET_CLOSURE_S / step_time_s)))


def asp_runner(coordinator: Any, asp_step: Callable, args: tuple, workers: int,
               steps_per_closure: int = 1,
               on_choice: Callable[[int, float], None] | None = None,
               ) -> Callable[[int], tuple[int, list[Any]]]:
    """run(n): schedule up to `n` ASP steps (one chunk of closures of `steps_per_closure`
    steps each, the last one shorter if `n` says so); returns (steps scheduled, results),
    results being RemoteValues of closures that have (almost all) finished.

    Chunks are double-buffered: after scheduling chunk k we wait for the end of chunk k-1,
    so workers never idle while the queue (and so the step overshoot) stays bounded.
    `drain()` waits for everything scheduled (before a protocol switch or a checkpoint).
    `steps_per_closure` 0 = automatic: the first chunk runs one step per closure, then K is
    chosen from its measured step times and reported through `on_choice(K, step_time_s)`.
    """
    import tensorflow as tf

    previous: list[list[Any]] = []
    state = {"k": steps_per_closure}
    counts: dict[int, Any] = {}

    def count_tensor(k: int) -> Any:
        if k not in counts:
            counts[k] = tf.constant(k, tf.int64)
        return counts[k]

    def choose(done: list[Any]) -> None:
        times = [float(r[2]) for r in map(fetch_or_none, done) if r is not None]
        if not times:
            return  # every sample was lost with a worker: try again with the next chunk
        step_time = sorted(times)[len(times) // 2]
        state["k"] = auto_steps_per_closure(step_time)
        if on_choice is not None:
            on_choice(state["k"], step_time)

    lagging: list[Any] = []  # closures of earlier chunks not finished when those were

    def run(n: int) -> tuple[int, list[Any]]:
        k = state["k"] or 1
        per_worker = max(MIN_CLOSURES_PER_CHUNK_PER_WORKER, CLOSURES_PER_CHUNK_PER_WORKER // k)
        scheduled, current = 0, []
        while scheduled < n and len(current) < per_worker * workers:
            size = min(k, n - scheduled)
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

    run.drain = drain  # type: ignore[attr-defined]
    run.warm = warm  # type: ignore[attr-defined]
    return run


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


def bsp_runner(coordinator: Any, accumulate: Callable, apply: Callable, args: tuple,
               workers: int) -> Callable[[int], tuple[int, list[Any]]]:
    """run(n): one BSP global step: one gradient per worker, barrier, one apply on the PS."""

    def run(n: int) -> tuple[int, list[Any]]:
        results = [coordinator.schedule(accumulate, args=args) for _ in range(workers)]
        # the barrier; a dead worker's closure is rerun on a survivor, a hung one's too
        results = barrier(results, lambda: coordinator.schedule(accumulate, args=args),
                          coordinator)
        apply()
        return 1, results

    run.drain = list  # type: ignore[attr-defined]  # nothing is left in flight
    return run
