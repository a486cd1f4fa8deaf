"""What both protocols' step graphs (trainer/steps.py) share on the parameter servers and the
workers: the PS counters and BSP accumulators, the per-worker ids, the in-graph straggler delay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer import tfcompat
from trainer.spec import StragglerSpec

UNKNOWN_WORKER = -1
BSP_CLOSED = -1  # `bsp_group` value of no open group


def tf_range(n: Any) -> Any:
    import tensorflow as tf

    return tf.range(n)


@dataclass
class PSVariables:
    """The PS variables shared by both protocols (besides the model's and the optimizer's).

    Checkpointed: global_step, phase_index, bsp_updates, bsp_gradients, units_used. Not
    checkpointed (every run, stretch or group sets them): train_epoch (unix s of the chief's
    train_start, for time-based straggler episodes), the BSP accumulators and grad_count,
    the BSP group's bsp_group, bsp_stop, bsp_joined, bsp_tickets, and ASP's asp_tickets
    and asp_stop."""

    global_step: Any
    phase_index: Any
    bsp_updates: Any
    bsp_gradients: Any
    units_used: Any
    grad_count: Any
    train_epoch: Any
    bsp_group: Any
    bsp_stop: Any
    bsp_joined: Any
    bsp_tickets: Any
    asp_tickets: Any
    asp_stop: Any
    accumulators: list[Any]  # BSP's gradient sums, packed: one per PS (trainer/packing.py)


def create_ps_variables(strategy: Any, optimizer: Any) -> PSVariables:
    """The counters and accumulators, created in the caller's scope (the strategy's: on the
    PS); each accumulator colocated with its weight."""
    import tensorflow as tf

    def counter(name: str, value: Any = 0, dtype: Any = tf.int64) -> Any:
        return tf.Variable(value, dtype=dtype, trainable=False, name=name)

    from trainer.packing import Packing

    accumulators = Packing(optimizer.variables).flat_variables(
        strategy.extended.colocate_vars_with)
    return PSVariables(
        global_step=counter("global_step"), phase_index=counter("phase_index"),
        bsp_updates=counter("bsp_updates"), bsp_gradients=counter("bsp_gradients"),
        units_used=counter("budget_units_used", -1),  # -1: not in an old checkpoint
        grad_count=counter("grad_count", 0.0, tf.float32),
        train_epoch=counter("train_epoch", 0.0, tf.float64),
        bsp_group=counter("bsp_group", BSP_CLOSED), bsp_stop=counter("bsp_stop"),
        bsp_joined=counter("bsp_joined"), bsp_tickets=counter("bsp_tickets"),
        asp_tickets=counter("asp_tickets"), asp_stop=counter("asp_stop"),
        accumulators=accumulators)


def per_worker_ids(coordinator: Any) -> Any:
    """A per-worker value whose slice on worker i is the int32 scalar i (the `worker_id` of
    every closure's result). Falls back to the constant UNKNOWN_WORKER where TF's internals
    moved (trainer/tfcompat.py `per_worker_values`)."""
    import tensorflow as tf

    def id_fn(i: int) -> Callable:
        return tf.function(lambda: tf.constant(i, tf.int32))

    try:
        return tfcompat.per_worker_values(coordinator, id_fn)
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
