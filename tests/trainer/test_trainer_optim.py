"""Learning-rate schedules: the Python `lr_at` and its in-graph twin agree."""

from __future__ import annotations

import math

import pytest

from trainer.optim import lr_at, lr_tensor
from trainer.spec import JobSpec


def test_constant_with_warmup() -> None:
    job = JobSpec(learning_rate=0.1, warmup_steps=10)
    assert lr_at(0, job) == pytest.approx(0.01)
    assert lr_at(9, job) == pytest.approx(0.1)
    assert lr_at(500, job) == 0.1
    assert lr_at(500, job, base_lr=0.2) == 0.2  # a phase override


def test_step_schedule() -> None:
    job = JobSpec(learning_rate=0.1, lr_schedule="step", lr_decay_steps=[100, 200],
                  lr_decay_factor=0.1)
    assert [lr_at(s, job) for s in (0, 99, 100, 199, 200, 999)] == pytest.approx(
        [0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_cosine_schedule() -> None:
    job = JobSpec(learning_rate=0.1, lr_schedule="cosine", train_steps=1000)
    assert lr_at(0, job) == pytest.approx(0.1)
    assert lr_at(500, job) == pytest.approx(0.05)
    assert lr_at(1000, job) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(250, job) == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)))


@pytest.mark.parametrize("job", [
    JobSpec(learning_rate=0.1, warmup_steps=50, lr_schedule="cosine", train_steps=400),
    JobSpec(learning_rate=0.1, warmup_steps=20, lr_schedule="step", lr_decay_steps=[100, 300]),
    JobSpec(learning_rate=0.3)])
def test_in_graph_schedule_matches_python(job: JobSpec) -> None:
    import tensorflow as tf

    for step in (0, 10, 19, 20, 49, 50, 99, 100, 250, 300, 399):
        got = float(lr_tensor(tf.constant(step, tf.int64), job, tf.constant(0.1)))
        assert got == pytest.approx(lr_at(step, job, 0.1), rel=1e-5, abs=1e-8), step
