"""Local orchestrator runs for the benchmark's own sections: start one, read what it wrote.

Every local section (throughput, start-up, recovery) measures real `python -m orchestrator`
runs of the digits experiment on this machine; their run directories go under `.bench/`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before the baseline imports TensorFlow
from provisioning.checkout import PROJECT_ROOT as ROOT
from trainer.events import EVENT_STEP, EVENT_TRAIN_START

OUT_DIR = ROOT / ".bench"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def run_orchestrator(tag: str, overrides: list[str]) -> tuple[float, Path]:
    """Run one local training; returns (command wall seconds, run dir)."""
    run_dir = OUT_DIR / tag
    if run_dir.exists():
        shutil.rmtree(run_dir)
    argv = [sys.executable, "-m", "orchestrator", "+experiment=digits_local",
            f"hydra.run.dir={run_dir}", "progress=false", *overrides]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{tag} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    (run_dir / "bench_t0.txt").write_text(f"{t0}\n")
    return wall, run_dir


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def first_step_delay(run_dir: Path) -> float:
    """Seconds from the command's start to the chief's first reported training step."""
    t0 = float((run_dir / "bench_t0.txt").read_text())
    for event in events_of(run_dir):
        if event["kind"] in (EVENT_TRAIN_START, EVENT_STEP):
            return event["time"] - t0
    raise RuntimeError(f"no training step in {run_dir}")


def secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def spread(values: list[float]) -> str:
    """median (min–max, n) of a figure measured several times; n/a if never."""
    if not values:
        return "n/a"
    return (f"{statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f},"
            f" n={len(values)})")
