"""Dry-run time of every committed experiment: the command a user waits for before paying."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.runs import ENV, ROOT


def measure_dry_runs() -> dict[str, float]:
    """Wall seconds of `python -m orchestrator +experiment=NAME dry_run=true` per experiment;
    a failing dry run stops the benchmark (it is a broken experiment, not a figure)."""
    times: dict[str, float] = {}
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "orchestrator", f"+experiment={path.stem}",
                               "dry_run=true"], cwd=ROOT, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"dry run of {path.stem} failed:\n{proc.stderr[-2000:]}")
        times[path.stem] = time.time() - t0
    return times


def dry_run_lines(dry: dict[str, float]) -> list[str]:
    lines = ["## Dry run of every committed experiment", "", "| experiment | seconds |",
             "|---|---|"]
    lines += [f"| {name} | {secs:.2f} |" for name, secs in dry.items()]
    return [*lines, f"| **all ({len(dry)})** | **{sum(dry.values()):.2f}** |", ""]
