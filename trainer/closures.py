"""Steps per closure, their unrolled closures' traces, and what a protocol's runner offers
the training loop.

One closure may run several steps in a loop on its worker, so that the chief's cost per
closure (Python dispatch, one RPC round) is paid once per K steps. `job.steps_per_closure`
fixes K; 0 picks it from the measured on-worker step time so that a closure lasts about
TARGET_CLOSURE_S (`auto_steps_per_closure`); the first steps of each protocol run one per
closure to measure it (trainer/asp.py, trainer/bsp.py). Counts are tensor arguments (or PS
variables), so a short last closure keeps budgets exact without a retrace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from trainer.waits import fetch_or_none

# Automatic steps per closure: a closure should last about this long on its worker, so the
# chief's per-closure cost (a few ms of Python and RPC) stays a small share of it, while a
# control request or a phase boundary still waits at most this long for a closure to end.
TARGET_CLOSURE_S = 0.05
MAX_AUTO_STEPS_PER_CLOSURE = 32
TRACE_NICE = 10  # the background trace of an unrolled closure (prepare_unrolled)
# Closures in flight per worker: an ASP chunk's (steps per worker at K > 1, trainer/asp.py),
# and the sole BSP worker's two batches (trainer/bsp.py); a control request waits for at
# most this many closures (about 0.4 s at automatic K).
CLOSURES_PER_CHUNK_PER_WORKER = 8


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


def prepare_unrolled(fn: Callable, args: tuple, on_ready: Callable[[Callable], Any],
                     background: bool = True, scope: Callable[[], Any] | None = None) -> None:
    """Trace `fn` for `coordinator.schedule(fn, args)` in a daemon thread (or now, when not
    `background`), then call `on_ready(concrete function)`, which the chief schedules as it
    is; the chief keeps scheduling meanwhile. `scope`: the distribution strategy's scope,
    which `schedule` traces in.

    Tracing a K-step closure takes seconds (K copies of the model's step), and a new
    function is registered on every worker (`TFE_ContextAddFunction`), a call that waits
    for each worker to answer while it holds the GIL: with a worker hung then, every thread
    of the chief stopped, the heartbeat's included, until the worker resumed (seen: 30 s of
    no step and no `worker_unresponsive`; again 2026-11-28 for BSP's, the heartbeat in its
    4 s call 15 s after the stop). So the trace runs off the chief's thread, and starts only
    while no worker is named hung (a worker that hangs during the trace's seconds, before
    the registration, still holds it: tests that hang a worker wait for
    `closure_unrolled`), and `schedule` gets the concrete function: given the
    plain function it looks the trace up under its own key (the strategy's scope is part
    of it) and, missing, traced and registered it again on the chief's thread. A trace that
    fails (a PS lost meanwhile) leaves the looped closure in use."""
    import contextlib
    import threading

    from trainer.heartbeat import HEARTBEAT_S, unresponsive
    from trainer.server import lower_thread_priority
    from trainer.tfcompat import schedule_specs

    def trace() -> None:
        try:
            with (scope or contextlib.nullcontext)():
                concrete = fn.get_concrete_function(*schedule_specs(args))
        except Exception as exc:  # the looped closure stays in use
            print(f"[chief] unrolled closure not traced ({type(exc).__name__}: {exc}); "
                  "steps stay in a loop", flush=True)
            return
        on_ready(concrete)

    def low_priority_trace() -> None:
        # on a shared host (the local backend) the trace's CPU would come out of the
        # workers' steps meanwhile; at low priority they keep running the looped closure
        lower_thread_priority(TRACE_NICE)
        while unresponsive():  # registering now would wait for the hung worker (above)
            time.sleep(HEARTBEAT_S)
        trace()

    if background:
        threading.Thread(target=low_priority_trace, name="trace-unrolled", daemon=True).start()
    else:
        trace()
