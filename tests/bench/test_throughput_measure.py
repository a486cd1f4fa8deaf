"""How `make bench` measures the cluster against the single-process loop, on made-up runs:
the steady window ends at the last step, not at the report after the final checkpoint, and
each interleaved run is compared with the mean of the two loops measured around it."""

from __future__ import annotations

import json
from pathlib import Path

from bench.throughput import bracketed, steady_rate
from trainer.events import EVENT_CHECKPOINT, EVENT_PHASE_END, EVENT_STEP, EVENT_TRAIN_END


def write_events(run_dir: Path, records: list[dict]) -> None:
    lines = [json.dumps({"role": "chief", "index": 0, **r}) for r in records]
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")


def test_the_steady_window_ends_at_the_last_step_not_after_the_final_checkpoint(
        tmp_path: Path) -> None:
    write_events(tmp_path, [
        {"kind": EVENT_STEP, "time": 100.0, "step": 100},
        {"kind": EVENT_STEP, "time": 101.0, "step": 300},  # the first at >= 20 % of 1000
        {"kind": EVENT_STEP, "time": 105.0, "step": 900},
        {"kind": EVENT_PHASE_END, "time": 106.0, "step": 1000},
        {"kind": EVENT_CHECKPOINT, "time": 107.0, "step": 1000},  # the final save: 1 s
        {"kind": EVENT_STEP, "time": 107.0, "step": 1000},
        {"kind": EVENT_TRAIN_END, "time": 107.0, "step": 1000},
    ])
    assert steady_rate(tmp_path, steps=1000) == 700 / 5.0  # not 700 / 6


def test_a_run_that_reported_its_last_step_before_the_phase_end_ends_there(
        tmp_path: Path) -> None:
    write_events(tmp_path, [
        {"kind": EVENT_STEP, "time": 101.0, "step": 300},
        {"kind": EVENT_STEP, "time": 104.0, "step": 1000},
        {"kind": EVENT_PHASE_END, "time": 104.5, "step": 1000},
        {"kind": EVENT_STEP, "time": 105.0, "step": 1000},
    ])
    assert steady_rate(tmp_path, steps=1000) == 700 / 3.0


def test_each_run_is_compared_with_the_mean_of_the_loops_around_it() -> None:
    # loop, run, loop, run, loop: a load that drifts over a pair cancels out
    assert bracketed([100.0, 140.0, 90.0]) == [120.0, 115.0]
    assert bracketed([100.0]) == []
