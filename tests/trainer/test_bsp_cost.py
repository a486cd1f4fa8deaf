"""What a BSP global step costs: the tensors that cross between a worker and the PS, and
the orderings (control edges) between them.

In process, as in test_exact_steps.py: one device stands in for the parameter server and
every variable lives there; an op placed on it (or reading or writing a variable) is the
PS's, any other the worker's. A tensor made on one side and used on the other is one
transfer (TensorFlow sends it once per device). The counts per round come from two traces
of the unrolled group closure (K and K + 1 rounds), so the closure's fixed cost (the
admission ticket, the result vector) is left out. trainer/bsp.py documents the figures."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from trainer.models import build_model  # noqa: E402
from trainer.optim import PSOptimizer  # noqa: E402
from trainer.spec import JobSpec  # noqa: E402
from trainer.steps import Steps  # noqa: E402
from trainer.variables import create_ps_variables  # noqa: E402

PS = "/job:localhost/replica:0/task:0/device:CPU:0"
# control edges per round: TensorFlow's automatic ordering of ops on one variable adds one
# or two (which ones varies between traces)
ORDERINGS = 3
CALLS = {"While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall",
         "StatefulPartitionedCall"}


def _steps(workers: int) -> tuple:
    strategy = tf.distribute.get_strategy()
    job = JobSpec(batch_size=4)
    with tf.device(PS):
        model = build_model("cnn", "cnn_small", (8, 8, 1), 10)
        optimizer = PSOptimizer(job, model.trainable_variables, strategy)
        v = create_ps_variables(strategy, optimizer)
    return Steps(strategy, model, optimizer, job, v, [], workers), v


def _iterator() -> object:
    images = tf.zeros((8, 8, 8, 1))
    labels = tf.zeros((8,), tf.int32)
    return iter(tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(4))


def crossings(fn: object, *args: object) -> dict[str, int]:
    """Distinct tensors (and control edges) crossing each way in `fn`'s traced graph."""
    graph = fn.get_concrete_function(*args).graph
    return graph_crossings(graph, [inner for _, inner in graph.captures])


def loop_body(fn: object, *args: object) -> object:
    """The body of the one graph loop (a While op) in `fn`'s traced graph."""
    graph = fn.get_concrete_function(*args).graph
    loops = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 1, [op.type for op in loops]
    return graph._get_function(loops[0].get_attr("body").name).graph


def graph_crossings(graph: object, resources: list) -> dict[str, int]:
    """`crossings` of one graph whose variables come in as `resources` (a function's
    captures, a loop body's inputs; the dataset iterator, the worker's, among them)."""
    variables = {t.name for t in resources if t.dtype == tf.resource}

    def on_ps(op: object) -> bool:
        if op.device:
            return PS in op.device
        if op.type in CALLS or op.type.startswith("Iterator"):  # runs where it is placed
            return False
        return any(t.dtype == tf.resource and t.name in variables for t in op.inputs)

    found: dict[str, set] = {"to_ps": set(), "to_worker": set(), "control_to_ps": set(),
                             "control_to_worker": set()}
    for op in graph.get_operations():
        for t in op.inputs:
            if t.dtype != tf.resource and on_ps(t.op) != on_ps(op):
                found["to_ps" if on_ps(op) else "to_worker"].add(t.name)
        for dep in op.control_inputs:
            # the function's end waits for every stateful op (its control outputs, into
            # one NoOp): the same for ASP's step, and not an ordering of the round
            if on_ps(dep) != on_ps(op) and op.type != "NoOp":
                found["control_to_ps" if on_ps(op) else "control_to_worker"].add(dep.name)
    return {kind: len(names) for kind, names in found.items()}


def per_round(workers: int) -> dict[str, int]:
    steps, _ = _steps(workers)
    args = (_iterator(), tf.constant(0, tf.int32), tf.constant(1, tf.int64))
    two, three = crossings(steps.bsp_rounds(2), *args), crossings(steps.bsp_rounds(3), *args)
    return {kind: three[kind] - two[kind] for kind in two}


def test_a_round_of_one_worker_crosses_like_an_asp_step() -> None:
    """One worker applies every round itself: the weights in and the gradients out, one
    tensor each per PS; the round's end orders the next step's clock (a control edge)."""
    counts = per_round(1)
    assert (counts["to_ps"], counts["to_worker"]) == (1, 1), counts
    assert counts["control_to_ps"] + counts["control_to_worker"] <= ORDERINGS, counts


def test_a_round_of_two_workers_crosses_like_an_asp_step() -> None:
    """With a barrier: still only the weights in and the gradients out, one tensor each per
    PS; the barrier (the apply, the wake tokens, the wait) is one call on the PS
    (`Steps.barrier_round`), and the next round's clock is ordered after it (a control
    edge). No poll: nothing crosses while a worker waits."""
    counts = per_round(2)
    assert (counts["to_ps"], counts["to_worker"]) == (1, 1), counts
    assert counts["control_to_ps"] + counts["control_to_worker"] <= ORDERINGS, counts


def test_a_one_step_round_sends_one_tensor_each_way() -> None:
    """The one-step closure (the barrier and the apply on the chief): the weights in, the
    gradients out into the packed accumulators, nothing else."""
    steps, v = _steps(2)
    assert len(v.accumulators) == 1  # one PS: one packed accumulator
    counts = crossings(steps.bsp_accumulate, _iterator(), tf.constant(0, tf.int32))
    assert (counts["to_ps"], counts["to_worker"]) == (1, 1), counts


@pytest.mark.parametrize("workers", [1, 2])
def test_a_round_of_the_looped_group_closure_crosses_two_scalars_more(workers) -> None:
    """The looped group closure (`Steps.bsp_looped`, one trace for every K: a graph loop
    whose body is one round) crosses what a round of the unrolled closure does (the weights
    in, the gradients out, one tensor per PS each) and what the loop carries from one round
    to the next: its values enter the body on the worker, so the global step and the count
    of rounds applied, made on the PS, cross to the worker and back once per round (two
    int64 scalars each way). Pinned so that nothing more creeps in."""
    steps, _ = _steps(workers)
    args = (_iterator(), tf.constant(0, tf.int32), tf.constant(1, tf.int64),
            tf.constant(3, tf.int64))
    body = loop_body(steps.bsp_looped, *args)
    counts = graph_crossings(body, body.inputs)
    assert (counts["to_ps"], counts["to_worker"]) == (1 + 2, 1 + 2), counts
    assert counts["control_to_ps"] + counts["control_to_worker"] <= ORDERINGS, counts
