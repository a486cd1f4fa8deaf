"""A real local run predicts itself: calibration of this machine, prediction, measurement, error.

The CLI runs ``digits_local`` (one CPU worker, a short budget) with an empty calibration cache,
so the run measures this machine first; its ``summary.json`` must carry the predicted band
beside the measurement and the relative error computed from them. Whether the error is small
depends on the machine's load, so it is not asserted (docs/simulation.md tabulates it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]


def test_local_run_summary_carries_prediction_measurement_and_error(
        repo_root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "cluster.workers=1",
         "job.train_steps=100", "job.eval_frequency=0", "job.checkpoint_frequency=0",
         "sim.repeats=2", "progress=false", f"hydra.run.dir={run_dir}"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    band = summary["predicted"]
    cal = band["calibration"]  # measured by this run: the cache was empty
    assert cal["step_s"] > 0 and cal["weights"] > 0 and cal["cpus"] == os.cpu_count()
    cached = json.loads((tmp_path / "cache" / "transient-orchestrator" /
                         "calibration.json").read_text())
    assert list(cached.values()) == [cal]
    for name in ("wall_time_s", "train_time_s"):
        measured, predicted = summary[name], band[name]["p50"]
        assert measured > 0 and predicted > 0
        assert summary["prediction_error"][name] == round((predicted - measured) / measured, 4)
