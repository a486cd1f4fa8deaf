"""The run record: one fold over events, one summary builder, the documented fields."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from orchestrator.plan import make_plan
from orchestrator.rundir import record, results
from orchestrator.rundir.record import RunSummary, fold, fold_events_file, summarize
from orchestrator.simulate.run import execute_sim
from orchestrator.simulate.validate import compose


def test_run_summary_has_exactly_the_documented_fields() -> None:
    names = tuple(f.name for f in dataclasses.fields(RunSummary))
    assert names == results.ALL_SUMMARY_FIELDS
    assert names[:len(results.SUMMARY_FIELDS)] == results.SUMMARY_FIELDS
    assert set(results.TRANSIENT_SUMMARY_FIELDS) <= set(names)


def refold(run_dir: Path) -> dict[str, Any]:
    """summary.json made again from the run's events.jsonl and plan.json, with what only the
    player knows (status, wall time, cost, error, the simulation's draws) taken from it."""
    written = json.loads((run_dir / results.SUMMARY_FILE).read_text())
    plan = json.loads((run_dir / results.PLAN_FILE).read_text())
    if written.get("sim_seed") is not None:
        plan["prediction"] = None  # a simulated run is its own prediction
    return summarize(fold_events_file(run_dir / results.EVENTS_FILE), plan,
                     run_id=written["run_id"], status=written["status"],
                     wall_s=written["wall_time_s"], cost_usd=written["cost_usd"],
                     error=written["error"], sim_seed=written.get("sim_seed"),
                     sim_speed_factor=written.get("sim_speed_factor")).to_dict()


def test_the_fold_of_a_simulated_runs_events_on_disk_is_its_summary(tmp_path: Path) -> None:
    """A transient run whose worker is revoked and replaced: every number of summary.json
    comes back from events.jsonl alone."""
    cfg = compose(["+experiment=transient_k80_8", "provider=sim", "revocation.time_scale=20",
                   "sim.seed=0"])
    summary = execute_sim(cfg, make_plan(cfg), tmp_path, {"name": cfg.name})
    written = json.loads((tmp_path / results.SUMMARY_FILE).read_text())
    assert written == json.loads(json.dumps(summary))
    assert written["revocations"] == written["replacements"] == 1
    assert sorted(written) == sorted(results.ALL_SUMMARY_FIELDS)
    assert refold(tmp_path) == written


def test_the_fold_counts_recovery_as_the_planner_hands_it_out() -> None:
    """A restart whose chief resumed from an older checkpoint than planned loses those steps
    too; the run's numbers are the chief's, whatever a worker reports."""
    events = [
        {"time": 0.0, "kind": "train_start", "role": "chief", "step": 0},
        {"time": 1.0, "kind": "phase_start", "role": "chief", "protocol": "asp", "step": 0},
        {"time": 5.0, "kind": "checkpoint", "role": "chief", "step": 100, "duration_s": 0.5},
        {"time": 6.0, "kind": "step", "role": "worker", "step": 500},
        {"time": 6.0, "kind": "step", "role": "chief", "step": 130, "loss": 0.3},
        {"time": 7.0, "kind": "revocation", "role": "orchestrator", "host": "ps-0"},
        {"time": 7.0, "kind": "recovery_start", "role": "orchestrator", "action": "restart",
         "lost_steps": 30, "resume_step": 100},
        {"time": 9.0, "kind": "replacement_ready", "role": "orchestrator", "host": "ps-0"},
        {"time": 10.0, "kind": "train_start", "role": "chief", "step": 80},  # an older one
        {"time": 10.0, "kind": "recovery_end", "role": "orchestrator", "lost_steps": 50},
        {"time": 12.0, "kind": "straggler_start", "role": "orchestrator", "worker": 1},
        {"time": 13.0, "kind": "protocol_switch", "role": "chief", "from": "asp", "to": "bsp",
         "step": 150, "switch_s": 0.25},
        {"time": 20.0, "kind": "eval", "role": "evaluator", "step": 200, "accuracy": 0.9},
        {"time": 20.0, "kind": "train_end", "role": "chief", "step": 200,
         "train_time_s": 20.0},
    ]
    state = fold(events)
    assert state.global_step == 200 and state.last_checkpoint_step == 80
    assert (state.revocations, state.replacements, state.recoveries, state.restarts,
            state.lost_steps) == (1, 1, 1, 1, 50)
    assert state.stragglers_detected == 1 and state.switch_overhead_s == 0.25
    assert [p["protocol"] for p in state.phases] == ["asp", "bsp"]
    assert state.phases[0]["end_step"] == 150 and state.phases[1]["wall_s"] == 7.0
    plan = {"experiment": "x", "provider": "local", "phases": [{"protocol": "asp"}],
            "workers": 2, "parameter_servers": 1}
    summary = summarize(state, plan, run_id="x-1", status=results.STATUS_COMPLETED,
                        wall_s=30.0, cost_usd=0.01, error=None)
    assert summary.steps_per_sec == 10.0 and summary.final_accuracy == 0.9
    assert summary.protocol == "asp" and summary.predicted is None


def test_a_killed_runs_summary_is_the_fold_of_its_events(tmp_path: Path) -> None:
    (tmp_path / results.PLAN_FILE).write_text(json.dumps(
        {"experiment": "k", "provider": "local", "workers": 1, "parameter_servers": 1,
         "hourly_usd": 3.6, "phases": [{"protocol": "bsp"}]}))
    lines = [{"time": 100.0, "kind": "provision", "role": "orchestrator"},
             {"time": 110.0, "kind": "train_start", "role": "chief", "step": 0},
             {"time": 120.0, "kind": "revocation", "role": "orchestrator", "host": "worker-0"},
             {"time": 130.0, "kind": "step", "role": "chief", "step": 60}]
    (tmp_path / results.EVENTS_FILE).write_text(
        "".join(json.dumps(line) + "\n" for line in lines) + '{"time": 14')  # a torn line
    summary = record.killed_summary(tmp_path)
    assert summary.status == results.STATUS_KILLED and summary.run_id == tmp_path.name
    assert summary.global_steps == 60 and summary.revocations == 1
    assert summary.wall_time_s == 30.0 and summary.cost_usd == 0.03
    assert summary.train_time_s is None  # no train_end, and no one knows when it ended


def test_every_restarted_role_is_counted_and_unevaluated_checkpoints_are_named() -> None:
    """An evaluator that crashed and was started again counts like a PS restarted with the
    cluster; a worker lost to shrink was not started again. Checkpoints no evaluation covered
    are listed with the evaluator's reason, or why nobody could say."""
    def loss(t: float, kind: str, role: str) -> dict[str, Any]:
        return {"time": t, "kind": kind, "role": role, "host": f"{role}-0", "cause": "x"}

    def start(t: float, action: str) -> dict[str, Any]:
        return {"time": t, "kind": "recovery_start", "role": "orchestrator",
                "action": action, "lost_steps": 0}

    events = [
        {"time": 0.0, "kind": "train_start", "role": "chief", "step": 0},
        *[{"time": float(s), "kind": "checkpoint", "role": "chief", "step": s}
          for s in (10, 20, 30, 40, 50, 60)],
        {"time": 11.0, "kind": "eval", "role": "evaluator", "step": 10, "accuracy": 0.5},
        loss(12.0, "server_failure", "evaluator"), start(12.0, "replace"),
        loss(13.0, "revocation", "worker"), start(13.0, "continue"),
        {"time": 25.0, "kind": "ready", "role": "evaluator"},  # back: 20 was saved meanwhile
        {"time": 41.0, "kind": "eval_skipped", "role": "evaluator", "step": 30,
         "reason": "damaged (see checkpoint_skipped)"},
        {"time": 42.0, "kind": "eval", "role": "evaluator", "step": 40, "accuracy": 0.7},
        loss(45.0, "revocation", "ps"), start(45.0, "restart"),
        {"time": 60.0, "kind": "eval", "role": "evaluator", "step": 50, "accuracy": 0.8,
         "final": True},
    ]
    state = fold(sorted(events, key=lambda e: e["time"]))  # as recorded: in time order
    plan = {"experiment": "x", "provider": "local", "phases": [], "workers": 2,
            "parameter_servers": 1, "hosts": [{"role": "ps"}, {"role": "evaluator"}]}
    summary = summarize(state, plan, run_id="x-1", status=results.STATUS_COMPLETED,
                        wall_s=60.0, cost_usd=0.0, error=None)
    assert summary.roles_restarted == {"evaluator": 1, "ps": 1}
    assert summary.eval_skipped == [{"step": 20, "reason": record.DELETED_WHILE_DOWN},
                                    {"step": 30, "reason": "damaged (see checkpoint_skipped)"},
                                    {"step": 60, "reason": record.NOT_EVALUATED}]
    no_evaluator = summarize(state, {**plan, "hosts": [{"role": "ps"}]}, run_id="x-2",
                             status=results.STATUS_COMPLETED, wall_s=60.0, cost_usd=0.0,
                             error=None)
    assert no_evaluator.eval_skipped is None
