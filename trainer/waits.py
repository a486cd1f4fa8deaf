"""Waiting for closures on workers that may be lost or hung, without stalling the chief.

A finished closure's result lives on its worker until it is copied to the chief; a worker
that hangs without dying (SIGSTOP, a frozen host) holds its closure until gRPC keepalive
declares it lost (~10 s, minutes at worst), and anything that reads that closure's result,
or `coordinator.join()`, waits for it. So the chief never waits for a closure blindly: it
watches each closure's status (`finished`, private TF state read in trainer/tfcompat.py)
and, once its heartbeat names hung workers (trainer/heartbeat.py), leaves the closures they
hold behind (`all_hung`, `settle`, `barrier`). `Membership` is what the chief knows of its
workers' health from the coordinator's log records (trainer/meter.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trainer import tfcompat

CHUNK_POLL_S = 0.005  # how often the chief re-counts a chunk's unfinished closures
SETTLE_POLL_S = 0.05  # how often a drain re-counts (and re-reads the hung workers)
COPY_POLL_S = 0.001  # how often a wait re-checks a result being copied to the chief


class Membership:
    """What the chief knows of its workers' health, fed by the coordinator's log records
    (trainer/meter.py): `disruptions` counts every failed closure (a lost worker or a
    transient failure whose closure is put back), `lost` holds the workers failed and not
    rejoined. Written by the coordinator's threads, read by the chief's main thread."""

    def __init__(self) -> None:
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


def finished(remote: Any) -> bool:
    """Whether a closure is done, its result copied to the chief (or failed), so that
    reading it never waits. Where TF's internals moved, everything counts as finished
    once waited for.

    The function's return (its updates to the PS done) sets the status; the coordinator
    then copies the result to the chief, which on a worker hung at that moment waits for the
    worker, and so would anything that reads the result, or `coordinator.join()`."""
    if not tfcompat.watchable(remote):
        return True
    return tfcompat.returned(remote) and tfcompat.copied(remote)


def pause(remote: Any, seconds: float) -> None:
    """Wait up to `seconds` for `remote`'s status; when it has one already and only its copy
    to the chief is pending (a millisecond on a live worker), a short sleep."""
    if tfcompat.returned(remote):
        time.sleep(min(seconds, COPY_POLL_S))
    else:
        tfcompat.wait_returned(remote, seconds)


def all_hung(running: list[Any]) -> bool:
    """Whether every closure in `running` (non-empty) is held by a worker that the chief's
    heartbeat names hung (trainer/heartbeat.py, trainer/tfcompat.py `held_by`)."""
    from trainer.heartbeat import unresponsive

    hung = unresponsive()
    held = tfcompat.held_by(hung) if hung else None
    return bool(held) and all(id(r) in held for r in running)


def any_hung(running: list[Any] | None = None) -> bool:
    """Whether a worker is named hung now (and, given `running`, holds one of those closures)."""
    from trainer.heartbeat import unresponsive

    hung = unresponsive()
    if not hung or running is None:
        return bool(hung)
    held = tfcompat.held_by(hung)
    return bool(held) and any(id(r) in held for r in running)


def wait_for_chunk(chunk: list[Any], workers: int) -> tuple[list[Any], list[Any]]:
    """Wait until the closures of `chunk` are finished except at most one per other worker
    (`workers - 1`); returns (finished, still running).

    A worker that hangs without dying holds its closure until gRPC keepalive declares it
    lost (~10 s); waiting for every closure would stall the chief and so every other worker
    for that long. The ones left behind are carried to the next chunk, so at most
    `workers - 1` are ever outstanding beyond the double buffer.
    """
    if not tfcompat.watchable(chunk[-1]):
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
    if not tfcompat.watchable(pending[-1]):
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
    survivor, so the step waits about UNRESPONSIVE_S, not for the hung worker. A left
    closure that ends later adds its gradient to a later step, whose mean divides by the
    count: at least once, as after a worker loss.
    """
    if not tfcompat.watchable(results[-1]):
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


def warm_on_every_worker(coordinator: Any, fn: Any, args: tuple, workers: int) -> None:
    """Run `fn(*args)` (a closure that changes nothing) on each worker, before training: a
    worker instantiates a function at its first run of it, which cost a switch's first ASP
    step 0.2 s where it landed on a worker that had not run it. `schedule` gives a closure
    to whichever worker asks first and TF has no public way to pick one; N closures
    scheduled together while the N workers are idle land one on each (each worker is busy
    with its own first run meanwhile): 5 of 5 switches took 0.03 s after it (2026-11-28).
    Per-worker resource closures, which do pick the worker, did not warm it (the switch
    took 0.47 s after them, twice). Mid-run (BSP warmed at a control switch), closures
    held by hung workers are not waited for (`settle`)."""
    settle([coordinator.schedule(fn, args=args) for _ in range(workers)], coordinator)
