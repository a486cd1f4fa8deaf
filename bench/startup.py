"""Time from the orchestrator command's start to the first training step, and where it goes.

The delay is taken from real local runs (the throughput runs in a whole benchmark, short
ones for `--only startup`), next to a baseline measured in the same call: one fresh process
importing TensorFlow and Keras as the chief does. Where it goes comes from each role's
`startup` event (trainer/startup.py): median wall and CPU seconds per phase.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.runs import ENV, ROOT, events_of, first_step_delay, run_orchestrator, spread
from trainer.events import EVENT_STARTUP

IMPORT_REPEATS = 3
# What the chief imports before its first step (trainer/startup.py): the start-up's floor.
IMPORT_COMMAND = "from trainer.startup import import_tensorflow; import_tensorflow()"
START_RUN_STEPS = 200  # the short runs of `--only startup`
START_REPEATS = 3


def measure_tf_import() -> list[float]:
    """Seconds for a fresh process to import TensorFlow and Keras as the chief does."""
    times = []
    for _ in range(IMPORT_REPEATS):
        t0 = time.time()
        subprocess.run([sys.executable, "-c", IMPORT_COMMAND], cwd=ROOT, check=True,
                       env={**ENV, "PYTHONPATH": str(ROOT)}, capture_output=True)
        times.append(time.time() - t0)
    return times


def measure_startup_runs() -> tuple[list[float], list[Path]]:
    """`--only startup`: START_REPEATS short 1-worker runs; (first-step delays, run dirs)."""
    delays, run_dirs = [], []
    for attempt in range(START_REPEATS):
        print(f"start-up run {attempt + 1}/{START_REPEATS} ...", flush=True)
        _, run_dir = run_orchestrator(f"startup{attempt}", [
            "sync=asp", "cluster.workers=1", f"job.train_steps={START_RUN_STEPS}",
            "job.eval_frequency=0", "job.checkpoint_frequency=0"])
        delays.append(first_step_delay(run_dir))
        run_dirs.append(run_dir)
    return delays, run_dirs


def startup_phases(run_dirs: list[Path], field: str = "phases",
                   ) -> dict[str, dict[str, float]]:
    """Median seconds per start-up phase per role over the runs' `startup` events: wall
    seconds (`phases`, with the `total`) or CPU seconds (`cpu_s`)."""
    seen: dict[str, dict[str, list[float]]] = {}
    for run_dir in run_dirs:
        for event in events_of(run_dir):
            if event["kind"] != EVENT_STARTUP or field not in event:
                continue
            role = seen.setdefault(event["role"], {})
            total = {"total": event["total_s"] if field == "phases" else sum(
                event[field].values())}
            for phase, secs in {**event[field], **total}.items():
                role.setdefault(phase, []).append(secs)
    return {role: {phase: statistics.median(v) for phase, v in phases.items()}
            for role, phases in seen.items()}


def startup_lines(delays: list[float], run_dirs: list[Path], imports: list[float]) -> list[str]:
    """The start-up section: command -> first step, its baseline, where it goes per role."""
    wall, cpu = startup_phases(run_dirs), startup_phases(run_dirs, "cpu_s")
    lines = [
        "## Time from the command's start to the first training step",
        "",
        f"Over {len(delays)} cluster runs of this benchmark: **{spread(delays)}** (goal < 10 s). Baseline "
        "measured in the same call: one fresh process importing TensorFlow and Keras as the "
        f"chief does, {spread(imports)}; the start-up is "
        f"{statistics.median(delays) / statistics.median(imports):.2f}× that. It covers the "
        "orchestrator's own start, Python and TensorFlow imports of every role (sharing the "
        "cores), starting the PS and worker servers, connecting the coordinator, building the "
        "model and the first step. The papers measured 55 s cold / 12 s warm for TF process "
        "start alone (CM-DARE, 2019 stack).",
        "",
        "Where it goes, per role: median wall seconds per phase of the `startup` events "
        "(trainer/startup.py) from the OS starting the process, and in brackets the CPU "
        "seconds the process used in it (on shared cores the wall time also counts the "
        "neighbours). The roles start in parallel; the chief's total ends at its first "
        "applied step.",
        "",
        "| role | total wall s (CPU s) | phases: wall s (CPU s) |",
        "|---|---|---|",
    ]
    for role, phases in sorted(wall.items()):
        cpus = cpu.get(role, {})
        parts = ", ".join(f"{k} {v:.2f} ({cpus.get(k, float('nan')):.2f})"
                          for k, v in phases.items() if k != "total")
        lines.append(f"| {role} | {phases.get('total', 0):.2f} "
                     f"({cpus.get('total', float('nan')):.2f}) | {parts} |")
    return [*lines, ""]
