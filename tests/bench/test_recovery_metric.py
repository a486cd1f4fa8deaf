"""The worker-kill figure of `make bench` on a made-up event log: what counts as "back"."""

from __future__ import annotations

from bench.recovery import worker_recovery


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
