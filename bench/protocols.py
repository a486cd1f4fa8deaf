"""BSP against ASP on the local cluster (``python -m bench --only protocols``).

PROTOCOL_REPEATS rounds; each runs ASP and BSP with 1 and 2 workers back to back, the order
alternating between rounds, so that each ratio compares runs under the same load, and one
in-place BSP→ASP switch run.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.runs import run_orchestrator, summary_of
from bench.throughput import BENCH_STEPS, STEADY_FROM, steady_rate, throughput_run

PROTOCOL_REPEATS = int(os.environ.get("BENCH_PROTOCOL_REPEATS", "3"))  # rounds of 4 runs + 1


def measure_protocols() -> list[dict[str, Any]]:
    """PROTOCOL_REPEATS rounds; each round runs ASP and BSP with 1 and 2 workers back to
    back (the order alternates between rounds) and one BSP→ASP switch run. Per round: the
    steady global steps/s and the accuracy of each configuration, and the switch overhead."""
    rounds = []
    configs = [("asp", 1), ("bsp", 1), ("asp", 2), ("bsp", 2)]
    for attempt in range(PROTOCOL_REPEATS):
        found: dict[str, Any] = {}
        for protocol, workers in configs if attempt % 2 == 0 else configs[::-1]:
            tag = f"proto_{protocol}{workers}_{attempt}"
            print(f"round {attempt + 1}/{PROTOCOL_REPEATS}: {tag} ...", flush=True)
            _, run_dir, summary = throughput_run(tag, protocol, workers)
            found[f"{protocol}{workers}"] = (steady_rate(run_dir), summary["final_accuracy"])
        _, run_dir = run_orchestrator(f"proto_switch_{attempt}", [
            "cluster.workers=2", "sync=switch", "job.train_steps=600",
            "job.checkpoint_frequency=0", "job.eval_frequency=0"])
        found["switch_s"] = summary_of(run_dir).get("switch_overhead_s")
        rounds.append(found)
    return rounds


def protocol_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """BSP against ASP: each ratio taken within a round (the same load), min / median / max
    (the ratios to 3 decimals: 0.795 is not 0.8)."""
    def spread(values: list[float], fmt: str = "{:.2f}") -> str:
        values = [x for x in values if x is not None]
        if not values:
            return "n/a"
        return " / ".join(fmt.format(x) for x in (min(values), statistics.median(values),
                                                  max(values)))

    def rate(key: str) -> list[float]:
        return [r[key][0] for r in rounds]

    def accuracy(key: str) -> list[float]:
        return [r[key][1] for r in rounds]

    one = [r["bsp1"][0] / r["asp1"][0] for r in rounds]
    # examples/s: a BSP global step is one batch per worker, an ASP global step one batch
    two = [2 * r["bsp2"][0] / r["asp2"][0] for r in rounds]
    return [
        "## BSP against ASP",
        "",
        f"{len(rounds)} rounds; each runs ASP and BSP with 1 and 2 workers back to back "
        f"(digits CNN, batch 64, {BENCH_STEPS} global steps, steady rate after "
        f"{STEADY_FROM:.0%} of the steps) and one BSP→ASP switch run of 2 workers; ratios "
        "are taken within a round. min / median / max.",
        "",
        "| figure | min / median / max | goal |",
        "|---|---|---|",
        f"| ASP 1 worker, global steps/s | {spread(rate('asp1'), '{:.1f}')} | |",
        f"| BSP 1 worker, global steps/s | {spread(rate('bsp1'), '{:.1f}')} | |",
        f"| **BSP 1 worker / ASP 1 worker, global steps/s** | {spread(one, '{:.3f}')} | ≥ 0.9 |",
        f"| ASP 2 workers, examples/s | {spread([64 * x for x in rate('asp2')], '{:.0f}')} | |",
        f"| BSP 2 workers, examples/s | {spread([128 * x for x in rate('bsp2')], '{:.0f}')} | |",
        f"| **BSP 2 workers / ASP 2 workers, examples/s** | {spread(two, '{:.3f}')} | ≥ 0.8 |",
        f"| BSP→ASP switch overhead, s | {spread([r['switch_s'] for r in rounds], '{:.3f}')} "
        "| < 0.2 |",
        *(f"| accuracy, {k[:3].upper()} {k[3]} worker{'s' if k[3] != '1' else ''} | "
          f"{spread(accuracy(k), '{:.3f}')} | ≥ 0.97 |" for k in ("asp1", "bsp1", "asp2",
                                                                  "bsp2")),
        "",
    ]
