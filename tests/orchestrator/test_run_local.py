"""End-to-end: the real CLI trains on the local provider and leaves nothing behind.

Each test runs ``python -m orchestrator`` as a subprocess, exactly as a user would, with real
TensorFlow processes for the PS, workers, chief and evaluator.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.orchestrator.proc_utils import live_processes_mentioning
from tests.orchestrator.test_record import refold

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
SMALL = ["job.train_steps=400", "job.eval_frequency=0", "job.checkpoint_frequency=200"]
RUN_TIMEOUT_S = 300


def orchestrate(repo_root: Path, *args: str, timeout: float = RUN_TIMEOUT_S
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=repo_root, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def check_run_dir(run_dir: Path) -> dict:
    """Every result file is there and consistent; returns the summary."""
    for name in ("config.yaml", "plan.json", "events.jsonl", "metrics.csv", "summary.json"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["error"] is None, summary["error"]
    assert summary["workers"] == 2 and summary["parameter_servers"] == 1
    planned_end = json.loads((run_dir / "plan.json").read_text())["phases"][-1]["end_step"]
    assert summary["global_steps"] >= planned_end
    assert summary["final_accuracy"] >= 0.9
    assert summary["cost_usd"] > 0 and summary["steps_per_sec"] > 0
    kinds = [e["kind"] for e in read_events(run_dir)]
    for kind in ("provision", "start", "ready", "train_start", "phase_start", "checkpoint",
                 "eval", "phase_end", "train_end", "teardown"):
        assert kind in kinds, kind
    with open(run_dir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["wall_time_s", "global_step", "steps_per_sec", "loss",
                             "eval_accuracy"]
    assert any(r["eval_accuracy"] for r in rows)
    # the one record: the fold of the events on disk gives back every number of the summary
    assert refold(run_dir) == summary
    return summary


def test_three_point_sweep_asp_bsp_and_switch(repo_root: Path, tmp_path: Path) -> None:
    """One sweep, three protocols: ASP, BSP, and BSP switched in place to ASP."""
    sweep_dir = tmp_path / "sweep"
    proc = orchestrate(repo_root, "+experiment=digits_local", "-m", "sync=asp,bsp,switch",
                       "cluster.workers=2", *SMALL, f"hydra.sweep.dir={sweep_dir}",
                       timeout=3 * RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep_dir / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["sync"] for r in rows) == ["asp", "bsp", "switch"]
    summaries = {}
    for row in rows:
        assert Path(row["run_dir"]).parent == sweep_dir
        assert row["status"] == "completed" and float(row["final_accuracy"]) >= 0.9
        summaries[row["sync"]] = check_run_dir(Path(row["run_dir"]))
    assert summaries["bsp"]["protocol"] == "bsp" and summaries["asp"]["protocol"] == "asp"
    switch = summaries["switch"]
    assert switch["protocol"] == "bsp>asp"
    assert [p["protocol"] for p in switch["phases"]] == ["bsp", "asp"]
    assert switch["phases"][0]["end_step"] == switch["phases"][1]["start_step"] == 100
    assert 0 < switch["switch_overhead_s"] < 1.0  # in place; Sync-Switch's restart took 135 s
    assert not live_processes_mentioning(str(sweep_dir))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_leaves_no_process_behind(repo_root: Path, tmp_path: Path, sig: int) -> None:
    run_dir = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local",
         "job.train_steps=100000", f"hydra.run.dir={run_dir}"],
        cwd=repo_root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        # Ctrl-C as in a terminal, also when the tests run in a background job of a
        # non-interactive shell (which ignores SIGINT, and children inherit that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        events = run_dir / "events.jsonl"
        while time.monotonic() < deadline:  # interrupt while training is under way
            if events.exists() and '"kind": "step"' in events.read_text():
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        assert live_processes_mentioning(str(run_dir)), "the run should have started roles"
        proc.send_signal(sig)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # a hang: fail with every thread's stack
            proc.send_signal(signal.SIGUSR1)  # faulthandler in orchestrator/__main__.py
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGKILL)
            stacks = proc.communicate()[1]
            tail = (run_dir / "events.jsonl").read_text().splitlines()[-5:]
            pytest.fail(f"no exit 60 s after signal {sig}; last events {tail}; stacks:\n"
                        f"{stacks[-6000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert read_events(run_dir)[-1]["kind"] == "teardown"
    assert not live_processes_mentioning(str(run_dir))
