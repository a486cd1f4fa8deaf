"""Single-process baseline: the same model, problem and batch without any distribution.

`make bench` compares the parameter-server throughput against this number; the ratio shows
what the cluster machinery (RPCs, closure scheduling, barriers) costs per step.
"""

from __future__ import annotations

import time
from typing import Any

from trainer.models import build_model
from trainer.problems import get_problem, train_dataset
from trainer.spec import JobSpec

WARMUP_STEPS = 20  # tracing and the first tf.data fills are not throughput


def measure_single_process(job: JobSpec, steps: int) -> float:
    """Train `steps` steps of a plain custom loop (tf.function step, Keras optimizer) and
    return steps per second, excluding `WARMUP_STEPS` warm-up steps."""
    import keras
    import tensorflow as tf

    assert steps >= 1, f"steps: must be >= 1 (got {steps})"
    keras.utils.set_random_seed(job.seed)
    arrays = get_problem(job.problem).load(job.data_dir, job.seed)
    model = build_model(job.model, job.hparam_set, arrays.input_shape, arrays.num_classes)
    optimizer = _keras_optimizer(job)
    iterator = iter(train_dataset(arrays, job.batch_size, seed=job.seed))

    @tf.function
    def train_step(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    for _ in range(WARMUP_STEPS):
        loss = train_step(*next(iterator))
    float(loss)  # host sync: the warm-up must be finished before the clock starts
    started = time.perf_counter()
    for _ in range(steps):
        loss = train_step(*next(iterator))
    float(loss)
    return steps / (time.perf_counter() - started)


def _keras_optimizer(job: JobSpec) -> Any:
    import keras

    if job.optimizer == "adam":
        return keras.optimizers.Adam(job.learning_rate)
    momentum = job.momentum if job.optimizer == "momentum" else 0.0
    return keras.optimizers.SGD(job.learning_rate, momentum=momentum)
