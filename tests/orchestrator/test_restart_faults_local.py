"""A failure while a restart is in progress, for real: TensorFlow roles on the local backend,
the orchestrator's CLI, and faults injected from outside with SIGKILL (issue 12, "Recovery")."""

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
from tests.orchestrator.test_run_local import ENV, read_events

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]
RUN_TIMEOUT_S = 480.0


def chief_pids(run_dir: Path) -> set[int]:
    return {pid for pid, cmd in live_processes_mentioning(str(run_dir))
            if "--role chief" in cmd}


def test_the_restarted_chief_killed_before_training_resumed_is_another_attempt(
        repo_root: Path, tmp_path: Path) -> None:
    """PS revoked at step 300 → restart; the restarted chief is SIGKILLed before its
    train_start → recovery_attempt_failed, attempt 2, the run completes; nothing left."""
    run_dir = tmp_path / "run"
    output = tmp_path / "output.txt"  # a file, not a pipe: nobody reads while the run goes on
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "sync=asp",
         "job.train_steps=600", "job.checkpoint_frequency=200", "job.eval_frequency=0",
         "cluster.ps_transient=true", "revocation=schedule",
         "revocation.events=[{target: ps-0, at_step: 300}]",
         "cluster.recovery.max_restarts=3", "cluster.recovery.replacement_delay_s=0.5",
         "progress=false", f"hydra.run.dir={run_dir}"],
        cwd=repo_root, env=ENV, stdout=output.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        first: set[int] = set()
        killed = None
        while killed is None and proc.poll() is None:
            assert time.monotonic() < deadline, "no restart happened"
            events = read_events(run_dir) if (run_dir / "events.jsonl").exists() else []
            kinds = [e["kind"] for e in events]
            if "train_start" in kinds and not first:
                first = chief_pids(run_dir)
            if kinds.count("start") >= 2 and kinds.count("train_start") < 2:
                fresh = chief_pids(run_dir) - first
                if fresh:  # the restarted chief runs and has not resumed training yet
                    killed = fresh.pop()
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed is not None, "the restarted chief was never seen"
    assert proc.returncode == 0, output.read_text()[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    events = read_events(run_dir)
    failed = [e for e in events if e["kind"] == "recovery_attempt_failed"]
    assert len(failed) == 1 and failed[0]["attempt"] == 1, failed
    assert [e["attempt"] for e in events if e["kind"] == "recovery_start"
            and e.get("action") == "restart"] == [1, 2]
    assert [e["kind"] for e in events].count("recovery_end") == 1
    assert summary["restarts"] == 2 and summary["final_accuracy"] >= 0.9
    assert not live_processes_mentioning(str(run_dir))
