"""A chief that hangs without dying (SIGSTOP) is found by its silence, killed and restarted
from the newest checkpoint like a chief that died (orchestrator/transient/silence.py); the rule
never fires on the silences a healthy chief has (before train_start, during a restart)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.rundir import results
from orchestrator.rundir.record import summarize
from orchestrator.transient.silence import (
    EVENT_CHIEF_UNRESPONSIVE,
    ChiefWatch,
    chief_silence_s,
    closing_note,
)
from orchestrator.validate import compose_experiment
from provisioning.base import Role
from tests.orchestrator.test_supervisor import FakeRun, restarts_closed

LIMIT_S = 10.0


def test_the_rule_watches_only_a_training_chief_and_never_a_restart():
    watch = ChiefWatch(LIMIT_S)
    watch.heard("chief", "startup", {}, now=0.0)
    assert watch.due(False, 0, now=1000.0) is None  # start-up (TF import, tracing): not watched
    watch.heard("chief", "train_start", {"step": 0}, now=1000.0)
    watch.heard("worker", "ready", {}, now=1009.0)  # another role's events do not count
    assert watch.due(False, 5, now=1009.9) is None
    watch.heard("chief", "step", {"step": 5}, now=1009.9)
    assert watch.due(False, 5, now=1019.0) is None  # the chief's own events do
    event = watch.due(False, 7, now=1020.0)
    assert event is not None and event.kind == EVENT_CHIEF_UNRESPONSIVE
    assert event.fields["step"] == 7 and event.fields["silent_s"] >= LIMIT_S
    assert watch.due(False, 7, now=1021.0) is None  # once per limit, not on every tick
    # a restart under way: its own deadline covers the new chief's start-up
    assert watch.due(True, 7, now=1100.0) is None
    assert watch.due(False, 7, now=1105.0) is None  # a whole limit again after it
    watch.heard("chief", "process_exit", {"exit_code": -9}, now=1105.0)
    assert watch.due(False, 7, now=5000.0) is None  # the exit's recovery takes over
    watch.heard("chief", "train_start", {"step": 0}, now=5000.0)
    watch.heard("chief", "train_end", {"step": 40}, now=5001.0)
    assert watch.due(False, 40, now=9000.0) is None  # after train_end: the evaluator's time


def test_a_silent_chief_names_the_parameter_servers_it_found_frozen():
    watch = ChiefWatch(LIMIT_S)
    watch.heard("chief", "train_start", {}, now=0.0)
    watch.heard("chief", "ps_unresponsive", {"ps": 1, "silent_s": 4.0}, now=1.0)
    watch.heard("chief", "ps_unresponsive", {"ps": 0, "silent_s": 4.0}, now=2.0)
    watch.heard("chief", "ps_responsive", {"ps": 0, "silent_s": 5.0}, now=3.0)
    event = watch.due(False, 0, now=20.0)
    assert event is not None and event.fields["ps_unresponsive"] == [1]


def test_the_default_limit_is_generous_and_a_bad_one_is_refused_before_provisioning():
    assert chief_silence_s(None, 1.0) == 300.0
    assert chief_silence_s(None, 10.0) == 300.0  # 30 missed reports
    assert chief_silence_s(None, 1.0, contact_grace_s=300.0) == 330.0  # ssh's outage grace
    assert chief_silence_s(2.0, 10.0, contact_grace_s=300.0) == 2.0
    with pytest.raises(ConfigError, match=r"cluster\.recovery\.chief_silence_s"):
        compose_experiment("digits_local", ["cluster.recovery.chief_silence_s=0"])


@pytest.fixture
def fake_run(tmp_path: Path) -> Iterator[Callable[..., FakeRun]]:
    made: list[FakeRun] = []

    def make(*overrides: str, knobs: dict[str, Any] | None = None) -> FakeRun:
        made.append(FakeRun(tmp_path, list(overrides), knobs or {}))
        return made[-1]

    yield make
    for run in made:
        run.fleet.release()


@pytest.mark.timeout(120)  # without the watch the run would wait on the chief forever
def test_a_stopped_chief_is_killed_and_restarted_from_its_checkpoint(fake_run):
    run = fake_run("cluster.recovery.chief_silence_s=2", "cluster.recovery.max_restarts=1",
                   knobs={"step_s": 0.1})
    stopped: list[Any] = []

    def stop_chief(run: FakeRun) -> None:
        run.wait_for(lambda es: any(e["kind"] == "checkpoint" and e["role"] == "chief"
                                    for e in es), "the first checkpoint")
        task = run.fleet.deployment.tasks[(Role.CHIEF, 0)]
        stopped.append(task)
        os.kill(task.process.pid, signal.SIGSTOP)  # alive, host up, silent

    try:
        events = run.follow(stop_chief)
    finally:  # whatever happened, the stopped process must not be left behind
        for task in stopped:
            if task.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(task.process.pid, signal.SIGCONT)
                task.process.kill()
    assert run.supervisor.state.error is None, run.supervisor.state.error
    assert stopped and stopped[0].process.poll() == -signal.SIGKILL  # killed, not left stopped
    silent = [e for e in events if e["kind"] == EVENT_CHIEF_UNRESPONSIVE]
    assert len(silent) == 1 and silent[0]["limit_s"] == 2.0, silent
    assert silent[0]["host"] == run.fleet.cluster.hosts_for(Role.CHIEF)[0].spec.name
    assert [e["role"] for e in events if e["kind"] == "server_failure"] == ["chief"]
    resumed = [e["resumed_from"] for e in events
               if e["kind"] == "train_start" and e.get("resumed_from")]
    assert len(resumed) == 1 and resumed[0].startswith("ckpt-")
    assert Counter(e["kind"] for e in events)["recovery_end"] == 1
    restarts_closed(events)
    state = run.supervisor.run_state
    assert state.global_step == 40 and state.final_accuracy == 0.9
    summary = summarize(state, run.plan.to_dict(), run_id="r", status=results.STATUS_COMPLETED,
                        wall_s=1.0, cost_usd=0.0, error=None)
    assert summary.restarts == 1 and summary.roles_restarted == {"chief": 1}
    assert closing_note(run.run_dir).startswith("; the chief was unresponsive (no event for 2 s")
