"""The fake-cloud transfer section of `make bench` on a made-up run's events: which deployment
each VM's setup belongs to, which byte count meets which goal, and which event is a VM's first
training step (a lost worker's trailing report is not its replacement's)."""

from __future__ import annotations

from typing import Any

from bench.cloud_transfer import setups, table


def setup(t: float, role: str, index: int, machine: str, address: str, sent: int,
          total: int) -> dict[str, Any]:
    return {"time": t, "kind": "host_setup", "role": role, "index": index, "machine": machine,
            "address": address, "setup_s": 0.1, "bytes_sent": sent, "bytes_sent_total": total,
            "data": "fetched" if role == "ps" else None}


def made_up_run() -> dict[str, Any]:
    """3 VMs from t=0; worker-1's VM lost at 30 and replaced (RUNNING at 31); the PS's VM lost
    at 50, re-created (RUNNING at 51) with 5 MB of checkpoints, every role restarted."""
    orch = "orchestrator"
    events = [
        {"time": 2.0, "kind": "start", "role": orch},
        setup(2.1, "worker", 0, "w0", "10.0.0.2", 120_000, 124_000),
        setup(2.2, "worker", 1, "w1", "10.0.0.3", 120_000, 124_000),
        setup(2.3, "ps", 0, "p0", "10.0.0.1", 125_000, 137_000),
        {"time": 4.0, "kind": "ready", "role": orch},
        {"time": 14.0, "kind": "step", "role": "chief", "step": 10},
        {"time": 14.0, "kind": "worker_steps", "role": "chief", "worker": 0},
        {"time": 15.0, "kind": "worker_steps", "role": "chief", "worker": 1},
        {"time": 33.0, "kind": "worker_steps", "role": "chief", "worker": 1},  # the lost one's
        setup(34.0, "worker", 1, "w1b", "10.0.0.3", 4_000, 130_000),
        {"time": 40.0, "kind": "worker_steps", "role": "chief", "worker": 1},
        {"time": 53.0, "kind": "start", "role": orch},
        setup(53.1, "worker", 0, "w0", "10.0.0.2", 3_900, 150_000),
        setup(53.2, "worker", 1, "w1b", "10.0.0.3", 3_900, 140_000),
        setup(53.5, "ps", 0, "p1", "10.0.0.1", 125_000, 5_125_000),
        {"time": 55.0, "kind": "ready", "role": orch},
        {"time": 70.0, "kind": "step", "role": "chief", "step": 160},
        {"time": 71.0, "kind": "worker_steps", "role": "chief", "worker": 0},
        {"time": 71.0, "kind": "worker_steps", "role": "chief", "worker": 1},
    ]
    vms = [{"name": "ps-a", "ip": "10.0.0.1", "running": 0.5},
           {"name": "w0", "ip": "10.0.0.2", "running": 0.5},
           {"name": "w1-a", "ip": "10.0.0.3", "running": 0.5},
           {"name": "w1-b", "ip": "10.0.0.3", "running": 31.0},
           {"name": "ps-b", "ip": "10.0.0.1", "running": 51.0}]
    return {"exit": 0, "output_tail": "", "wall_s": 80.0, "boot_s": 2.0,
            "fetches": ["10.0.0.1", "10.0.0.1"], "vms": vms, "events": events}


def test_each_setup_is_placed_in_its_deployment_with_the_bytes_its_goal_reads() -> None:
    rows = {(r["deployment"], r["host"]): r for r in setups(made_up_run())}
    assert list(rows) == [("first", "worker-0"), ("first", "worker-1"), ("first", "ps-0"),
                          ("replacement", "worker-1"), ("restart 1", "worker-0"),
                          ("restart 1", "worker-1"), ("restart 1", "ps-0")]
    # a new VM: everything since it was connected; set up again: that setup's bytes
    assert rows[("replacement", "worker-1")]["bytes"] == 130_000
    assert rows[("restart 1", "worker-0")]["bytes"] == 3_900
    assert not rows[("restart 1", "worker-0")]["new"]
    assert rows[("restart 1", "ps-0")]["before_setup"] == 5_000_000
    # RUNNING → first step: the replacement's own report (40), not the lost worker's (33)
    assert rows[("replacement", "worker-1")]["to_step_s"] == 40.0 - 31.0
    assert rows[("first", "ps-0")]["to_step_s"] == 14.0 - 0.5
    assert rows[("restart 1", "ps-0")]["beyond_boot_s"] == 70.0 - 51.0 - 2.0
    assert rows[("restart 1", "worker-1")]["start_to_step_s"] == 71.0 - 53.0


def test_the_table_marks_each_figure_against_its_goal_over_the_rounds() -> None:
    result = {"date": "d", "wall_s": 160.0, "cores": 2, "load": 3.0, "archive_bytes": 110_000,
              "rounds": [made_up_run(), made_up_run()]}
    lines = table(result)
    rows = [line for line in lines if line.startswith("| restart 1 ")]
    assert rows[0].startswith("| restart 1 | ps-0 | yes | fetched | 5.1 MB | < 1.0 MB MISSED |")
    assert "| 3.9 KB | < 100.0 KB met |" in rows[1]
    assert "5.0 MB before its setup" in "\n".join(lines)
    failed = {**made_up_run(), "exit": 1, "output_tail": "boom"}
    assert table({**result, "rounds": [failed]})[0].startswith("Not measured: a run failed")
