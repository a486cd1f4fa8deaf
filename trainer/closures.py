"""Steps per closure, and what a protocol's runner offers the training loop.

One closure may run several steps in a loop on its worker, so that the chief's cost per
closure (Python dispatch, one RPC round) is paid once per K steps. `job.steps_per_closure`
fixes K; 0 picks it from the measured on-worker step time so that a closure lasts about
TARGET_CLOSURE_S (`auto_steps_per_closure`); the first steps of each protocol run one per
closure to measure it (trainer/asp.py, trainer/bsp.py). Counts are tensor arguments (or PS
variables), so a short last closure keeps budgets exact without a retrace.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainer.waits import fetch_or_none

# Automatic steps per closure: a closure should last about this long on its worker, so the
# chief's per-closure cost (a few ms of Python and RPC) stays a small share of it, while a
# control request or a phase boundary still waits at most this long for a closure to end.
TARGET_CLOSURE_S = 0.05
MAX_AUTO_STEPS_PER_CLOSURE = 32


class Runner(Protocol):
    """A protocol's scheduler on the chief (trainer/asp.py `AspRunner`, trainer/bsp.py
    `BspRunner`)."""

    def __call__(self, n: int) -> tuple[int, list[Any]]:
        """Up to `n` global steps; returns (steps scheduled or applied, closure results)."""

    def drain(self) -> list[Any]:
        """Wait for what is in flight (not closures of hung workers); their results."""

    def warm(self) -> None:
        """Trace the protocol's functions before the clock starts (and before a worker can
        hang: a function first traced mid-run is registered with every worker then)."""


def auto_steps_per_closure(step_time_s: float) -> int:
    """K such that K steps of `step_time_s` last about TARGET_CLOSURE_S (1..MAX)."""
    if step_time_s <= 0:
        return MAX_AUTO_STEPS_PER_CLOSURE
    return max(1, min(MAX_AUTO_STEPS_PER_CLOSURE, round(TARGET_CLOSURE_S / step_time_s)))


def median_step_time(results: list[Any]) -> float | None:
    """The median on-worker step time of finished closures (None if all were lost)."""
    times = [float(r[2]) for r in map(fetch_or_none, results) if r is not None and r[3] > 0]
    return sorted(times)[len(times) // 2] if times else None
