"""The chief's silence: a chief that hangs without dying is killed, so recovery restarts it.

The chief's heartbeat names a hung worker or parameter server (trainer/heartbeat.py), but
nothing watched the chief itself: a chief whose process is stopped (SIGSTOP) or stuck (alive,
its host up, its pipes open) sends nothing and never exits, and the run waited on it forever.

What a training chief sends, and when: ``step`` every ``report_every_s`` from its main loop
(trainer/meter.py `Meter.observe`, between chunks of closures), ``checkpoint`` after each save,
``worker_steps`` from a fetcher thread that trails the reports. Its other threads (heartbeats,
the PS watchdog, notices, the lease) speak only when something changes, so a stuck main loop
leaves the chief silent. Its legitimate long silences are all outside the watched window or
far below the limit: the start-up before ``train_start`` (TensorFlow's import, building the
model, tracing the closures: not watched), a restart under way (not watched: the restart's
own deadline covers it), the time after ``train_end`` (not watched: the final evaluation is
the evaluator's, with its own deadline), a checkpoint save or a first BSP trace at a switch
(seconds to tens of seconds). A frozen parameter server stalls the main loop too (its
heartbeat says ``ps_unresponsive`` once, then nothing): a PS frozen longer than the limit
gets the same treatment, a restart of the cluster from its checkpoint, which is what ends
that hang too; the event names the silent PSes then.

So the rule is total silence: while the chief trains (after its ``train_start``, before its
``train_end`` or exit) and no restart is under way, no event at all from it for
``cluster.recovery.chief_silence_s`` (default: :func:`chief_silence_s`). Then the supervisor
records ``chief_unresponsive`` ``{"silent_s", "limit_s", "step", "host", "ps_unresponsive"}``
and kills the chief's process (SIGKILL to its group, through the deployment): its
``process_exit`` takes the path of any chief that died (orchestrator/runtime/supervisor.py
``on_exit``), a restart from the newest checkpoint counted in ``restarts`` and
``roles_restarted``. Times are the orchestrator's monotonic clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config.schema import ExperimentConfig
from orchestrator.rundir import results
from orchestrator.transient.recovery import Action, RecordedEvent, RecoveryDecision
from provisioning.base import Role
from trainer import events

EVENT_CHIEF_UNRESPONSIVE = "chief_unresponsive"
#: The default limit: never under MIN_CHIEF_SILENCE_S, nor under this many missed reports. A
#: loaded machine has held a chief's main thread for tens of seconds (a closure's trace): 300 s
#: is far from any of those, and still ends a frozen chief's run.
MIN_CHIEF_SILENCE_S = 300.0
MISSED_REPORTS = 30


def chief_silence_s(configured: float | None, report_every_s: float,
                    contact_grace_s: float = 0.0) -> float:
    """The silence after which a training chief is hung: the configured one, else
    max(MIN_CHIEF_SILENCE_S, MISSED_REPORTS × report_every_s + the provider's contact grace).
    The grace: while the orchestrator cannot reach the chief's machine (its own network
    dropped) the chief's events wait on the machine; the provider either gets them back or
    calls the machine lost within its grace, so a silence that long is not the chief's."""
    if configured is not None:
        return float(configured)
    return max(MIN_CHIEF_SILENCE_S, MISSED_REPORTS * report_every_s + contact_grace_s)


class ChiefWatch:
    """Times the chief's silence while it trains (the module docstring's rule)."""

    def __init__(self, silence_s: float) -> None:
        self.silence_s = silence_s
        self.heard_at: float | None = None  # monotonic; None = not training: nothing watched
        self.silent_ps: set[object] = set()  # PSes the chief named silent (ps_unresponsive)

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> ChiefWatch:
        return cls(chief_silence_s(cfg.cluster.recovery.chief_silence_s, cfg.report_every_s,
                                   cfg.provider.contact_grace_s()))

    def heard(self, role: str, kind: str, fields: Mapping[str, Any],
              now: float | None = None) -> None:
        """A trainer event arrived; only the chief's count."""
        if role != Role.CHIEF.value:
            return
        now = time.monotonic() if now is None else now
        if kind == events.EVENT_TRAIN_START:
            self.heard_at, self.silent_ps = now, set()
        elif kind in (events.EVENT_TRAIN_END, results.EVENT_PROCESS_EXIT):  # the exit: the deployer's event
            self.heard_at = None
        elif self.heard_at is not None:
            self.heard_at = now
        if kind == events.EVENT_PS_UNRESPONSIVE:
            self.silent_ps.add(fields.get("ps"))
        elif kind == events.EVENT_PS_RESPONSIVE:
            self.silent_ps.discard(fields.get("ps"))

    def due(self, restarting: bool, step: int, now: float | None = None
            ) -> RecordedEvent | None:
        """The ``chief_unresponsive`` event when the chief has been silent too long now, else
        None. ``restarting``: a restart is under way (its chief is not training yet). After
        one it waits a whole limit again, so a kill that brought no exit is tried again."""
        now = time.monotonic() if now is None else now
        if self.heard_at is None:
            return None
        if restarting:
            self.heard_at = now
            return None
        silent = now - self.heard_at
        if silent < self.silence_s:
            return None
        self.heard_at = now
        return RecordedEvent(EVENT_CHIEF_UNRESPONSIVE, {
            "silent_s": round(silent, 1), "limit_s": self.silence_s, "step": step,
            "ps_unresponsive": sorted(p for p in self.silent_ps if isinstance(p, int))})


class Supervised(Protocol):
    """What :func:`watch_chief` needs of orchestrator/runtime/supervisor.py's Supervisor
    (named here, not imported: the supervisor imports this module)."""

    chief_watch: ChiefWatch

    @property
    def awaiting_restart(self) -> RecoveryDecision | None: ...
    @property
    def pending(self) -> Sequence[RecoveryDecision]: ...
    @property
    def fleet(self) -> Any: ...  # orchestrator.runtime.fleet.Fleet
    @property
    def run_state(self) -> Any: ...  # orchestrator.rundir.record.RunState

    def record(self, events: Any) -> None: ...


def watch_chief(sup: Supervised) -> None:
    """The supervisor's tick: when the training chief has been silent too long, record
    ``chief_unresponsive`` and SIGKILL its process through the deployment; the chief's
    ``process_exit`` then goes the way of any chief that died (a restart from checkpoint)."""
    restarting = sup.awaiting_restart is not None or any(
        d.action == Action.restart for d in sup.pending)
    event = sup.chief_watch.due(restarting, sup.run_state.global_step)
    if event is None:
        return
    task = sup.fleet.deployment.tasks.get((Role.CHIEF, 0))
    host = None if task is None else task.host.spec.name
    sup.record(RecordedEvent(event.kind, {**event.fields, "host": host}))
    if task is not None:
        task.process.kill()  # a stopped process dies of SIGKILL too; no-op once it exited


def closing_note(run_dir: Path) -> str:
    """For the run's closing line: how often the chief was found hung and restarted, from
    ``events.jsonl`` (every attempt of the run); "" when never."""
    try:
        with open(run_dir / results.EVENTS_FILE, encoding="utf-8", errors="replace") as f:
            found = [json.loads(line) for line in f if EVENT_CHIEF_UNRESPONSIVE in line]
    except (OSError, ValueError):
        return ""
    found = [e for e in found if e.get(results.EVENT_KIND) == EVENT_CHIEF_UNRESPONSIVE]
    if not found:
        return ""
    times = "" if len(found) == 1 else f" {len(found)} times"
    limit = float(found[0].get("limit_s") or 0)
    return (f"; the chief was unresponsive{times} (no event for {limit:g} s: killed for a "
            f"restart from its checkpoint)")
