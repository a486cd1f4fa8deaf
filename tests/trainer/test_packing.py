"""trainer/packing.py: one transfer per device and direction, the same values as the
per-variable reads, and a model run on the fused values computes what its own call does."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from trainer.models import build_model  # noqa: E402
from trainer.optim import tf_var  # noqa: E402
from trainer.packing import Packing  # noqa: E402


def _crossing(graph: object, device: str, leaving: bool) -> set[str]:
    """The ops whose output crosses the boundary of `device` (leaving it, or entering it;
    variable handles, which are references and not values, left out)."""
    def on(op: object) -> bool:
        return device in op.device

    return {t.op.name for op in graph.get_operations() for t in op.inputs
            if on(t.op) == leaving and on(op) != leaving and t.dtype != tf.resource}


def test_read_and_to_variables_cross_once_per_group() -> None:
    # Variables pinned to one explicit device stand in for a parameter server's; the
    # structural check (what crosses the device boundary) is what packing is for.
    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    with tf.device(device):
        variables = [tf.Variable(tf.random.normal(shape)) for shape in ((3, 3, 1, 4), (4,),
                                                                         (16, 2), (2,))]
    packing = Packing(variables)
    assert len(packing.groups) == 1

    @tf.function
    def round_trip() -> list:
        values = packing.read()
        placed = packing.to_variables([2.0 * v for v in values])
        with tf.device(device):  # as the optimizer's updates are: colocated with the variable
            for var, value in zip(variables, placed, strict=True):
                var.assign(value)
        return values

    before = [var.numpy() for var in variables]
    values = round_trip()
    for var, old, value in zip(variables, before, values, strict=True):
        np.testing.assert_array_equal(value.numpy(), old)
        np.testing.assert_array_equal(var.numpy(), 2.0 * old)
    graph = round_trip.get_concrete_function().graph
    # every read is on the variables' device, and one tensor leaves it (the concat)
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert len(reads) == len(variables) and all(device in op.device for op in reads)
    ops = {op.name: op for op in graph.get_operations()}
    for leaving in (True, False):
        crossing = _crossing(graph, device, leaving)
        assert [ops[name].type for name in crossing] == ["ConcatV2"], crossing


def test_model_on_fused_values_matches_its_own_call() -> None:
    """Loss, gradients and batch-norm statistics: the stateless call on the fused values
    equals the model's own training call (the path the step used before packing)."""
    import keras

    keras.utils.set_random_seed(0)
    model = build_model("resnet", "resnet_cifar_20", (8, 8, 3), 10)
    images = tf.random.normal((4, 8, 8, 3))
    labels = tf.constant([0, 1, 2, 3])
    weights = Packing([tf_var(w) for w in model.trainable_variables])
    statistics = Packing([tf_var(s) for s in model.non_trainable_variables])
    assert statistics.variables, "the resnet has batch-norm statistics to write back"

    def xent(logits: object) -> object:
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    @tf.function
    def fused() -> tuple:
        values, stats = weights.read(), statistics.read()
        with tf.GradientTape() as tape:
            tape.watch(values)
            logits, new_stats = model.stateless_call(values, stats, images, training=True)
            loss = xent(logits)
        return loss, tape.gradient(loss, values), new_stats

    @tf.function
    def own_call() -> tuple:
        with tf.GradientTape() as tape:
            loss = xent(model(images, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    before = [s.numpy() for s in model.non_trainable_variables]
    loss, grads, new_stats = fused()
    unchanged = [s.numpy() for s in model.non_trainable_variables]
    for a, b in zip(before, unchanged, strict=True):
        np.testing.assert_array_equal(a, b)  # the stateless call wrote nothing itself
    ref_loss, ref_grads = own_call()
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)
    moved = [s.numpy() for s in model.non_trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(before, moved, strict=True))
    for new, own in zip(new_stats, moved, strict=True):
        np.testing.assert_allclose(np.asarray(new), own, rtol=1e-6, atol=1e-7)
