"""trainer/steps.py: one update per global step, and budgets exact, by construction.

In process (one device stands in for the parameter server, as in test_packing.py): BSP's
apply placed wholly on the PS (so a worker killed while it runs cannot leave it half done),
one update and one step per round, a BSP group run by one worker ends exactly at its stop
(a group of K rounds opened for fewer applies only those),
and ASP steps past the stretch's stop (a closure run twice, or late) change nothing. The
multi-process tests (test_trainer_cluster.py, test_trainer_hang.py) kill and hang real
workers."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from trainer.models import build_model  # noqa: E402
from trainer.optim import PSOptimizer  # noqa: E402
from trainer.spec import JobSpec  # noqa: E402
from trainer.steps import Steps  # noqa: E402
from trainer.variables import create_ps_variables  # noqa: E402

PS = "/job:localhost/replica:0/task:0/device:CPU:0"


def _steps(workers: int) -> tuple:
    """The step graphs over variables pinned to PS (the trainer's, as trainer/loop.py makes
    them); returns (steps, v, model, optimizer)."""
    strategy = tf.distribute.get_strategy()
    job = JobSpec(batch_size=4)
    tf.keras.utils.set_random_seed(0)
    with tf.device(PS):
        model = build_model("cnn", "cnn_small", (8, 8, 1), 10)
        optimizer = PSOptimizer(job, model.trainable_variables, strategy)
        v = create_ps_variables(strategy, optimizer)
    return Steps(strategy, model, optimizer, job, v, [], workers), v, model, optimizer


def _dataset() -> object:
    rng = np.random.default_rng(0)
    images = rng.normal(size=(64, 8, 8, 1)).astype("float32")
    labels = rng.integers(0, 10, size=64).astype("int32")
    return iter(tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(4))


def test_the_apply_runs_wholly_on_the_ps() -> None:
    """Every op of the conditional apply (its check and both branches) is placed on a PS:
    an op left to the caller's device (a worker in a BSP round) made the PS wait for that
    worker mid-apply, so a worker killed there left the update applied and the step
    unmoved (`bsp_updates` one ahead of the global step)."""
    steps, _, _, _ = _steps(2)
    graph = steps.bsp_apply.get_concrete_function().graph
    conds = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(conds) == 1 and PS in conds[0].device, [(c.type, c.device) for c in conds]
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    branches = [conds[0].get_attr(b).name for b in ("then_branch", "else_branch")]
    # a variable read has no device of its own: the placer puts it with its variable
    unplaced = [f"{node.op} {node.name}" for name in branches
                for node in library[name].node_def
                if PS not in node.device and node.op != "ReadVariableOp"]
    assert not unplaced, unplaced


def test_one_update_per_apply_and_the_accumulators_reset() -> None:
    steps, v, model, _ = _steps(2)
    for acc in v.accumulators:
        acc.assign(tf.ones(acc.shape, acc.dtype))
    v.grad_count.assign(2.0)
    before = [w.numpy().copy() for w in model.trainable_variables]
    steps.bsp_apply()
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 1
    assert int(v.bsp_gradients.numpy()) == 2 and float(v.grad_count.numpy()) == 0.0
    assert all(not acc.numpy().any() for acc in v.accumulators)
    assert all(not np.array_equal(b, w.numpy())
               for b, w in zip(before, model.trainable_variables, strict=True))


def test_a_group_applies_exactly_its_rounds_and_a_closed_one_nothing() -> None:
    """One worker (quorum 1) runs a group of 3 rounds: 3 updates, 3 steps; the same closure
    for a group that is not open (a rerun or a hung closure of a closed group) applies none."""
    steps, v, _, _ = _steps(1)
    iterator, worker = _dataset(), tf.constant(0, tf.int32)
    group = tf.constant(7, tf.int64)
    start = int(steps.bsp_open(group, tf.constant(3, tf.int64)))
    result = steps.bsp_rounds(3)(iterator, worker, group).numpy()
    assert start == 0 and int(result[3]) == 3
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 3
    steps.bsp_close()
    result = steps.bsp_rounds(3)(iterator, worker, group).numpy()
    assert int(result[3]) == 0
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 3


def test_the_sole_workers_closures_share_a_group_up_to_its_stop() -> None:
    """The sole worker's group holds several closures (trainer/bsp.py): opened for 7 steps,
    closures of 3 rounds apply 3, 3, then the 1 left before the stop; one more (a rerun after
    the worker's loss) applies nothing; every step is one update."""
    steps, v, _, _ = _steps(1)
    iterator, worker = _dataset(), tf.constant(0, tf.int32)
    group = tf.constant(3, tf.int64)
    steps.bsp_open(group, tf.constant(7, tf.int64))
    rounds = steps.bsp_rounds(3)
    applied = [int(rounds(iterator, worker, group).numpy()[3]) for _ in range(4)]
    assert applied == [3, 3, 1, 0]
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 7
    assert int(v.bsp_gradients.numpy()) == 7


def test_a_group_of_two_workers_waits_on_the_ps_and_a_close_wakes_it() -> None:
    """Two workers (two threads here) run a group of 3 rounds: 3 steps, each one update
    from both gradients (their barrier held on the PS: the round's applier wakes both),
    and no wake token is left over. A worker alone in a group waits at its first round's
    barrier until the chief closes the group; woken, it applies nothing more."""
    import threading

    steps, v, _, _ = _steps(2)
    rounds = steps.bsp_rounds(3)
    group = tf.constant(7, tf.int64)
    steps.bsp_open(group, tf.constant(3, tf.int64))
    results: dict[int, object] = {}

    def run(worker: int, group: object) -> None:
        results[worker] = rounds(_dataset(), tf.constant(worker, tf.int32), group).numpy()

    pair = [threading.Thread(target=run, args=(w, group)) for w in (0, 1)]
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join(120)
    assert [int(results[w][3]) for w in (0, 1)] == [3, 3], results
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 3
    assert int(v.bsp_gradients.numpy()) == 6
    assert [int(q.size().numpy()) for q in steps.wakes] == [0, 0]

    alone = tf.constant(8, tf.int64)
    steps.bsp_open(alone, tf.constant(3, tf.int64))
    waiter = threading.Thread(target=run, args=(0, alone), daemon=True)
    waiter.start()
    waiter.join(3)
    assert waiter.is_alive()  # at the barrier: the other worker's gradient never comes
    steps.bsp_close()
    waiter.join(60)
    assert not waiter.is_alive() and int(results[0][3]) == 0, results
    assert int(steps.bsp_discard()) == 3 and float(v.grad_count.numpy()) == 0.0
    assert int(v.bsp_updates.numpy()) == 3


def test_asp_steps_past_the_stop_are_dropped_whole() -> None:
    """A stretch opened for 3 steps applies 3 of a 5-step closure; a closure run again (as
    TensorFlow reruns one after a worker loss) then changes no weight, no momentum and no
    counter: the budget is exact and a dropped step leaves no trace in the weights and the
    optimizer (batch-norm statistics, averages and not updates, are written as computed)."""
    steps, v, model, optimizer = _steps(2)
    iterator, worker = _dataset(), tf.constant(0, tf.int32)
    steps.asp_open(tf.constant(3, tf.int64))
    result = steps.asp(iterator, worker, tf.constant(5, tf.int64)).numpy()
    assert int(result[3]) == 5  # the closure ran its 5 steps ...
    assert int(v.global_step.numpy()) == 3  # ... and 3 were applied and counted
    state = [x.numpy().copy() for x in model.trainable_variables]
    slots = [s.numpy().copy() for var_slots in optimizer.slots for s in var_slots]
    assert int(optimizer.iterations.numpy()) == 3
    steps.asp(iterator, worker, tf.constant(4, tf.int64))  # a rerun, past the stop
    assert int(v.global_step.numpy()) == 3
    for old, new in zip(state, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(old, new.numpy())
    for old, new in zip(slots, [s for vs in optimizer.slots for s in vs], strict=True):
        np.testing.assert_array_equal(old, new.numpy())
    assert int(optimizer.iterations.numpy()) == 3
    steps.asp_open(tf.constant(5, tf.int64))  # the next stretch: two more steps
    steps.asp(iterator, worker, tf.constant(4, tf.int64))
    assert int(v.global_step.numpy()) == 5


def test_the_last_gradient_of_a_one_step_round_applies_it() -> None:
    """One-step rounds of two workers: the first closure only accumulates, the second (the
    round's second ticket) applies the mean in the same call; no apply from the chief."""
    steps, v, _, _ = _steps(2)
    iterator = _dataset()
    steps.bsp_accumulate(iterator, tf.constant(0, tf.int32))
    assert int(v.global_step.numpy()) == 0 and float(v.grad_count.numpy()) == 1.0
    steps.bsp_accumulate(iterator, tf.constant(1, tf.int32))
    assert int(v.global_step.numpy()) == int(v.bsp_updates.numpy()) == 1
    assert int(v.bsp_gradients.numpy()) == 2 and float(v.grad_count.numpy()) == 0.0
    assert all(not acc.numpy().any() for acc in v.accumulators)
