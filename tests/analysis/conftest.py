"""Fixture run and sweep directories in the results layout of issue 2 (+ issue 4 fields)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

# (job, workers, protocol, phases, wall_s, cost_usd, accuracy, transient)
_RUNS = (
    ("0", 1, "bsp", None, 400.0, 0.08, 0.95, False),
    ("1", 2, "bsp", None, 220.0, 0.09, 0.94, False),
    ("2", 2, "asp", None, 150.0, 0.04, 0.90, True),
    ("3", 2, "bsp", [("bsp", 0, 100, 30.0), ("asp", 100, 1900, 110.0)], 160.0, 0.05, 0.935, True),
)


def write_run(path: Path, job: str, workers: int, protocol: str, phases, wall_s: float,
              cost_usd: float, accuracy: float, status: str = "completed") -> Path:
    """One run directory with every file the loader reads."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"cluster:\n  workers: {workers}\nsync:\n  protocol: {protocol}\n")
    (path / "plan.json").write_text(json.dumps({"roles": ["ps", "worker"]}))
    events = [{"time": 0.0, "kind": "start", "role": "orchestrator"},
              {"time": wall_s, "kind": "teardown", "role": "orchestrator"}]
    (path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + '\n{"time": 1')
    steps = [*range(0, 1001, 250), 500]  # step 500 logged twice (at-least-once steps)
    metrics = pd.DataFrame({
        "wall_time_s": [s / 1000 * wall_s for s in steps], "global_step": steps,
        "steps_per_sec": 1000 / wall_s, "loss": [2.0 - s / 1000 for s in steps],
        "eval_accuracy": [0.1 + (accuracy - 0.1) * s / 1000 for s in steps],
    })
    metrics.to_csv(path / "metrics.csv", index=False)
    summary = {
        "schema_version": "1.1", "run_id": f"run{job}", "status": status, "experiment": "digits_local",
        "provider": "local", "protocol": protocol, "workers": workers, "parameter_servers": 1,
        "global_steps": 1000, "wall_time_s": wall_s, "train_time_s": wall_s - 10,
        "final_accuracy": accuracy, "steps_per_sec": 1000 / wall_s, "cost_usd": cost_usd,
        "error": None, "future_field": 7,
    }
    if phases:
        summary["phases"] = [{"protocol": p, "start_step": a, "end_step": b, "wall_s": w}
                             for p, a, b, w in phases]
        summary["switch_overhead_s"] = 12.0
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """A Hydra-style multirun folder: runs.csv plus one sub-directory per run."""
    root = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    rows = []
    for job, workers, protocol, phases, wall, cost, acc, transient in _RUNS:
        write_run(root / job, job, workers, protocol, phases, wall, cost, acc)
        rows.append({"cluster.workers": workers, "sync.protocol": protocol,
                     "cluster.transient": transient, "run_id": f"run{job}", "status": "completed",
                     "workers": workers, "wall_time_s": wall, "final_accuracy": acc,
                     "cost_usd": cost, "steps_per_sec": 1000 / wall})
    pd.DataFrame(rows).to_csv(root / "runs.csv", index=False)
    return root


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "single", "9", 2, "asp", None, 100.0, 0.02, 0.9)
