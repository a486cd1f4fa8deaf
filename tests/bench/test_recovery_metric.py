"""The worker-kill figure of `make bench` on a made-up event log: what counts as "back"."""

from __future__ import annotations

import json

from bench.recovery import recovery_times, worker_recovery


def step_events(rate_by_second: list[float], start: float = 0.0) -> list[dict]:
    """One `step` report every 0.5 s, the global step growing at the given rate per second."""
    events, step, t = [], 0.0, start
    for rate in rate_by_second:
        for _ in range(2):
            t += 0.5
            step += rate * 0.5
            events.append({"time": t, "kind": "step", "role": "chief", "step": int(step)})
    return events


def test_back_means_a_sustained_rate_not_one_report() -> None:
    # 50 steps/s for 10 s, killed at 10 s; 30 steps/s for 5 s with a 1 s spike to 45, then
    # 45 (>= 80 % of 50) from 15 s on: the first 2 s window at >= 40 starts at 14.5 s
    events = step_events([50] * 10 + [30, 30, 45, 30, 30] + [45] * 6)
    events += [{"time": 10.0, "kind": "worker_failure", "role": "chief"},
               {"time": 11.0, "kind": "startup", "role": "worker", "total_s": 4.2},
               {"time": 14.5, "kind": "worker_rejoined", "role": "chief"}]
    events.sort(key=lambda e: e["time"])
    out = worker_recovery(events, killed=10.0)
    assert out["worker_recovery_s"] == 4.5  # the spike at 12-13 s is not "back"
    assert out["worker_detect_s"] == 0.0
    assert out["replacement_startup_s"] == 4.2
    assert out["worker_rejoin_s"] == 4.5


def test_never_back_is_none() -> None:
    events = step_events([50] * 10 + [20] * 10)
    assert worker_recovery(events, killed=10.0)["worker_recovery_s"] is None


def test_where_the_worker_kill_time_goes() -> None:
    # 50 steps/s before the kill at 10 s, 25 while worker 1 is away (share 0.5), 50 again
    events = step_events([50] * 10 + [25] * 3 + [50] * 6)
    events += [{"time": 10.0, "kind": "worker_failure", "role": "chief", "worker": 1},
               {"time": 10.3, "kind": "replacement_ready", "role": "worker"},
               {"time": 11.5, "kind": "ready", "role": "worker"},
               {"time": 12.0, "kind": "worker_steps", "role": "chief", "worker": 0},
               {"time": 12.5, "kind": "worker_rejoined", "role": "chief"},
               {"time": 12.6, "kind": "worker_steps", "role": "chief", "worker": 0},
               {"time": 13.5, "kind": "worker_steps", "role": "chief", "worker": 1}]
    events.sort(key=lambda e: e["time"])
    out = worker_recovery(events, killed=10.0)
    assert round(out["replacement_started_s"], 6) == 0.3
    assert out["replacement_ready_s"] == 1.5
    assert out["worker_rejoin_s"] == 2.5
    assert out["replacement_working_s"] == 3.5  # worker 1's report, not worker 0's
    assert out["survivors_share"] is not None and 0.45 <= out["survivors_share"] <= 0.6


def test_a_ps_kill_names_the_new_chiefs_import_and_trace(tmp_path) -> None:
    events = [{"time": 30.0, "kind": "revocation", "role": "ps"},
              {"time": 31.0, "kind": "startup", "role": "ps", "phases": {"import_tf": 1.0}},
              {"time": 37.5, "kind": "train_start", "role": "chief"},
              {"time": 37.6, "kind": "startup", "role": "chief",
               "phases": {"import_tf": 4.5, "trace": 1.4}},
              {"time": 38.0, "kind": "step", "role": "chief", "step": 10, "steps_per_sec": 9.0}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    out = recovery_times(tmp_path)
    assert out["ps_resume_s"] == 7.5 and out["ps_first_step_s"] == 8.0
    assert out["ps_chief_import_s"] == 4.5  # the chief's, not the PS's own import
    assert out["ps_chief_trace_s"] == 1.4
