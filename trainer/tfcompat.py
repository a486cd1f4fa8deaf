"""Work-arounds for TensorFlow internals that make one hung worker stall the whole cluster.

Found with a SIGSTOPped worker in a local ASP run (2.21): the other workers stopped after
their current closure and waited until the stopped one was resumed. Python stacks of the
chief showed each healthy worker thread of the `ClusterCoordinator` blocked in
`Executor.__del__` -> `wait()` when leaving `context.executor_scope(worker.executor)`:

- `context.executor_scope` saves the thread's previous executor as a new Python `Executor`
  wrapper (`Context.executor` builds one per call) and drops it when the scope ends;
- `Executor.__del__` waits for every pending node of the executor it wraps, here the
  context's default executor;
- the default executor holds the asynchronous `DestroyTensorHandle` requests sent when the
  chief drops a remote tensor (every closure's outputs, on every worker), and the one sent to
  the stopped worker never completes until it runs again (or its connection fails).

So every closure on every worker ended by waiting for an RPC to the hung worker. The wrapper
returned by `Context.executor` does not own the executor (it only borrows the context's
handle), so waiting when it is dropped is not needed for correctness: `install()` makes
`Context.executor` return a borrowed view whose deletion frees the view without waiting.
Explicit waits (`context.async_wait()`, `executor.wait()`) keep their meaning.

The chief's checkpoints stalled the same way: with variables on more than one task (the PS
and the chief's save counter), `MultiDeviceSaver.save` wraps the save in a new
`tf.function` each time, and registering that function with the eager context blocked on
the hung worker (the context registers every new function on every remote worker).
`install()` makes it run the same save ops eagerly instead (what TF does for one task):
one shard after the other, no function to register; a checkpoint of digits takes the same
~0.2 s.

New functions stalled the chief too (a SIGSTOPped worker in an orchestrated ASP run: 30 s
with no step and no heartbeat event). Registering a function (`TFE_ContextAddFunction`)
sends it to every remote worker and waits for each to answer, holding the GIL; and every
eager op kind's first use on the chief runs as a small function registered the same way
(the first checkpoint's save counter and save ops). `install()` makes the chief's eager ops
run as kernels (`TFE_ContextSetRunEagerOpAsFunction`), and the trainer traces its functions
before training or, the unrolled closure, in a thread while no worker is named hung
(trainer/closures.py `prepare_unrolled`).

Which closure a worker runs is not public either: `install()` records it
(`Worker._process_closure`), so that the chief can tell a closure held by a hung worker
from one a healthy worker is still running (`held_by`, trainer/waits.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

_installed = False
_held: dict[int, Any] = {}  # worker index -> weak reference to its closure's RemoteValue


def install() -> bool:
    """Patch `Context.executor` (idempotent). False, with a printed reason, where the
    internals moved: the cluster then works as before, stalls included."""
    global _installed
    if _installed:
        return True
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context, executor

        original = context.Context.executor
        assert isinstance(original, property) and original.fset is not None
        assert hasattr(pywrap_tfe, "TFE_ContextGetExecutorForThread")
    except (ImportError, AttributeError, AssertionError) as exc:
        print(f"[chief] executor work-around not installed ({exc!r}): a hung worker "
              "stalls the others until it returns", flush=True)
        return False

    class BorrowedExecutor(executor.Executor):
        """The thread's current executor, borrowed: dropping it does not wait for it."""

        __slots__ = ()

        def __del__(self) -> None:
            with contextlib.suppress(TypeError):  # interpreter shutdown, as upstream
                pywrap_tfe.TFE_DeleteExecutor(self._handle)  # frees the view only

    def borrowed(self: Any) -> executor.Executor:
        self.ensure_initialized()
        return BorrowedExecutor(pywrap_tfe.TFE_ContextGetExecutorForThread(
            self._context_handle))

    context.Context.executor = property(borrowed, original.fset, doc=original.__doc__)
    _installed = (_eager_ops_as_kernels() and _eager_multi_task_save()
                  and _track_held_closures())
    return _installed


def _eager_ops_as_kernels() -> bool:
    """The chief's eager ops run as kernels, not wrapped in one small function per kind of
    op: each such function was registered with every worker on the op's first use, in a call
    that waits for each worker to answer, so a first checkpoint (its save counter, its
    save ops) or a first BSP step waited for a hung worker."""
    from tensorflow.python import pywrap_tfe
    from tensorflow.python.eager import context

    setter = getattr(pywrap_tfe, "TFE_ContextSetRunEagerOpAsFunction", None)
    if setter is None:
        print("[chief] eager-op work-around not installed: a first use of an eager op "
              "waits for a hung worker", flush=True)
        return False
    ctx = context.context()
    ctx.ensure_initialized()
    setter(ctx._handle, False)
    return True


def held_by(workers: frozenset[int]) -> set[int] | None:
    """`id()`s of the RemoteValues of the closures these workers run now; None when the
    tracking is not installed (nobody can tell: callers wait for every closure)."""
    if not _installed:
        return None
    held = set()
    for index in workers:
        ref = _held.get(index)
        value = ref() if ref is not None else None
        if value is not None:
            held.add(id(value))
    return held


def _track_held_closures() -> bool:
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    worker_class = cluster_coordinator.Worker
    process = getattr(worker_class, "_process_closure", None)
    if process is None or not hasattr(cluster_coordinator.Closure, "build_output_remote_value"):
        print("[chief] closure tracking not installed: the chief waits for hung workers",
              flush=True)
        return False

    def tracked(self: Any, closure: Any) -> Any:
        _held[self.worker_index] = getattr(closure, "_output_remote_value_ref", None)
        try:
            return process(self, closure)
        finally:
            _held.pop(self.worker_index, None)

    worker_class._process_closure = tracked
    return True


def _eager_multi_task_save() -> bool:
    from tensorflow.python.checkpoint import functional_saver

    saver = functional_saver.MultiDeviceSaver
    if not hasattr(saver, "save"):
        print("[chief] checkpoint work-around not installed: a hung worker stalls "
              "checkpoints until it returns", flush=True)
        return False
    save = saver.save

    def eager_save(self: Any, *args: Any, **kwargs: Any) -> Any:
        tasks = getattr(self, "_num_unique_tasks", 1)
        self._num_unique_tasks = 1  # skips the per-save tf.function (see the docstring)
        try:
            return save(self, *args, **kwargs)
        finally:
            self._num_unique_tasks = tasks

    saver.save = eager_save
    return True


def schedule_specs(args: tuple) -> list[Any]:
    """The arguments `ClusterCoordinator.schedule(fn, args)` traces `fn` with: worker 0's
    slice of per-worker values, as type specs (private TF; a trace made with them is the one
    `schedule` finds in the function's cache)."""
    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    return list(tf.nest.map_structure(cc._maybe_as_type_spec,
                                      cc._select_worker_slice(0, tuple(args))))


# --- the state of a scheduled closure (ClusterCoordinator's RemoteValue) -------------------
# Whether a closure has finished is not public: `RemoteValue` sets a private event when its
# function returned (or failed), and a private flag once the result is copied to the chief.
# Everything that reads them is here (trainer/waits.py calls these); where they moved,
# `watchable` is False and the callers fall back to waiting for every closure.


def watchable(remote: Any) -> bool:
    """Whether `remote`'s progress can be watched without waiting for it."""
    return getattr(remote, "_status_available_event", None) is not None


def returned(remote: Any) -> bool:
    """Whether `remote`'s function has returned (or failed); True where nobody can tell."""
    event = getattr(remote, "_status_available_event", None)
    return event is None or event.is_set()


def copied(remote: Any) -> bool:
    """Whether `remote`'s result is on the chief (or there is none: failed, aborted)."""
    return (getattr(remote, "_has_fetched_to_local", True)
            or getattr(remote, "_values", None) is None)


def wait_returned(remote: Any, seconds: float) -> None:
    """Wait up to `seconds` for `remote`'s function to return."""
    remote._status_available_event.wait(seconds)


# --- per-worker values and the in-graph sleep ---------------------------------------------


def per_worker_values(coordinator: Any, make: Any) -> Any:
    """A PerWorkerValues whose slice on worker i is the resource `make(i)` (a tf.function)
    creates there. TF has no public way to build one; this uses the coordinator's per-worker
    resource closures, the mechanism behind per-worker datasets: they are re-run when a
    worker recovers. Raises AttributeError, ImportError, TypeError or AssertionError where
    those internals moved."""
    from tensorflow.python.distribute.coordinator.values import PerWorkerValues

    return PerWorkerValues(tuple(w.create_resource(make(w.worker_index))
                                 for w in coordinator._cluster.workers))


def sleep(seconds: Any) -> Any:
    """In-graph sleep on the device running the function; returns a tensor to depend on.
    A tf.data sleep (TensorFlow's test transformation): no CPU is burnt, and unlike
    tf.py_function it runs on a remote worker."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing

    micros = tf.cast(seconds * 1e6, tf.int64)
    ds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).apply(testing.sleep(micros))
    return ds.take(1).reduce(tf.constant(0, tf.int64), lambda a, b: a + b)
