"""The local Sync-Switch analogue: what BSP, ASP and BSP-then-ASP schedules cost here.

Runs the committed sweep `+experiment=syncswitch_digits -m` (2 local workers, a budget of 600
BSP-equivalent steps; every schedule of its `hydra.sweeper.params`) and reads it back with
the analysis layer (`analysis.syncswitch.own_runs`, as `python -m analysis syncswitch` does),
so the figures are the ones a user gets from those two commands. One run per schedule: the
protocols' own min/median/max ratios are the protocols section's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

from bench.runs import ENV, OUT_DIR, ROOT

SWEEP_DIR = OUT_DIR / "syncswitch"


def measure_syncswitch() -> tuple[list, list[float], float]:
    """Run the sweep; (its runs as `analysis.syncswitch.SwitchRun`s, the switches' overheads
    in s, the command's wall seconds)."""
    from analysis.runs import load_runs
    from analysis.syncswitch import own_runs

    if SWEEP_DIR.exists():
        shutil.rmtree(SWEEP_DIR)
    argv = [sys.executable, "-m", "orchestrator", "+experiment=syncswitch_digits", "-m",
            f"hydra.sweep.dir={SWEEP_DIR}", "progress=false"]
    started = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"syncswitch_digits failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    switches = [r.summary.switch_overhead_s for r in load_runs(SWEEP_DIR)
                if r.summary.switch_overhead_s is not None
                and len({p.protocol for p in r.summary.phases}) > 1]  # the hybrids
    return own_runs(SWEEP_DIR), switches, wall


def syncswitch_lines(runs: list, switches: list[float], wall_s: float) -> list[str]:
    """The schedules' time, accuracy and speed-up against pure BSP, the switches' overhead,
    and the offline policy's verdict on them."""
    from analysis.syncswitch import recommend_next_fraction, summarize

    table = summarize(runs)
    lines = [
        "## The local Sync-Switch analogue",
        "",
        "`python -m orchestrator +experiment=syncswitch_digits -m` (2 local workers, a budget "
        "of 600 BSP-equivalent steps, evaluation every 150 global steps), read back as "
        "`python -m analysis syncswitch <sweep dir>` does; one run per schedule, "
        f"{wall_s:.0f} s for the whole sweep. Time is the sum of the phases' `wall_s` "
        "(switch pauses excluded, as Sync-Switch's `Time`).",
        "",
        "| schedule | time, s | accuracy | speed-up vs BSP |",
        "|---|---|---|---|",
    ]
    for row in table.itertuples():
        lines.append(f"| {row.protocol} | {row.time_s:.1f} | {row.accuracy:.4f} | "
                     f"{row.speedup_vs_bsp:.2f} |")
    lines.append("")
    if switches:
        lines.append(f"Switch overhead, min / median / max: {min(switches):.3f} / "
                     f"{sorted(switches)[len(switches) // 2]:.3f} / {max(switches):.3f} s "
                     f"({len(switches)} switches).")
    if (table["bsp_fraction"] == 1).any():
        decision = recommend_next_fraction(table, tolerance=0.005)
        nxt = ("done" if decision.next_fraction is None
               else f"{100 * decision.next_fraction:g} %")
        lines.append(f"The offline policy (tolerance 0.5 points): best BSP share "
                     f"{100 * decision.best_fraction:g} % (accuracy "
                     f"{decision.best_accuracy:.4f}); next to try: {nxt}.")
    return [*lines, ""]


def section() -> list[str]:
    """The section of `make bench` (bench/__main__.py EXTRA_SECTIONS)."""
    print("the local Sync-Switch analogue (5 runs) ...", flush=True)
    return syncswitch_lines(*measure_syncswitch())
