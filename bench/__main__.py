"""``python -m bench``: measure the local stack and write ``docs/benchmarks.md``.

Everything is measured in this one invocation on this machine, and each figure is reported
next to a baseline taken in the same run where one exists:

* throughput of the local parameter-server cluster (ASP and BSP, 1 and 2 workers) against a
  plain single-process TensorFlow loop of the same model and batch;
* time from the orchestrator command's start to the first training step;
* dry-run time of every committed experiment;
* transient servers: time from a worker kill to throughput back at ≥ 80 % (``replace``), time
  from a parameter-server kill to training resumed from a checkpoint, and the in-place
  BSP→ASP switch overhead, each next to the papers' figures.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before the baseline imports TensorFlow
ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / ".bench"
DOC = ROOT / "docs" / "benchmarks.md"
BENCH_STEPS = 1500  # global steps per throughput run: long enough to amortise start-up
BASELINE_STEPS = 1500
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def run_orchestrator(tag: str, overrides: list[str]) -> tuple[float, Path]:
    """Run one local training; returns (command wall seconds, run dir)."""
    run_dir = OUT_DIR / tag
    if run_dir.exists():
        import shutil

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


def first_step_delay(run_dir: Path) -> float:
    """Seconds from the command's start to the chief's first reported training step."""
    t0 = float((run_dir / "bench_t0.txt").read_text())
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] in ("train_start", "step"):
            return event["time"] - t0
    raise RuntimeError(f"no training step in {run_dir}")


def measure_baseline() -> float:
    from trainer.baseline import measure_single_process
    from trainer.spec import JobSpec

    return measure_single_process(JobSpec(batch_size=64), BASELINE_STEPS)


def measure_dry_runs() -> dict[str, float]:
    times: dict[str, float] = {}
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "orchestrator", f"+experiment={path.stem}",
                               "dry_run=true"], cwd=ROOT, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"dry run of {path.stem} failed:\n{proc.stderr[-2000:]}")
        times[path.stem] = time.time() - t0
    return times


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def recovery_times(run_dir: Path) -> dict[str, float | None]:
    """Worker kill → steps/s back at ≥ 80 % of the rate before it; PS kill → train resumed."""
    events = events_of(run_dir)
    steps = [(e["time"], e["steps_per_sec"]) for e in events
             if e["kind"] == "step" and e.get("steps_per_sec")]
    out: dict[str, float | None] = {"worker_recovery_s": None, "ps_resume_s": None,
                                    "ps_first_step_s": None}
    for rev in (e for e in events if e["kind"] == "revocation"):
        t = rev["time"]
        if rev["role"] == "worker" and out["worker_recovery_s"] is None:
            before = [r for when, r in steps if t - 6 <= when < t]
            if not before:
                continue
            target = 0.8 * sum(before) / len(before)
            back = [when for when, r in steps if when > t + 1 and r >= target]
            out["worker_recovery_s"] = back[0] - t if back else None
        if rev["role"] == "ps":
            resumed = [e["time"] for e in events
                       if e["kind"] == "train_start" and e["time"] > t]
            first = [when for when, _ in steps if resumed and when > resumed[0]]
            out["ps_resume_s"] = resumed[0] - t if resumed else None
            out["ps_first_step_s"] = first[0] - t if first else None
    return out


def measure_transient() -> dict[str, float | None]:
    """One chaos run (worker kill, then PS kill) and one in-place switch run."""
    print("transient run: worker and PS kills ...", flush=True)
    _, run_dir = run_orchestrator("recovery", [
        "cluster.workers=2", "sync=asp", "job.train_steps=4000",
        "job.checkpoint_frequency=500", "job.eval_frequency=0", "cluster.ps_transient=true",
        "revocation=schedule", "revocation.events=[{target: worker-1, at_s: 10.0},"
        " {target: ps-0, at_s: 30.0}]", "cluster.recovery.on_revocation=replace",
        "cluster.recovery.replacement_delay_s=0.0", "report_every_s=0.5"])
    out = recovery_times(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    out["lost_steps"] = summary.get("lost_steps")
    print("switch run: BSP then ASP in place ...", flush=True)
    _, run_dir = run_orchestrator("switch", [
        "cluster.workers=2", "sync=switch", "job.train_steps=600",
        "job.checkpoint_frequency=0", "job.eval_frequency=0"])
    out["switch_overhead_s"] = json.loads((run_dir / "summary.json").read_text()).get(
        "switch_overhead_s")
    return out


def main() -> int:
    OUT_DIR.mkdir(exist_ok=True)
    print("baseline: single-process TensorFlow loop ...", flush=True)
    baseline = measure_baseline()
    rows = []
    delays = []
    for protocol in ("asp", "bsp"):
        for workers in (1, 2):
            tag = f"{protocol}_{workers}w"
            print(f"cluster run {tag} ...", flush=True)
            wall, run_dir = run_orchestrator(tag, [
                f"sync={protocol}", f"cluster.workers={workers}",
                f"job.train_steps={BENCH_STEPS}", "job.eval_frequency=0",
                "job.checkpoint_frequency=0"])
            summary = json.loads((run_dir / "summary.json").read_text())
            delays.append(first_step_delay(run_dir))
            rows.append((protocol, workers, summary["steps_per_sec"], wall,
                         summary["final_accuracy"]))
    print("dry runs ...", flush=True)
    dry = measure_dry_runs()
    transient = measure_transient()
    write_doc(baseline, rows, delays, dry, transient)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def write_doc(baseline: float, rows: list[tuple], delays: list[float],
              dry: dict[str, float], transient: dict[str, float | None]) -> None:
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M')} "
        f"({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}). "
        "Every role of the local cluster shares these cores, so the cluster numbers show the "
        "overhead of the distributed stack, not scaling.",
        "",
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
    lines += [
        "",
        "## Time from the command's start to the first training step",
        "",
        f"Median over the {len(delays)} runs above: **{sorted(delays)[len(delays) // 2]:.1f} s** "
        f"(min {min(delays):.1f} s, max {max(delays):.1f} s). It covers Python and TensorFlow "
        "imports, starting the PS and worker servers, connecting the coordinator and building "
        "the model. The papers measured 55 s cold / 12 s warm for TF process start alone "
        "(CM-DARE, 2019 stack).",
        "",
        "## Dry run of every committed experiment",
        "",
        "| experiment | seconds |",
        "|---|---|",
    ]
    lines += [f"| {name} | {secs:.2f} |" for name, secs in dry.items()]
    lines += [f"| **all ({len(dry)})** | **{sum(dry.values()):.2f}** |", ""]
    switch = transient.get("switch_overhead_s")
    lines += [
        "## Transient servers: recovery and switching",
        "",
        "One local run (2 workers, ASP, checkpoint every 500 steps) whose worker-1 is SIGKILLed "
        "at 10 s and replaced at once (`replace`, no provisioning delay), and whose parameter "
        "server is SIGKILLed at 30 s (restart from the latest checkpoint); one BSP→ASP run.",
        "",
        "| figure | ours (local) | the papers (GCE) |",
        "|---|---|---|",
        f"| worker kill → throughput back at ≥ 80 % | {_secs(transient['worker_recovery_s'])} "
        "| replacement VM ready 66–78 s + TF warm start 12 s (CM-DARE) |",
        f"| PS kill → training resumed from checkpoint | {_secs(transient['ps_resume_s'])} "
        f"(first step at {_secs(transient['ps_first_step_s'])}; "
        f"{transient.get('lost_steps')} steps redone) | chief restart overhead 19–254 s "
        "(CM-DARE); ICAC'19 aborted the run |",
        f"| BSP→ASP switch overhead | {_secs(switch) if switch is None else f'{switch:.3f} s'} "
        "| 135 s median, checkpoint-and-restart (Sync-Switch) |",
        "",
        "The local figures exclude what only a cloud has (VM provisioning); they measure what "
        "the orchestrator and trainer add on top. On 2 shared cores one worker's loss barely "
        "lowers the cluster's throughput (the survivors get its CPU), so the first figure "
        "mostly measures how fast the coordinator reschedules the lost worker's closures.",
        "",
    ]
    DOC.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
