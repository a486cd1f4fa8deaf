"""A run owns its directory; a killed orchestrator's run says so; lost result files come back.

Faults are real: a second process holding the directory, SIGKILL, files removed or truncated
under a live recorder.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.rundir import index, results

REPO = Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
       "PYTHONPATH": str(REPO)}

# A stand-in orchestrator: records a run the way execute_run does (each trainer event, and the
# metrics row the supervisor writes for it), then waits to be killed.
OWNER = """
import sys, time
from orchestrator.rundir import results
rec = results.RunRecorder(sys.argv[1])
rec.write_config({"name": "owned", "job": {"train_steps": 100}})
rec.write_json(results.PLAN_FILE, {"experiment": "owned", "provider": "local", "workers": 2,
               "parameter_servers": 1, "hourly_usd": 3.6, "phases": [{"protocol": "asp"}]})
rec.write_json(results.SPEC_FILE, {"run_id": "owned-1"})
rec.event("train_start", role="chief", step=0)
rec.event("step", role="chief", step=40, steps_per_sec=40.0, loss=0.5)
rec.metric(1.0, 40, 40.0, 0.5)
rec.event("step", role="chief", step=80, steps_per_sec=40.0, loss=0.4)
rec.event("eval", role="evaluator", step=80, accuracy=0.91)
rec.metric(2.0, 80, 40.0, 0.4, 0.91)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def owner(tmp_path: Path):
    """Start a live owner of ``tmp_path/run``; yields (run_dir, process); kills it after."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(run_dir)], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield run_dir, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_second_recorder_refuses_a_live_run_dir(owner) -> None:
    run_dir, proc = owner
    with pytest.raises(ConfigError) as info:
        results.RunRecorder(run_dir)
    line = info.value.line()
    assert line.startswith("config error: hydra.run.dir: ") and "\n" not in line
    assert f"pid {proc.pid} on {socket.gethostname()}" in line
    assert results.run_status(run_dir) == results.STATUS_RUNNING


def test_cli_refuses_a_live_run_dir_with_one_line(owner) -> None:
    run_dir, proc = owner
    done = subprocess.run([sys.executable, "-m", "orchestrator", "+experiment=digits_local",
                           f"hydra.run.dir={run_dir}", "progress=false"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use by a live run" in lines[0], done.stderr
    assert f"pid {proc.pid}" in lines[0]
    assert proc.poll() is None  # the owner was left alone
    assert not (run_dir / results.SUMMARY_FILE).exists()


def test_a_dead_owners_lock_is_no_obstacle(owner) -> None:
    run_dir, proc = owner
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    rec = results.RunRecorder(run_dir)  # the kernel dropped the dead owner's lock
    try:
        assert results.read_lock(run_dir / results.LOCK_FILE)["pid"] == os.getpid()
    finally:
        rec.close()
    assert not results.is_locked(run_dir)


def test_killed_orchestrator_is_marked_by_release(owner) -> None:
    run_dir, proc = owner
    assert index.mark_killed(run_dir) is None  # alive: left alone
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert results.run_status(run_dir) == results.STATUS_KILLED  # the next look says so
    done = subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir.parent)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "status killed" in done.stdout
    summary = json.loads((run_dir / results.SUMMARY_FILE).read_text())
    assert summary["status"] == results.STATUS_KILLED
    assert summary["global_steps"] == 80 and summary["final_accuracy"] == pytest.approx(0.91)
    assert summary["run_id"] == "owned-1" and summary["workers"] == 2
    assert set(results.SUMMARY_FIELDS) <= set(summary)
    rows = list(csv.DictReader((run_dir / index.RUNS_CSV).open()))
    assert len(rows) == 1 and rows[0]["status"] == "killed"
    kinds = [json.loads(ln)["kind"] for ln in (run_dir / results.EVENTS_FILE).open()]
    assert kinds[-1] == "killed"
    # idempotent: a second release adds nothing
    subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir)], cwd=REPO,
                   env=ENV, capture_output=True, timeout=120, check=True)
    assert len(list(csv.DictReader((run_dir / index.RUNS_CSV).open()))) == 1


def test_killed_sweep_job_gets_its_row_in_the_sweeps_csv(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    job = sweep_dir / "1"
    (sweep_dir / "multirun.yaml").parent.mkdir(parents=True)
    (sweep_dir / "multirun.yaml").write_text("hydra: {}\n")
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(job)], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        (job / ".hydra").mkdir()
        (job / ".hydra" / "overrides.yaml").write_text("- cluster.workers=2\n")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    # the next run of the sweep looks beside itself before it starts
    assert index.mark_killed_siblings(sweep_dir / "2") == [job]
    rows = list(csv.DictReader((sweep_dir / index.RUNS_CSV).open()))
    assert rows == [rows[0]] and rows[0]["cluster.workers"] == "2"
    assert rows[0]["status"] == "killed" and rows[0]["run_dir"] == str(job)


def test_default_run_dirs_differ_for_runs_started_together() -> None:
    code = ("from hydra import compose, initialize_config_dir\n"
            "from orchestrator.config.schema import register_configs\n"
            "from orchestrator.paths import CONF_DIR\n"
            "register_configs()\n"
            "with initialize_config_dir(version_base='1.3', config_dir=str(CONF_DIR)):\n"
            "    c = compose('config', return_hydra_config=True)\n"
            "print(c.hydra.run.dir, c.hydra.sweep.dir)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(len(o) == 2 for o in outs), outs
    assert outs[0][0] != outs[1][0] and outs[0][1] != outs[1][1]
    assert all(o[0].endswith(f"-{p.pid}") for o, p in zip(outs, procs, strict=True))


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / results.EVENTS_FILE).read_text().splitlines()]


def test_removed_events_file_is_recreated_and_the_loss_recorded(tmp_path: Path) -> None:
    rec = results.RunRecorder(tmp_path)
    try:
        rec.event("train_start")
        (tmp_path / results.EVENTS_FILE).unlink()
        rec.event("checkpoint", step=10)
    finally:
        rec.close()
    events = _events(tmp_path)
    assert [e["kind"] for e in events] == ["result_file_lost", "checkpoint"]
    assert events[0]["file"] == results.EVENTS_FILE and events[0]["reason"] == "removed"
    assert events[0]["lost_bytes"] > 0


def test_truncated_metrics_file_gets_its_header_back(tmp_path: Path) -> None:
    rec = results.RunRecorder(tmp_path)
    try:
        rec.metric(1.0, 10, 10.0, 0.9)
        os.truncate(tmp_path / results.METRICS_FILE, 0)
        rec.metric(2.0, 20, 10.0, 0.8)
    finally:
        rec.close()
    rows = list(csv.DictReader((tmp_path / results.METRICS_FILE).open()))
    assert [r["global_step"] for r in rows] == ["20"]
    lost = [e for e in _events(tmp_path) if e["kind"] == "result_file_lost"]
    assert lost and lost[0]["file"] == results.METRICS_FILE and lost[0]["reason"] == "truncated"


def test_removed_or_truncated_whole_files_are_rewritten(tmp_path: Path) -> None:
    rec = results.RunRecorder(tmp_path)
    try:
        rec.write_config({"name": "x"})
        rec.write_json(results.PLAN_FILE, {"experiment": "x"})
        (tmp_path / results.CONFIG_FILE).unlink()
        os.truncate(tmp_path / results.PLAN_FILE, 3)
        rec.check_files()
    finally:
        rec.close()
    assert "name: x" in (tmp_path / results.CONFIG_FILE).read_text()
    assert json.loads((tmp_path / results.PLAN_FILE).read_text()) == {"experiment": "x"}
    reasons = {e["file"]: e["reason"] for e in _events(tmp_path)
               if e["kind"] == "result_file_lost"}
    assert reasons == {results.CONFIG_FILE: "removed", results.PLAN_FILE: "truncated"}


def test_recorder_releases_the_directory_on_close(tmp_path: Path) -> None:
    rec = results.RunRecorder(tmp_path)
    assert results.is_locked(tmp_path)  # flock is per open file: a second open sees it
    rec.close()
    assert not results.is_locked(tmp_path)
    results.RunRecorder(tmp_path).close()  # a resume in the same directory may take it again


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_real_run_owns_its_dir_and_a_sigkilled_orchestrator_is_marked_killed(
        tmp_path: Path) -> None:
    """The real CLI on the local backend: a second run into its directory is refused while it
    trains; after ``kill -9`` of the orchestrator, release stops the leftovers and marks it."""
    from tests.orchestrator.proc_utils import live_processes_mentioning

    run_dir = tmp_path / "owned"
    cmd = [sys.executable, "-m", "orchestrator", "+experiment=digits_local",
           "job.train_steps=100000", f"hydra.run.dir={run_dir}", "progress=false"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until training is under way
            events = run_dir / results.EVENTS_FILE
            if events.exists() and '"kind": "step"' in events.read_text():
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        second = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.strip().count("\n") == 0 and "in use by a live run" in second.stderr
        assert proc.poll() is None  # the owner trains on
        proc.kill()  # SIGKILL the orchestrator alone: no clean-up of its own
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert results.run_status(run_dir) == results.STATUS_KILLED
    done = subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "status killed" in done.stdout, done.stdout + done.stderr
    deadline = time.monotonic() + 30
    while live_processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not live_processes_mentioning(str(run_dir))
    summary = json.loads((run_dir / results.SUMMARY_FILE).read_text())
    assert summary["status"] == "killed" and summary["global_steps"] > 0
    rows = list(csv.DictReader((run_dir / index.RUNS_CSV).open()))
    assert len(rows) == 1 and rows[0]["status"] == "killed"
