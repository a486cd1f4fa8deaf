"""A real preemptive sweep: ``queue.policy=las`` under ``queue.quota_gpus`` on the local
backend. A long point is preempted when it crosses the first queue boundary (it checkpoints,
releases its processes, waits), a short one runs, and the long one is resumed from its
checkpoint in the same run directory, as ``--resume`` resumes a run. What the launcher did
(``launches.jsonl``) is then replayed through the simulated queue (``queue.schedule``): the
same policy code makes the same decisions from the same service times.

The two points come from a user repository's config group (``+point=long,short``): the long
one declares 8 GPUs (``queue.run_gpus``) and 1,500 steps, the short one 1 GPU and 200 steps,
under a quota of 8 and a first boundary of 0.03 GPU-h (108 GPU-seconds). The long point crosses
it after 13.5 s live, before it could end even on a fast machine; the short one only after
108 s, twice what 200 steps took here at a load average of 17. So exactly one preemption,
whatever the machine's speed (with one GPU each, the short point also drops a queue under load
and the two take turns, each turn paying a TensorFlow start).
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
from typing import Any

import pytest

from orchestrator.rundir import index
from orchestrator.simulate.queue import QueuedRun, schedule
from tests.orchestrator.proc_utils import live_processes_mentioning

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
THRESHOLD_GPU_H = 0.03
STEPS = {0: 1500, 1: 200}
GPUS = {0: 8, 1: 1}
POINTS = {"long": (STEPS[0], GPUS[0]), "short": (STEPS[1], GPUS[1])}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sweep(repo_root: Path, tmp_path: Path, sweep_dir: Path) -> dict[str, Any]:
    """The two-point las sweep, as keyword arguments of ``subprocess.run``/``Popen``: run from a
    user repository that defines the points, in a session of its own (a Ctrl-C sent to its
    process group reaches the launcher and its points, as a terminal's would)."""
    user_repo = tmp_path / "lab"
    (user_repo / "conf" / "point").mkdir(parents=True)
    for name, (steps, gpus) in POINTS.items():
        (user_repo / "conf" / "point" / f"{name}.yaml").write_text(
            f"# @package _global_\njob:\n  train_steps: {steps}\nqueue:\n  run_gpus: {gpus}\n")
    return dict(
        args=[sys.executable, "-m", "orchestrator", "+experiment=digits_local", "-m",
              "+point=long,short", "cluster.workers=1", "cluster.evaluator=false",
              "job.checkpoint_frequency=50", "job.eval_frequency=0", "hydra/launcher=parallel",
              "queue.quota_gpus=8", "queue.policy=las",
              f"queue.las_threshold_gpu_h={THRESHOLD_GPU_H}", f"hydra.sweep.dir={sweep_dir}"],
        cwd=user_repo, env={**ENV, "PYTHONPATH": str(repo_root), "TRANSIENT_REPO": str(user_repo)},
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_las_preempts_a_local_point_and_resumes_it_from_its_checkpoint(
        repo_root: Path, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(**_sweep(repo_root, tmp_path, sweep_dir), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    rec = _jsonl(sweep_dir / index.LAUNCHES_FILE)
    kinds = [(e["kind"], e["num"]) for e in rec]
    assert ("preempted", 0) in kinds and ("resumed", 0) in kinds, kinds
    assert [k for k in kinds if k[0] == "ended"] == [("ended", 1), ("ended", 0)], kinds
    for num in (0, 1):  # every preemption is followed by its stop, then its resume
        mine = [k for k, n in kinds if n == num and k not in ("queued",)]
        assert mine[0] == "started" and mine[-1] == "ended", mine
        assert mine[1:-1] == ["preempted", "stopped", "resumed"] * (len(mine[1:-1]) // 3)
    first = next(e for e in rec if e["kind"] == "preempted")
    assert first["attained_gpu_s"] >= THRESHOLD_GPU_H * 3600  # it crossed the boundary
    assert first["queue"] == 1
    assert [k for k in kinds if k[0] == "preempted"] == [("preempted", 0)], kinds
    # never over the quota of 8: the two never live together (8 + 1 GPUs)
    live = 0
    for e in rec:
        live += {"started": 1, "resumed": 1, "stopped": -1, "ended": -1}.get(e["kind"], 0)
        assert live <= 1
    # every point completed once, with all its steps; one runs.csv row each
    with open(sweep_dir / index.RUNS_CSV) as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["point"] for r in rows) == ["long", "short"]
    assert all(r["status"] == "completed" for r in rows)
    for num, steps in STEPS.items():
        summary = json.loads((sweep_dir / str(num) / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_steps"] == steps
    # the resumed point went on from its checkpoint in the same directory
    events = _jsonl(sweep_dir / "0" / "events.jsonl")
    resumed = [e for e in events if e["kind"] == "resumed"]
    assert len(resumed) == sum(1 for k in kinds if k == ("resumed", 0))
    before = events[:events.index(resumed[0])]
    saved = [e["step"] for e in before if e["kind"] == "checkpoint" and e["role"] == "chief"]
    assert resumed[0]["from_step"] == (saved[-1] if saved else 0)
    if any(e["kind"] == "train_start" for e in before):  # preempted while training: the stop
        assert before[-1]["kind"] == "teardown"  # checkpoint was asked for and written
        assert any(e.get("reason") == "control" for e in before if e["kind"] == "checkpoint")
        assert resumed[0]["lost_steps"] == 0
    starts = [e["step"] for e in events if e["kind"] == "train_start"]
    assert starts[-1] == resumed[-1]["from_step"]
    assert not live_processes_mentioning(str(sweep_dir))
    # the simulated queue, given each point's measured service, makes the same decisions
    service = {n: 0.0 for n in STEPS}
    since: dict[int, float] = {}
    for e in rec:
        if e["kind"] in ("started", "resumed"):
            since[e["num"]] = e["time"]
        elif e["kind"] in ("stopped", "ended"):
            service[e["num"]] += e["time"] - since.pop(e["num"])
    simulated = schedule([QueuedRun(str(n), GPUS[n], service[n], 0.0) for n in STEPS], 8,
                         "las", THRESHOLD_GPU_H)
    real_order = [n for k, n in kinds if k == "ended"]
    assert sorted(STEPS, key=lambda n: simulated.completion_s[str(n)]) == real_order
    assert simulated.preemptions == sum(1 for k, _ in kinds if k == "preempted")


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_ctrl_c_while_a_point_waits_preempted_leaves_it_resumable(
        repo_root: Path, tmp_path: Path) -> None:
    """Ctrl-C after the long point stopped for its preemption (its hosts released, waiting): the
    launcher stops the short point, writes the waiting point's runs.csv row as interrupted and
    ``not_resumed`` in launches.jsonl, exits 130 and leaves no process; ``--resume`` of the
    sweep then sees the long point as resumable from its checkpoint."""
    sweep_dir = tmp_path / "sweep"
    launches = sweep_dir / index.LAUNCHES_FILE
    # the first boundary of the test above: the long point is preempted before it could end on
    # any machine, while starting or while training (both cases are checked below)
    proc = subprocess.Popen(**_sweep(repo_root, tmp_path, sweep_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (launches.exists() and ("stopped", 0) in
                   [(e["kind"], e["num"]) for e in _jsonl(launches)]):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the long point was never preempted"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole process group
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-3000:]
    rec = _jsonl(launches)
    kinds = [(e["kind"], e["num"]) for e in rec]
    assert ("not_resumed", 0) in kinds and ("resumed", 0) not in kinds, kinds
    # the short point, stopped by the Ctrl-C (even before its own handlers were set), was
    # interrupted, not failed
    assert all(e["status"] in ("interrupted", "completed") for e in rec if e["kind"] == "ended")
    assert not live_processes_mentioning(str(sweep_dir))
    runs_csv = sweep_dir / index.RUNS_CSV
    rows = {}
    if runs_csv.exists():
        with open(runs_csv) as fh:
            rows = {r["point"]: r for r in csv.DictReader(fh)}
    events_file = sweep_dir / "0" / "events.jsonl"
    events = _jsonl(events_file) if events_file.exists() else []
    saved = [e["step"] for e in events if e["kind"] == "checkpoint" and e["role"] == "chief"]
    dry = subprocess.run([sys.executable, "-m", "orchestrator", "--resume", str(sweep_dir),
                          "dry_run=true"], cwd=tmp_path / "lab", capture_output=True, text=True,
                         timeout=300, env={**ENV, "PYTHONPATH": str(repo_root),
                                           "TRANSIENT_REPO": str(tmp_path / "lab")})
    assert dry.returncode == 0, dry.stderr[-3000:]
    long_line = next(line for line in dry.stdout.splitlines() if "+point=long" in line)
    summary_file = sweep_dir / "0" / "summary.json"
    if summary_file.exists():  # preempted once its run had begun: interrupted, resumable
        assert json.loads(summary_file.read_text())["status"] == "interrupted"
        assert rows["long"]["status"] == "interrupted", rows
        assert f"resumed from step {saved[-1] if saved else 0}" in long_line, dry.stdout
    else:  # preempted while its process was still starting: nothing of it to keep
        assert "long" not in rows and not saved, rows
        assert "started" in long_line, dry.stdout
