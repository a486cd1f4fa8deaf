"""Benchmark: a 1,000-configuration simulated sweep, batched in one process vs parallel processes.

``section()`` measures, in this call: the same 1,000-point sweep (``cluster.workers`` × 5 ×
``sim.seed`` × 200 of ``icac19_k80``, each point a full run directory and a ``runs.csv``
row) batched in one process and split over two processes, each repeated ``REPEATS`` times; and,
as the baseline, Hydra's own ``python -m orchestrator -m ... provider=sim`` on a few points,
whose per-run time is scaled to 1,000 runs. Wall and CPU seconds are both reported: CPU
seconds are what the sweep costs when the machine is shared.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioning.checkout import PROJECT_ROOT as ROOT

REPEATS = 3
BASE = ["+experiment=icac19_k80", "provider=sim"]
SWEEP = ["cluster.workers=1,2,4,8,16", "sim.seed=range(0,200)"]  # 1,000 points
HYDRA_POINTS = 4


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _sweep(processes: int) -> tuple[float, float, int]:
    from orchestrator.simulate.sweep import run_sweep

    out = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    try:
        wall0, cpu0 = time.perf_counter(), _cpu()
        runs = run_sweep(BASE, SWEEP, out, processes)
        wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
        rows = len((out / "runs.csv").read_text().splitlines()) - 1
        assert rows == 1000 and len(runs) == 1000, (rows, len(runs))
        return wall, cpu, rows
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _hydra_per_run() -> tuple[float, float]:
    """Seconds (wall, CPU) per run of ``python -m orchestrator -m`` with provider=sim."""
    out = Path(tempfile.mkdtemp(prefix="bench-sim-hydra-"))
    try:
        seeds = ",".join(str(i) for i in range(HYDRA_POINTS))
        argv = [sys.executable, "-m", "orchestrator", *BASE, "-m", f"sim.seed={seeds}",
                f"hydra.sweep.dir={out}"]
        wall0, cpu0 = time.perf_counter(), _cpu()
        subprocess.run(argv, cwd=out, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                       capture_output=True)
        return ((time.perf_counter() - wall0) / HYDRA_POINTS,
                (_cpu() - cpu0) / HYDRA_POINTS)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _stats(values: list[float]) -> str:
    return f"{min(values):.1f} | {statistics.median(values):.1f} | {max(values):.1f}"


def section(repeats: int = REPEATS) -> list[str]:
    """Markdown lines: the measured table (see the module docstring)."""
    from orchestrator.simulate.sweep import base_config

    base_config(("+experiment=icac19_k80", "provider=sim"))  # compose once, outside timing
    results: dict[str, tuple[list[float], list[float]]] = {}
    for label, processes in (("batched, 1 process", 1), ("parallel, 2 processes", 2)):
        walls, cpus = [], []
        for _ in range(repeats):
            wall, cpu, _ = _sweep(processes)
            walls.append(wall)
            cpus.append(cpu)
        results[label] = (walls, cpus)
    hydra_wall, hydra_cpu = _hydra_per_run()
    batched = statistics.median(results["batched, 1 process"][0])
    lines = [
        "## Simulated sweeps (provider=sim)",
        "",
        f"A 1,000-configuration sweep of `icac19_k80` (`{' '.join(SWEEP)}`), every point "
        "simulated and written as a run directory plus a `runs.csv` row, measured "
        f"{repeats}× per mode on {os.cpu_count()} cores; baseline: Hydra's `-m` launcher with "
        f"`provider=sim` on {HYDRA_POINTS} points, scaled to 1,000 runs.",
        "",
        "| mode | wall s min | median | max | CPU s min | median | max | vs Hydra -m (wall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, (walls, cpus) in results.items():
        ratio = hydra_wall * 1000 / statistics.median(walls)
        lines.append(f"| {label} | {_stats(walls)} | {_stats(cpus)} | {ratio:.0f}× faster |")
    lines.append(f"| Hydra `-m` (projected from {HYDRA_POINTS} runs) | {hydra_wall * 1000:.0f} "
                 f"| | | {hydra_cpu * 1000:.0f} | | | 1× |")
    lines += ["", f"Batched median: {batched / 1000 * 1000:.1f} ms per configuration."]
    return lines


if __name__ == "__main__":
    print("\n".join(section()))
