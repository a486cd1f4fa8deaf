"""Learning-rate schedules and a small optimizer whose state lives on the parameter servers.

Why not `keras.optimizers.SGD`: Keras 3 bakes `momentum` into the traced step function as a
Python float, so a phase that changes momentum would need a retrace on every worker, and its
apply path goes through distribution merge calls that ParameterServerStrategy does not
exercise in Keras 3. Here learning rate and momentum are PS variables (a phase switch is one
assign), and each update is one fused `ResourceApply*` op that runs on the PS holding the
variable: the gradient crosses the network once, the weights not at all.
"""

from __future__ import annotations

import math
from typing import Any

from trainer.spec import JobSpec

ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON = 0.9, 0.999, 1e-7


def lr_at(step: int, job: JobSpec, base_lr: float | None = None) -> float:
    """Learning rate at a global step: linear warmup, then constant, cosine or step decay.

    `base_lr` overrides `job.learning_rate` (a phase's `hparams.learning_rate`). The same
    formula runs in-graph in `lr_tensor`; this Python twin is for events and tests.
    """
    base = job.learning_rate if base_lr is None else base_lr
    if job.warmup_steps and step < job.warmup_steps:
        return base * (step + 1) / job.warmup_steps
    if job.lr_schedule == "cosine":
        span = max(1, job.train_steps - job.warmup_steps)
        progress = min(1.0, (step - job.warmup_steps) / span)
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))
    if job.lr_schedule == "step":
        passed = sum(1 for boundary in job.lr_decay_steps if step >= boundary)
        return base * job.lr_decay_factor ** passed
    return base


def lr_tensor(step: Any, job: JobSpec, base_lr: Any) -> Any:
    """In-graph `lr_at`: `step` is the int64 global-step variable, `base_lr` a float32 one."""
    import tensorflow as tf

    s = tf.cast(step, tf.float32)
    lr = tf.convert_to_tensor(base_lr, tf.float32)
    if job.lr_schedule == "cosine":
        span = float(max(1, job.train_steps - job.warmup_steps))
        progress = tf.minimum(1.0, (s - job.warmup_steps) / span)
        lr = lr * 0.5 * (1.0 + tf.cos(math.pi * progress))
    elif job.lr_schedule == "step":
        passed = tf.add_n([tf.cast(s >= b, tf.float32) for b in job.lr_decay_steps])
        lr = lr * tf.pow(job.lr_decay_factor, passed)
    if job.warmup_steps:
        warm = tf.convert_to_tensor(base_lr, tf.float32) * (s + 1.0) / job.warmup_steps
        lr = tf.where(s < job.warmup_steps, warm, lr)
    return lr


class PSOptimizer:
    """sgd | momentum | adam over variables on the parameter servers.

    Create it inside `strategy.scope()`. Checkpoint it by its `checkpoint_items()`; slots
    are colocated with their variable, so multi-PS placement stays consistent.
    """

    def __init__(self, job: JobSpec, variables: list[Any], strategy: Any) -> None:
        import tensorflow as tf

        self.kind = job.optimizer
        self.variables = [tf_var(v) for v in variables]
        self.learning_rate = tf.Variable(job.learning_rate, dtype=tf.float32, trainable=False,
                                         name="base_learning_rate")
        self.momentum = tf.Variable(job.momentum if self.kind == "momentum" else 0.0,
                                    dtype=tf.float32, trainable=False, name="momentum")
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        n_slots = {"sgd": 0, "momentum": 1, "adam": 2}[self.kind]
        self.slots: list[list[Any]] = []
        for var in self.variables:
            with strategy.extended.colocate_vars_with(var):
                self.slots.append([tf.Variable(tf.zeros(var.shape, var.dtype), trainable=False,
                                               name=f"slot{i}") for i in range(n_slots)])

    def checkpoint_items(self) -> dict[str, Any]:
        items = {"learning_rate": self.learning_rate, "momentum": self.momentum,
                 "iterations": self.iterations}
        items.update({f"slot_{i}_{j}": s for i, slots in enumerate(self.slots)
                      for j, s in enumerate(slots)})
        return items

    def apply(self, grads: list[Any], lr: Any, take: Any = None) -> list[Any]:
        """Apply one update in-graph; returns the update ops (to depend on). Concurrent ASP
        closures race here on purpose (Hogwild-style, use_locking=False), as asynchronous
        parameter servers do.

        `take` (a bool tensor, None = True): False makes every op leave its variable and
        slots exactly as they were (gradient and rate 0, decay factors 1, no iteration), so
        a step's update can be dropped without a branch (ASP's step budget, trainer/steps.py)."""
        import tensorflow as tf

        def masked(value: Any, unit: float = 0.0) -> Any:
            # `value` when taken, else `unit`; placed by the caller with its variable (a
            # select, not a product: an inf or nan gradient is dropped too)
            if take is None:
                return value
            value = tf.convert_to_tensor(value)
            return tf.where(take, value, tf.constant(unit, value.dtype))

        def counted() -> Any:
            return 1 if take is None else tf.cast(take, tf.int64)

        ops: list[Any] = []
        if self.kind == "adam":
            with tf.device(self.iterations.device):
                # at least 1: a first step dropped must not divide by 1 - beta ** 0
                t = tf.maximum(tf.cast(self.iterations.assign_add(counted()), tf.float32), 1.0)
            b1_power, b2_power = ADAM_BETA_1 ** t, ADAM_BETA_2 ** t
        for var, grad, slots in zip(self.variables, grads, self.slots, strict=True):
            with tf.device(var.device):
                grad, rate = masked(tf.convert_to_tensor(grad)), masked(lr)
                if self.kind == "sgd":
                    op = tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=rate,
                                                                 delta=grad)
                elif self.kind == "momentum":
                    op = tf.raw_ops.ResourceApplyMomentum(
                        var=var.handle, accum=slots[0].handle, lr=rate, grad=grad,
                        momentum=masked(self.momentum, 1.0))
                else:
                    op = tf.raw_ops.ResourceApplyAdam(
                        var=var.handle, m=slots[0].handle, v=slots[1].handle,
                        beta1_power=b1_power, beta2_power=b2_power, lr=rate,
                        beta1=masked(tf.constant(ADAM_BETA_1), 1.0),
                        beta2=masked(tf.constant(ADAM_BETA_2), 1.0),
                        epsilon=ADAM_EPSILON, grad=grad)
            ops.append(op)
        if self.kind != "adam":
            with tf.device(self.iterations.device):
                ops.append(self.iterations.assign_add(counted()))
        return [op for op in ops if op is not None]  # eager mode returns no ops


def tf_var(variable: Any) -> Any:
    """The tf.Variable behind a Keras 3 variable (ResourceApply* ops need its handle)."""
    return getattr(variable, "value", variable) if hasattr(variable, "path") else variable
