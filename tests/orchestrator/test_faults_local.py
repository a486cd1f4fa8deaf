"""Faults on the local provider, for real (the CLI, TensorFlow processes): an evaluator
killed, then a parameter server frozen past the heartbeat's deadline.

The evaluator is started again and counted in `roles_restarted`; every checkpoint is evaluated
or listed in `eval_skipped`. The frozen PS is named (`ps_unresponsive`, `ps_responsive` with
how long it was silent) and no worker is blamed for the stall it caused: no `straggler_start`
from the freeze until the detector's `m` reports after it (later, a worker the machine's
load slows for real may be one: the evaluator's restart did exactly that on 2 cores, which is
why it comes first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.orchestrator.proc_utils import live_processes_mentioning
from tests.orchestrator.test_run_local import ENV

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]
HUNG_S = 12.0  # the PS stays frozen this long after the chief named it (past ~5 s naming)
STRAGGLER_M = 3  # conf/straggler/none.yaml detection.m: slow reports before a straggler


def events_of(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def wait_for(run_dir: Path, proc: subprocess.Popen, what: str, check) -> dict:
    deadline = time.time() + 240
    while True:
        found = [e for e in events_of(run_dir) if check(e)]
        if found:
            return found[0]
        assert proc.poll() is None and time.time() < deadline, f"no {what}"
        time.sleep(0.2)


def pid_of(run_dir: Path, role: str) -> int:
    pids = [pid for pid, cmd in live_processes_mentioning(str(run_dir))
            if f"--role {role}" in cmd and "trainer" in cmd]
    assert len(pids) == 1, live_processes_mentioning(str(run_dir))
    return pids[0]


def test_a_frozen_ps_blames_no_worker_and_a_killed_evaluator_is_counted(
        repo_root: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "faults"
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "cluster.workers=2",
         "sync=asp", "job.train_steps=5000", "job.checkpoint_frequency=500",
         "report_every_s=0.5", "progress=false", f"hydra.run.dir={run_dir}"],
        cwd=repo_root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(run_dir, proc, "checkpoint",
                 lambda e: e["kind"] == "checkpoint" and e.get("role") == "chief")
        os.kill(pid_of(run_dir, "evaluator"), signal.SIGKILL)
        lost = wait_for(run_dir, proc, "server_failure",
                        lambda e: e["kind"] == "server_failure")
        wait_for(run_dir, proc, "an evaluation by the evaluator started again",
                 lambda e: e["kind"] == "eval" and e["time"] > lost["time"])
        ps = pid_of(run_dir, "ps")
        os.kill(ps, signal.SIGSTOP)
        try:
            named = wait_for(run_dir, proc, "ps_unresponsive",
                             lambda e: e["kind"] == "ps_unresponsive")
            time.sleep(max(0.0, named["time"] + HUNG_S - time.time()))
        finally:
            os.kill(ps, signal.SIGCONT)
        wait_for(run_dir, proc, "ps_responsive", lambda e: e["kind"] == "ps_responsive")
        _, stderr = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    events = events_of(run_dir)
    assert summary["status"] == "completed", summary["error"]
    back = [e for e in events if e["kind"] == "ps_responsive"]
    assert [e["ps"] for e in back] == [0] and back[0]["silent_s"] >= HUNG_S, back
    reports_after = sorted({e["time"] for e in events if e["kind"] == "worker_steps"
                            and e["time"] > back[0]["time"]})
    until = reports_after[STRAGGLER_M] if len(reports_after) > STRAGGLER_M else float("inf")
    blamed = [e for e in events if e["kind"] == "straggler_start"
              and named["time"] <= e["time"] <= until]
    assert blamed == [], blamed
    assert [e["role"] for e in events if e["kind"] == "server_failure"] == ["evaluator"]
    assert summary["roles_restarted"] == {"evaluator": 1}, summary["roles_restarted"]
    checkpoints = {e["step"] for e in events if e["kind"] == "checkpoint"}
    evaluated = {e["step"] for e in events if e["kind"] == "eval"}
    skipped = {s["step"] for s in summary["eval_skipped"]}
    assert checkpoints == (checkpoints & evaluated) | skipped, (checkpoints, evaluated, skipped)
    assert summary["final_accuracy"] >= 0.9
    assert not live_processes_mentioning(str(run_dir))
