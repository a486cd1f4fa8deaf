"""Instrumented crash points: ``TRANSIENT_KILL_AT=<point>[:<n>]`` SIGKILLs the orchestrator.

Why: ``--resume`` (orchestrator/resume.py) claims that the orchestrator can die at any moment of
its life and a resume still re-runs no completed point, duplicates no row and leaves nothing
running. That claim is only worth what its tests kill, so the places where a crash is most
awkward call :func:`hit` with a name, and the test names one of them. ``n`` (default 1) kills at
the n-th time this process reaches that point (``train_step:3``: the third step event).

What dies is what dies in a real crash (laptop asleep, ``kill -9``, OOM killer): this process
only, with SIGKILL, so no ``finally`` block, no atexit and no signal handler runs. Its children
see it as they would see a real crash: local roles get their parent-death signal, sweep points
of the parallel launcher get SIGTERM, remote roles keep running until their lease lapses or a
release stops them. ``torn`` writes part of a record first, the way a process killed inside a
``write`` leaves a half line behind.

Unset (the normal case) a hit costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

ENV = "TRANSIENT_KILL_AT"

#: Every instrumented point, with where it is (the tests kill at each; docs list them).
POINTS = {
    "run_dir": "config and plan recorded, nothing provisioned (runtime/run.py)",
    "provisioning": "hosts acquired and journaled, no role started (runtime/run.py)",
    "deploy": "roles started and ready, before the ready event (runtime/fleet.py)",
    "train_step": "a chief step event received (runtime/supervisor.py)",
    "checkpoint_sync": "a checkpoint reported, before the store sync (runtime/fleet.py)",
    "recovery": "a recovery (replace or restart) about to act (runtime/supervisor.py)",
    "final_eval": "training ended (DONE), the final evaluation running (runtime/supervisor.py)",
    "teardown": "the run ended, hosts not yet released (runtime/run.py)",
    "summary": "half of summary.json's temporary file written (orchestrator/rundir/results.py)",
    "archive": "summary written, results not yet archived by the store (runtime/run.py)",
    "runs_csv_row": "half of the runs.csv row written (orchestrator/sweep.py)",
    "point_start": "a sweep point about to start (orchestrator/__main__.py)",
    "launches": "half of a launches.jsonl line written (orchestrator/parallel.py)",
    "resume": "a resumed point cleaned up, before it restarts (orchestrator/resume.py)",
}

_target: tuple[str, int] | None = None
_counts: dict[str, int] = {}


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, n = value.partition(":")
    if point not in POINTS:
        raise ValueError(f"{ENV}={value}: unknown point {point!r} (one of {', '.join(POINTS)})")
    return point, int(n) if n else 1


def hit(point: str, torn: Callable[[], None] | None = None) -> None:
    """SIGKILL this process here if ``TRANSIENT_KILL_AT`` names this point and this is its n-th
    hit; ``torn`` (a partial write) runs just before."""
    global _target
    if _target is None:
        if ENV not in os.environ:
            return
        _target = _parse(os.environ[ENV])
        if _target is None:
            return
    assert point in POINTS, point
    if _target[0] != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] != _target[1]:
        return
    if torn is not None:
        torn()
    print(f"[killpoint] SIGKILL at {point}:{_target[1]} (pid {os.getpid()})", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def torn_write(path: os.PathLike[str] | str, text: str) -> Callable[[], None]:
    """A ``torn`` action: append the first half of ``text`` to ``path`` (no newline)."""
    def write() -> None:
        with open(path, "a") as fh:
            fh.write(text[: max(1, len(text) // 2)])
    return write
