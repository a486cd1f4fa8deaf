"""The hooks into the shared spine: the dry run's band line, the prediction in summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.display import render_plan
from orchestrator.plan import make_plan
from orchestrator.rundir.record import prediction_error
from orchestrator.simulate import calibrate
from orchestrator.simulate.band import predict_band
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.validate import compose


def test_dry_run_shows_a_band_or_says_why_not(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no calibration of this machine yet
    cfg = compose(["+experiment=transient_k80_8", "sim.repeats=5", "dry_run=true"])
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    band = plan.prediction
    assert band is not None and band["runs"] == 5
    assert band["wall_time_s"]["p10"] <= band["wall_time_s"]["p50"] <= band["wall_time_s"]["p90"]
    console = Console(record=True, width=200)
    render_plan(plan, console)
    # transient_k80_8 runs K80s as local CPU processes: the band is the cloud cluster's
    assert "simulated of the GPU cluster in the cloud (p10–p90 of 5 runs" in console.export_text()
    assert band["stand_in"] is True

    cpu = compose(["dry_run=true"])  # digits on CPU workers: no paper measured them
    cpu_plan = make_plan(cpu)
    cpu_plan.prediction = predict_band(cpu, cpu_plan)
    console = Console(record=True, width=200)
    render_plan(cpu_plan, console)
    text = console.export_text()
    assert "simulated: n/a (no speed model" in text and "not calibrated on this machine" in text
    assert not calibrate.cache_file().exists()  # a dry run measures nothing


#: A calibration record as :func:`calibrate.measure` writes it (figures of a loaded 2-core run).
RECORD = {"step_s": 0.02, "steps_timed": 100, "ready_s": 12.0, "checkpoint_s": 0.05,
          "weights": 151306, "load_avg_1m": 4.0, "cpus": 2}


def test_local_cpu_runs_are_predicted_from_this_machines_calibration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same scaling code as for GPUs: two ASP workers are faster than one, BSP slower than
    ASP; the calibrated checkpoint and start-up replace the cloud's; nothing is revoked."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bands = {}
    for workers, sync in ((1, "asp"), (2, "asp"), (2, "bsp")):
        cfg = compose(["+experiment=digits_local", f"cluster.workers={workers}",
                       f"sync={sync}", "dry_run=true", "sim.repeats=2",
                       "sim.speed_error=false"])  # the point model: figures derived below
        calibrate.cache_file().parent.mkdir(parents=True, exist_ok=True)
        calibrate.cache_file().write_text(json.dumps({calibrate.cache_key(cfg): RECORD}))
        bands[workers, sync] = predict_band(cfg, make_plan(cfg))
    one, two, bsp = (bands[k]["train_time_s"]["p50"] for k in ((1, "asp"), (2, "asp"),
                                                                 (2, "bsp")))
    assert two < one < bsp
    # digits_local: 1200 steps at the fitted ASP efficiency, checkpoints at 400, 800 and the end
    eff = SimModels.load().efficiency(None)
    assert one == pytest.approx(1200 * RECORD["step_s"] / eff + 3 * RECORD["checkpoint_s"],
                                rel=1e-3)
    band = bands[1, "asp"]
    assert band["wall_time_s"]["p50"] == pytest.approx(one + RECORD["ready_s"], rel=0.01)
    assert band["revocations"]["p90"] == 0 and band["calibration"]["step_s"] == RECORD["step_s"]
    assert "calibrated on this machine" in band["source"] and "stand_in" not in band
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "simulated calibrated on this machine (p10–p90 of 2 runs" in console.export_text()


def test_prediction_error_is_computed_from_the_band_and_the_measurement() -> None:
    band = {"wall_time_s": {"p50": 60.0}, "train_time_s": {"p50": 30.0}}
    measured = {"status": "completed", "wall_time_s": 50.0, "train_time_s": 40.0}
    assert prediction_error(band, measured) == {"wall_time_s": 0.2, "train_time_s": -0.25}
    assert prediction_error(band, {**measured, "status": "failed"}) is None
    assert prediction_error({**band, "stand_in": True}, measured) is None  # CPUs for GPUs
    assert prediction_error({"unavailable": "why"}, measured) is None


def test_summary_of_a_real_run_carries_the_prediction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.runtime.run import make_summary

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no T4 calibration replaces the model
    cfg = compose(["+experiment=cifar10_res32", "sim.repeats=3"])
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    summary = make_summary(plan, "run-1", "failed", time.time(), None, "stopped")
    assert summary["predicted"] == plan.prediction and summary["predicted"]["runs"] == 3
    # the T4's step time is extrapolated: summary.json says so, with the spread it was drawn with
    estimate = json.loads(json.dumps(summary))["predicted"]["estimate"]
    assert estimate["extrapolated"] == ["t4"]
    assert estimate["speed_error"]["t4"]["basis"] == "extrapolated"
    assert estimate["speed_error"]["t4"]["sigma_log"] > 0


def test_calibrate_command_fetches_the_dataset_as_a_run_does(tmp_path: Path) -> None:
    """`calibrate +experiment=cifar10_res32` first gets the job's data as a run's data step
    does (it trained without it: "job.data_dir is required", as a traceback): offline, that
    step's one line, exit 2, before TensorFlow and with nothing measured."""
    from trainer import datasets

    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.simulate.calibrate", "+experiment=cifar10_res32",
         f"data_cache={tmp_path / 'datasets'}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, datasets.MIRROR_ENV: "http://127.0.0.1:1",  # nothing listens there
             "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("data error: could not download http://127.0.0.1:1/")
    assert done.stdout == ""
    assert not (tmp_path / "transient-orchestrator" / "calibration.json").exists()
