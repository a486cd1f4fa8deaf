"""Throughput of the local parameter-server cluster against a single-process TensorFlow loop.

ASP and BSP with 1 and 2 workers, each next to a plain loop of the same model and batch
(`trainer/baseline.py`) measured in the same invocation. ASP with 1 worker is the goal
figure (≥ 0.95× the loop, the median of ≥ 5 pairs) and runs ASP1_REPEATS times interleaved
with the loop (loop, run, loop, run, …, loop): each run's ratio is against the mean of the
two loop measurements around it, both sides taken after their warm-up. On a shared 2-core
machine the loop alone moved by ±25 % between two measurements a minute apart (2026-11-28:
90 to 147 steps/s in 3 measurements), so a baseline taken only before a run charged the
load's drift to the run; the bracket cancels a drift that is steady over the pair.
"""

from __future__ import annotations

import itertools
import os
import statistics
from pathlib import Path

from bench.runs import events_of, first_step_delay, run_orchestrator, summary_of
from trainer.events import EVENT_PHASE_END, EVENT_STEP

BENCH_STEPS = 1500  # global steps per throughput run: long enough to amortise start-up
BASELINE_STEPS = 1500
# ASP 1-worker runs: each ~30 s, plus one loop measurement (~15 s) after it and one before
# the first; 5 pairs took 3.4 min on 2 cores (2026-11-29, shared), 3 pairs had taken ~2.3
ASP1_REPEATS = int(os.environ.get("BENCH_ASP1_REPEATS", "5"))
STEADY_FROM = 0.2  # a run's rate after warm-up: from the report at this fraction of its steps
#: A throughput run's overrides beyond protocol and workers: no evaluation or checkpoint
#: stealing the cores from the steps being timed.
QUIET_RUN = [f"job.train_steps={BENCH_STEPS}", "job.eval_frequency=0",
             "job.checkpoint_frequency=0"]


def measure_baseline() -> float:
    """Steps/s of the single-process loop (digits CNN, batch 64), after its warm-up."""
    from trainer.baseline import measure_single_process
    from trainer.spec import JobSpec

    return measure_single_process(JobSpec(batch_size=64), BASELINE_STEPS)


def steady_rate(run_dir: Path, steps: int = BENCH_STEPS) -> float:
    """Global steps/s of a run after its warm-up: from the first progress report at or after
    STEADY_FROM of `steps` to the first report of the last step. A phase's end counts as a
    report: the chief's last `step` report comes after the final checkpoint (0.1-0.2 s,
    2026-11-29), which the loop it is compared with does not pay, and its `phase_end` at
    the last step before it."""
    points = [(e["time"], e["step"]) for e in events_of(run_dir)
              if e["kind"] in (EVENT_STEP, EVENT_PHASE_END)]
    start = next(p for p in points if p[1] >= STEADY_FROM * steps)
    last = max(step for _, step in points)
    end = min(p for p in points if p[1] == last)
    return (end[1] - start[1]) / (end[0] - start[0])


def asp1_pair(run_dir: Path, baseline: float) -> tuple[float, float, float]:
    """(whole-run steps/s from the summary, steady steps/s, the pair's baseline steps/s)."""
    return summary_of(run_dir)["steps_per_sec"], steady_rate(run_dir), baseline


def bracketed(baselines: list[float]) -> list[float]:
    """The baseline of each run measured between `baselines[i]` and `baselines[i + 1]`: the
    mean of the two, so that a load that drifts steadily over the pair cancels out."""
    return [(before + after) / 2 for before, after in itertools.pairwise(baselines)]


def measure_asp1_runs(tag: str, repeats: int = ASP1_REPEATS,
                      ) -> tuple[list[tuple[float, float, float]], list[tuple[float, Path, dict]]]:
    """`repeats` 1-worker ASP runs interleaved with the single-process loop (loop, run, loop,
    …, run, loop): (pairs of `asp1_pair`, each against its bracketing loops' mean; each run's
    (command wall s, run dir, summary)). Run `i` is tagged `tag`, then `tag_i`."""
    baselines, runs = [], []
    for attempt in range(repeats):
        if not baselines:
            print(f"baseline 1/{repeats + 1}: single-process loop ...", flush=True)
            baselines.append(measure_baseline())
        run_tag = tag + (f"_{attempt}" if attempt else "")
        print(f"cluster run {run_tag} ({attempt + 1}/{repeats}) ...", flush=True)
        runs.append(throughput_run(run_tag, "asp", 1))
        print(f"baseline {attempt + 2}/{repeats + 1}: single-process loop ...", flush=True)
        baselines.append(measure_baseline())
    pairs = [asp1_pair(run_dir, base)
             for (_, run_dir, _), base in zip(runs, bracketed(baselines), strict=True)]
    return pairs, runs


def throughput_run(tag: str, protocol: str, workers: int) -> tuple[float, Path, dict]:
    """One throughput run of BENCH_STEPS global steps (no checkpoint, no evaluation before
    the end): (command wall seconds, run dir, summary)."""
    wall, run_dir = run_orchestrator(tag, [
        f"sync={protocol}", f"cluster.workers={workers}", *QUIET_RUN])
    return wall, run_dir, summary_of(run_dir)


def measure_throughput() -> tuple[list[tuple], list[float], list[Path], list[tuple]]:
    """The throughput runs: (rows, first-step delays, run dirs, ASP-1 pairs). ASP with 1
    worker runs ASP1_REPEATS times interleaved with the loop (`measure_asp1_runs`; pairs of
    (whole-run steps/s, steady steps/s, baseline steps/s)); the other configurations once.
    The delays and run dirs feed the start-up section (bench/startup.py)."""
    rows, delays, run_dirs, pairs = [], [], [], []
    for protocol in ("asp", "bsp"):
        for workers in (1, 2):
            tag = f"{protocol}_{workers}w"
            if (protocol, workers) == ("asp", 1):
                pairs, runs = measure_asp1_runs(tag)
            else:
                print(f"cluster run {tag} ...", flush=True)
                runs = [throughput_run(tag, protocol, workers)]
            for _, run_dir, _ in runs:
                delays.append(first_step_delay(run_dir))
                run_dirs.append(run_dir)
            wall, _, summary = runs[0]
            rows.append((protocol, workers, summary["steps_per_sec"], wall,
                         summary["final_accuracy"]))
    return rows, delays, run_dirs, pairs


def measure_asp1() -> list[tuple[float, float, float]]:
    """`--only asp1`: ASP1_REPEATS 1-worker ASP runs interleaved with the loop."""
    return measure_asp1_runs("asp1")[0]


def throughput_lines(baseline: float, rows: list[tuple]) -> list[str]:
    """The throughput table: every configuration's global steps/s against the loop."""
    lines = [
        "## Local trainer throughput vs a single-process TensorFlow loop",
        "",
        f"Baseline (same model `cnn/cnn_small`, digits, batch 64, no distribution): "
        f"**{baseline:.1f} steps/s**.",
        "",
        "| protocol | workers | global steps/s | ratio to baseline | command wall s | accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for protocol, workers, sps, wall, acc in rows:
        acc_text = "n/a" if acc is None else f"{acc:.3f}"
        lines.append(f"| {protocol} | {workers} | {sps:.1f} | {sps / baseline:.2f}× | "
                     f"{wall:.1f} | {acc_text} |")
    return [*lines, ""]


def asp1_lines(pairs: list[tuple[float, float, float]]) -> list[str]:
    """ASP with 1 worker against the single-process loop, each run next to its baseline."""
    from trainer.baseline import WARMUP_STEPS

    wholes, steadies, bases = ([p[i] for p in pairs] for i in range(3))
    ratios = [steady / base for _, steady, base in pairs]
    whole_ratios = [whole / base for whole, _, base in pairs]

    def spread(values: list[float], unit: str = "") -> str:
        return (f"{statistics.median(values):.2f}{unit} (min {min(values):.2f}, max "
                f"{max(values):.2f}, n={len(values)})")

    return [
        "## Local ASP with 1 worker vs the single-process loop",
        "",
        f"{len(pairs)} local cluster runs (1 PS, 1 worker, chief, evaluator; {BENCH_STEPS} "
        "steps, batch 64, digits CNN) interleaved with single-process loop measurements "
        f"(loop, run, loop, …, run, loop: {len(pairs) + 1} loops); each run's ratio is against "
        "the mean of the two loops around it. Goal: ≥ 0.95×, the median of ≥ 5 pairs. Like "
        "for like, both sides after their warm-up: the loop's rate leaves "
        f"out its first {WARMUP_STEPS} steps (its trace and first runs), the cluster's is "
        f"taken from its first progress report at or after {STEADY_FROM:.0%} of the steps "
        "to its last step (before the final checkpoint), which leaves out the cluster's warm-up (its steps-per-closure choice, the unrolled "
        "closure's trace and its first run on the worker and the PS, together 1-3 s); the "
        "whole run's rate (the run summary's, warm-up included) is shown as well.",
        "",
        "| figure | median (min, max, n) |",
        "|---|---|",
        f"| single-process loop, steps/s (after warm-up; mean of each run's two) | "
        f"{spread(bases)} |",
        f"| local ASP, 1 worker, global steps/s after warm-up | {spread(steadies)} |",
        f"| **ratio after warm-up (per pair; the goal figure)** | {spread(ratios, '×')} |",
        f"| local ASP, 1 worker, global steps/s, whole run | {spread(wholes)} |",
        f"| ratio, whole run (per pair) | {spread(whole_ratios, '×')} |",
        "",
    ]
