"""The run record: what a run's events add up to, and the one ``summary.json`` they make.

Both players of a plan, the real run (:mod:`orchestrator.runtime`) and the model
(:mod:`orchestrator.simulate`), record the same events (``events.jsonl``); this module is the
only code that turns events into a summary:

1. :class:`RunState` is a fold over the events: ``state.apply(event)`` for each record, in order,
   as written (``{"time", "kind", "role", ...fields}``). The real run folds each event as it
   records it; the simulation folds the events it produced; a run whose orchestrator was killed
   is folded from its ``events.jsonl`` on disk (:func:`fold_events_file`), the same code.
2. :func:`summarize` turns the state, the plan and what only the player knows (status, wall time,
   cost, error) into a frozen :class:`RunSummary`, whose fields are ``summary.json``'s
   (``results.SUMMARY_FIELDS`` + ``TRANSIENT_SUMMARY_FIELDS`` + ``PREDICTION_SUMMARY_FIELDS``
   + ``SIM_SUMMARY_FIELDS``), read back by :mod:`analysis.runs`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.rundir import results
from orchestrator.transient.recovery import (
    EVENT_RECOVERY_END,
    EVENT_RECOVERY_START,
    EVENT_REPLACEMENT_READY,
    EVENT_REVOCATION,
    EVENT_SERVER_FAILURE,
    Action,
)
from orchestrator.transient.stragglers import EVENT_STRAGGLER_INJECTION_START, EVENT_STRAGGLER_START
from provisioning import catalog
from trainer import events as trainer_events
from trainer.layout import ROLE_CHIEF, ROLE_EVALUATOR

#: Measured summary fields compared with the prediction band's median (``prediction_error``).
PREDICTION_COMPARED = ("wall_time_s", "train_time_s")


def make_run_id(name: str) -> str:
    """A run's id: the experiment's name, the start time and a random suffix (unique even for
    runs started in the same second, as a sweep's are)."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def prediction_error(band: dict[str, Any] | None, summary: dict[str, Any]
                     ) -> dict[str, float] | None:
    """``(predicted median − measured) / measured`` per compared field (+0.10: predicted 10 %
    too long), for a completed run with a band of this very run; None otherwise."""
    if (not band or "unavailable" in band or band.get("stand_in")
            or summary.get("status") != results.STATUS_COMPLETED):
        return None
    errors = {}
    for name in PREDICTION_COMPARED:
        measured = summary.get(name)
        if measured and name in band:
            errors[name] = round((band[name]["p50"] - measured) / measured, 4)
    return errors or None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


@dataclass
class RunState:
    """What a run's events have said so far: a fold, changed only by :meth:`apply`.

    Global steps are the chief's (a worker's own count is not the run's). Times are the events'
    ``time`` (the orchestrator's receipt clock, unix seconds; the simulation's clock for a
    simulated run). The recovery counts are taken from the very events the recovery planner
    hands out, so the summary and the event log agree."""

    first_at: float | None = None  # the first event's time (the run's start as recorded)
    last_at: float | None = None  # the last event's time
    global_step: int = 0
    train_t0: float | None = None  # the first train_start: the clock of revocations, stragglers
    train_start: float | None = None  # the latest train_start (a restart starts training again)
    train_time_s: float | None = None  # as the chief reported it in train_end
    last_loss: float | None = None
    last_steps_per_sec: float | None = None
    final_accuracy: float | None = None
    accuracy_source: str | None = None  # where a simulated run's accuracy comes from
    last_checkpoint_step: int | None = None
    last_checkpoint_s: float = 0.0  # how long the last checkpoint took
    protocol: str | None = None  # what the chief runs now
    phases: list[dict[str, Any]] = field(default_factory=list)
    open_phase: dict[str, Any] | None = None
    switch_overhead_s: float = 0.0
    stragglers_detected: int = 0
    stragglers_injected: int = 0
    revocations: int = 0
    replacements: int = 0
    recoveries: int = 0
    restarts: int = 0
    lost_steps: int = 0
    resume_step: int | None = None  # a restart under way resumes here (its recovery_start)
    error: str | None = None  # the last failure event's
    previous_at: float | None = None  # the latest time before the event being applied
    # attempts: a `resumed` event (orchestrator/resume.py) starts the next one
    resumes: int = 0  # how many times the run was resumed
    attempt_spans: list[list[float]] = field(default_factory=list)  # [first, last] event times
    resumed_lost_steps: int = 0  # the steps each resume lost (its `resumed` event's count)
    attempt_reach: int = 0  # the furthest the latest chief got (a resume or restart: from 0)
    attempt_restored: int | None = None  # the step the latest attempt's chief restored from
    resumed_from: int | None = None  # the checkpoint step the latest resume continues from
    # the chief's reported rates (every attempt's): a resumed run with nothing left to train
    rates_sum: float = 0.0
    rates_n: int = 0
    # roles started again after a loss, per role (in place, replaced, or by a restart)
    roles_restarted: dict[str, int] = field(default_factory=dict)
    lost_roles: list[str] = field(default_factory=list)  # losses awaiting their recovery_start
    checkpoint_steps: set[int] = field(default_factory=set)  # the chief's, every attempt's
    evaluated_steps: set[int] = field(default_factory=set)
    eval_skip_reasons: dict[int, str] = field(default_factory=dict)  # the evaluator's own
    evaluator_down: bool = False  # lost, not ready again yet
    saved_while_evaluator_down: set[int] = field(default_factory=set)  # checkpoint steps

    @property
    def attempts_s(self) -> float:
        """Seconds the attempts held hosts: each attempt's first to last event."""
        return sum(b - a for a, b in self.attempt_spans)

    @property
    def earlier_attempts_s(self) -> float:
        """Seconds the attempts before the latest held hosts (0 for a run never resumed)."""
        return sum(b - a for a, b in self.attempt_spans[:-1])

    @property
    def latest_attempt_s(self) -> float:
        """The latest attempt's first to last event, in seconds."""
        return self.attempt_spans[-1][1] - self.attempt_spans[-1][0] if self.attempt_spans \
            else 0.0

    @property
    def run_lost_steps(self) -> int:
        """Steps trained again, over every attempt: after restarts and damaged checkpoints
        (:attr:`lost_steps`) and after each resume (its ``resumed`` event's count)."""
        return self.lost_steps + self.resumed_lost_steps

    def steps_per_sec(self, train_time_s: float | None) -> float | None:
        """The run's rate: its global steps over the training time; a resumed run's latest
        attempt trained from the step its chief restored, and one that had nothing left to
        train keeps the mean rate its chiefs reported."""
        if not self.resumes:
            return round(self.global_step / train_time_s, 4) if train_time_s else None
        start = self.resumed_from or 0
        if self.attempt_restored is not None:
            start = min(start, self.attempt_restored)
        done = self.global_step - start
        if train_time_s and done > 0:
            return round(done / train_time_s, 4)
        mean = self.mean_steps_per_sec
        return None if mean is None else round(mean, 4)

    @property
    def mean_steps_per_sec(self) -> float | None:
        """The mean of the rates the run reported (metrics.csv's), every attempt's."""
        return self.rates_sum / self.rates_n if self.rates_n else None

    def apply(self, event: Mapping[str, Any]) -> None:
        """Fold one event record (as written to events.jsonl) into the state."""
        kind = event.get(results.EVENT_KIND)
        role = event.get(results.EVENT_ROLE)
        at = _number(event.get(results.EVENT_TIME))
        self.previous_at = self.last_at
        if at is not None:
            if not self.attempt_spans or kind == results.EVENT_RESUMED:
                self.attempt_spans.append([at, at])
            self.attempt_spans[-1][1] = at
            self.first_at = at if self.first_at is None else min(self.first_at, at)
            self.last_at = at if self.last_at is None else max(self.last_at, at)
        step = event.get("step")
        if kind == results.EVENT_RESUMED or (kind == EVENT_RECOVERY_START
                                 and event.get("action") == Action.restart.value):
            self.attempt_reach = 0  # a new chief: the steps before were lost, and counted, there
        if isinstance(step, int | float) and not isinstance(step, bool) and role == ROLE_CHIEF:
            self.global_step = max(self.global_step, int(step))
            self.attempt_reach = max(self.attempt_reach, int(step))
        handler = _HANDLERS.get(str(kind))
        if handler is not None:
            handler(self, event, at)

    # --- the handlers, one per event kind ------------------------------------------------
    def _train_start(self, event: Mapping[str, Any], at: float | None) -> None:
        self.train_start = at
        if self.resumes and self.attempt_restored is None and \
                event.get(results.EVENT_ROLE) == ROLE_CHIEF:
            self.attempt_restored = int(event.get("step") or 0)
        if self.train_t0 is None:
            self.train_t0 = at
        resumed = int(event.get("step") or 0)
        # the new chief skipped a damaged checkpoint: the steps after the one it used are lost
        if self.resume_step is not None and resumed < self.resume_step:
            self.lost_steps += self.resume_step - resumed
            self.last_checkpoint_step = resumed
        self.resume_step = None

    def _resumed(self, event: Mapping[str, Any], at: float | None) -> None:
        # orchestrator/resume.py: the next chief should restore this step; an older one (the
        # newest checkpoint damaged) loses the steps between, as after a restart
        self.resume_step = int(event.get("from_step") or 0)
        self.resumes += 1
        self.resumed_lost_steps += int(event.get("lost_steps") or 0)
        self.resumed_from = self.resume_step
        self.attempt_restored = None
        self.train_start = self.train_time_s = None  # the new attempt's are its own
        # the dead attempt's phase ended where its chief was last seen, not when this one starts
        self._close(self.global_step, self.previous_at)

    def _step(self, event: Mapping[str, Any], at: float | None) -> None:
        self.last_loss = _number(event.get("loss"))
        self.last_steps_per_sec = _number(event.get("steps_per_sec"))
        if self.last_steps_per_sec and self.last_steps_per_sec > 0:  # metrics.csv's rates
            self.rates_sum += self.last_steps_per_sec
            self.rates_n += 1

    def _eval(self, event: Mapping[str, Any], at: float | None) -> None:
        self.final_accuracy = _number(event.get("accuracy"))
        self.accuracy_source = event.get("source")
        if isinstance(event.get("step"), int):
            self.evaluated_steps.add(int(event["step"]))

    def _eval_skipped(self, event: Mapping[str, Any], at: float | None) -> None:
        if isinstance(event.get("step"), int):
            self.eval_skip_reasons[int(event["step"])] = str(event.get("reason"))

    def _checkpoint(self, event: Mapping[str, Any], at: float | None) -> None:
        self.last_checkpoint_step = int(event.get("step", 0))
        self.last_checkpoint_s = _number(event.get("duration_s")) or self.last_checkpoint_s
        self.checkpoint_steps.add(self.last_checkpoint_step)
        if self.evaluator_down:
            self.saved_while_evaluator_down.add(self.last_checkpoint_step)

    def _ready(self, event: Mapping[str, Any], at: float | None) -> None:
        if event.get(results.EVENT_ROLE) == ROLE_EVALUATOR:
            self.evaluator_down = False

    def _phase_start(self, event: Mapping[str, Any], at: float | None) -> None:
        self._open(str(event.get("protocol")), int(event.get("step", 0)), at)

    def _phase_end(self, event: Mapping[str, Any], at: float | None) -> None:
        self.switch_overhead_s += _number(event.get("switch_s")) or 0.0
        self._close(int(event.get("step", 0)), at, _number(event.get("wall_s")))

    def _protocol_switch(self, event: Mapping[str, Any], at: float | None) -> None:
        self.switch_overhead_s += _number(event.get("switch_s")) or 0.0
        self._open(str(event.get("to")), int(event.get("step", 0)), at)

    def _train_end(self, event: Mapping[str, Any], at: float | None) -> None:
        self.train_time_s = _number(event.get("train_time_s"))
        self._close(self.global_step, at)

    def _straggler_start(self, event: Mapping[str, Any], at: float | None) -> None:
        self.stragglers_detected += 1

    def _straggler_injection_start(self, event: Mapping[str, Any], at: float | None) -> None:
        self.stragglers_injected += 1

    def _revocation(self, event: Mapping[str, Any], at: float | None) -> None:
        self.revocations += 1
        self._server_failure(event, at)

    def _server_failure(self, event: Mapping[str, Any], at: float | None) -> None:
        # a loss (revocation or crash): counted as a restart of its role if recovery starts
        # it again (the recovery_start that follows its loss events)
        self.lost_roles.append(str(event.get(results.EVENT_ROLE)))
        self.evaluator_down = self.evaluator_down or event.get(results.EVENT_ROLE) == ROLE_EVALUATOR

    def _replacement_ready(self, event: Mapping[str, Any], at: float | None) -> None:
        self.replacements += 1

    def _recovery_start(self, event: Mapping[str, Any], at: float | None) -> None:
        self.lost_steps += int(event.get("lost_steps", 0))
        if event.get("action") in (Action.replace.value, Action.restart.value):
            for role in self.lost_roles:  # every role the same way: evaluator, PS, worker…
                self.roles_restarted[role] = self.roles_restarted.get(role, 0) + 1
        self.lost_roles = []
        if event.get("action") == Action.restart.value:
            self.restarts += 1
            resume = event.get("resume_step")
            self.resume_step = None if resume is None else int(resume)

    def _recovery_end(self, event: Mapping[str, Any], at: float | None) -> None:
        self.recoveries += 1

    def _failure(self, event: Mapping[str, Any], at: float | None) -> None:
        error = event.get("error")
        self.error = None if error is None else str(error)

    # --- phases ----------------------------------------------------------------------------
    def all_phases(self) -> list[dict[str, Any]]:
        """Every phase so far, an open one closed where the chief was last seen, consecutive
        phases of one protocol (one phase cut by a resume) joined: :func:`join_phases`."""
        phases = list(self.phases)
        if self.open_phase is not None:
            opened = self.open_phase
            wall = (self.last_at or 0.0) - (opened["t"] or self.last_at or 0.0)
            phases.append({"protocol": opened["protocol"], "start_step": opened["start_step"],
                           "end_step": self.global_step, "wall_s": round(wall, 3)})
        return join_phases(phases)

    def _open(self, protocol: str, step: int, at: float | None) -> None:
        self._close(step, at)
        self.open_phase = {"protocol": protocol, "start_step": step, "t": at}
        self.protocol = protocol

    def _close(self, step: int, at: float | None, wall_s: float | None = None) -> None:
        if self.open_phase is None:
            return
        opened = self.open_phase
        if wall_s is None:
            wall_s = (at or 0.0) - (opened["t"] or at or 0.0)
        self.phases.append({"protocol": opened["protocol"], "start_step": opened["start_step"],
                            "end_step": step, "wall_s": round(wall_s, 3)})
        self.open_phase = None


def join_phases(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phases of every attempt as the run's: one protocol's consecutive phases (a phase a
    resume cut in two) are one, from the first's start to the last's end, their wall times
    added. The one rule by which a resumed run's phases add up over its attempts."""
    out: list[dict[str, Any]] = []
    for phase in phases:
        if out and out[-1]["protocol"] == phase["protocol"]:
            last = out[-1]
            last["end_step"] = max(int(last["end_step"]), int(phase["end_step"]))
            last["wall_s"] = round(float(last["wall_s"]) + float(phase["wall_s"]), 3)
        else:
            out.append(dict(phase))
    return out


_HANDLERS = {
    trainer_events.EVENT_TRAIN_START: RunState._train_start,
    results.EVENT_RESUMED: RunState._resumed,
    trainer_events.EVENT_STEP: RunState._step,
    trainer_events.EVENT_EVAL: RunState._eval,
    trainer_events.EVENT_CHECKPOINT: RunState._checkpoint,
    trainer_events.EVENT_PHASE_START: RunState._phase_start,
    trainer_events.EVENT_PHASE_END: RunState._phase_end,
    trainer_events.EVENT_PROTOCOL_SWITCH: RunState._protocol_switch,
    trainer_events.EVENT_TRAIN_END: RunState._train_end,
    EVENT_STRAGGLER_START: RunState._straggler_start,
    EVENT_STRAGGLER_INJECTION_START: RunState._straggler_injection_start,
    EVENT_REVOCATION: RunState._revocation,
    EVENT_SERVER_FAILURE: RunState._server_failure,
    trainer_events.EVENT_READY: RunState._ready,
    trainer_events.EVENT_EVAL_SKIPPED: RunState._eval_skipped,
    EVENT_REPLACEMENT_READY: RunState._replacement_ready,
    EVENT_RECOVERY_START: RunState._recovery_start,
    EVENT_RECOVERY_END: RunState._recovery_end,
    trainer_events.EVENT_FAILURE: RunState._failure,
}


def fold(events: Iterable[Mapping[str, Any]]) -> RunState:
    """The state the events add up to."""
    state = RunState()
    for event in events:
        state.apply(event)
    return state


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of an ``events.jsonl`` on disk, none when it is missing (a torn last line,
    left by a writer killed mid-line, is skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def fold_events_file(path: Path) -> RunState:
    """The state of a run from its ``events.jsonl`` on disk (:func:`read_events`)."""
    return fold(read_events(path))


@dataclass(frozen=True)
class RunSummary:
    """``summary.json``: one field per documented summary field, in the documented order."""

    schema_version: int
    run_id: str
    status: str
    experiment: str | None
    provider: str | None
    protocol: str | None
    workers: int | None
    parameter_servers: int | None
    global_steps: int
    wall_time_s: float
    train_time_s: float | None
    final_accuracy: float | None
    steps_per_sec: float | None
    cost_usd: float
    error: str | None
    revocations: int
    replacements: int
    recoveries: int
    restarts: int
    lost_steps: int
    phases: list[dict[str, Any]]
    switch_overhead_s: float
    stragglers: int
    stragglers_injected: int
    predicted: dict[str, Any] | None = None
    prediction_error: dict[str, float] | None = None
    sim_seed: int | None = None
    sim_speed_factor: dict[str, float] | None = None
    accuracy_source: str | None = None
    roles_restarted: dict[str, int] = field(default_factory=dict)
    eval_skipped: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(state: RunState, plan: Mapping[str, Any], *, run_id: str, status: str,
              wall_s: float, cost_usd: float, error: str | None, ended_at: float | None = None,
              sim_seed: int | None = None, sim_speed_factor: dict[str, float] | None = None
              ) -> RunSummary:
    """The summary of a run: the fold of its events, its plan (``RunPlan.to_dict()``, or
    plan.json as read back) and what only the player knows: the status, the wall time, the
    cost (the real run prices the plan for ``wall_s``, the simulation bills host by host) and
    the error. ``ended_at`` (the time the run ended, on the events' clock): a run that never
    reported ``train_end`` has trained from its last ``train_start`` until then; None: unknown.

    A resumed run's state holds every attempt's events (:class:`RunState` folds them in
    order), and ``wall_s`` and ``cost_usd`` are the latest attempt's: the earlier attempts'
    time is added here, priced at the plan's ``hourly_usd``, by the one rule for all players.
    """
    train_time = state.train_time_s
    if train_time is None and state.train_start is not None and ended_at is not None:
        train_time = ended_at - state.train_start
    phases = plan.get("phases") or []
    prediction = plan.get("prediction")
    summary = RunSummary(
        schema_version=results.SCHEMA_VERSION,
        run_id=run_id,
        status=status,
        experiment=plan.get("experiment"),
        provider=plan.get("provider"),
        protocol=">".join(str(p.get("protocol", "?")) for p in phases) or None,
        workers=plan.get("workers"),
        parameter_servers=plan.get("parameter_servers"),
        global_steps=state.global_step,
        wall_time_s=round(wall_s + state.earlier_attempts_s, 3),
        train_time_s=None if train_time is None else round(train_time, 3),
        final_accuracy=state.final_accuracy,
        steps_per_sec=state.steps_per_sec(train_time),
        cost_usd=round(cost_usd + catalog.cost_usd([float(plan.get("hourly_usd") or 0.0)],
                                                   state.earlier_attempts_s), 6),
        error=error,
        revocations=state.revocations,
        replacements=state.replacements,
        recoveries=state.recoveries,
        restarts=state.restarts,
        lost_steps=state.run_lost_steps,
        phases=state.all_phases(),
        switch_overhead_s=round(state.switch_overhead_s, 3),
        stragglers=state.stragglers_detected,
        stragglers_injected=state.stragglers_injected,
        predicted=prediction,
        sim_seed=sim_seed,
        sim_speed_factor=sim_speed_factor,
        accuracy_source=state.accuracy_source,
        roles_restarted=dict(sorted(state.roles_restarted.items())),
        eval_skipped=None if sim_seed is not None else eval_skipped(state, plan),
    )
    errors = prediction_error(prediction, {"status": status, "wall_time_s": summary.wall_time_s,
                                           "train_time_s": summary.train_time_s})
    return summary if errors is None else replace(summary, prediction_error=errors)


#: Why a checkpoint was not evaluated when the evaluator did not say (it never saw it).
DELETED_WHILE_DOWN = ("saved while the evaluator was down (lost, being started again) and "
                      "deleted by the chief's rotation (job.keep_checkpoints) before it was back")
NOT_EVALUATED = "not evaluated: the run ended before the evaluator reached it"


def eval_skipped(state: RunState, plan: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The chief's checkpoints no evaluation covered, oldest first, each with its reason
    (the evaluator's ``eval_skipped``, else :data:`DELETED_WHILE_DOWN` for one saved while the
    evaluator was down, else :data:`NOT_EVALUATED`). None when the run has no evaluator (a
    simulated run models only the final evaluation: :func:`summarize` gives it None)."""
    hosts = plan.get("hosts") or []
    if not any(isinstance(h, Mapping) and h.get("role") == ROLE_EVALUATOR for h in hosts):
        return None

    def reason(step: int) -> str:
        if step in state.eval_skip_reasons:
            return state.eval_skip_reasons[step]
        return DELETED_WHILE_DOWN if step in state.saved_while_evaluator_down else NOT_EVALUATED

    return [{"step": step, "reason": reason(step)}
            for step in sorted(state.checkpoint_steps - state.evaluated_steps)]


def killed_summary(run_dir: Path) -> RunSummary:
    """The summary of a run whose orchestrator died before writing one: the fold of the events
    on disk, with plan.json and trainer_spec.json (its run id). Each attempt's wall time runs
    from its first event to its last (the time between attempts held no hosts); nothing was
    billed after the last one that anyone knows of."""
    run_dir = Path(run_dir)
    plan = results.read_json_object(run_dir / results.PLAN_FILE)
    spec = results.read_json_object(run_dir / results.SPEC_FILE)
    state = fold_events_file(run_dir / results.EVENTS_FILE)
    wall = state.latest_attempt_s  # summarize adds the earlier attempts'
    return summarize(
        state, plan, run_id=spec.get("run_id") or run_dir.name, status=results.STATUS_KILLED,
        wall_s=wall, cost_usd=catalog.cost_usd([float(plan.get("hourly_usd") or 0.0)], wall),
        error="the orchestrator was killed before the run ended (no summary was written); "
              "times and steps are the last ones recorded")
