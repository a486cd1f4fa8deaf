"""``python -m bench``: measure the local stack and write ``docs/benchmarks.md``.

Everything is measured in this one invocation on this machine, and each figure is reported
next to a baseline taken in the same run where one exists:

* throughput of the local parameter-server cluster (ASP and BSP, 1 and 2 workers) against a
  plain single-process TensorFlow loop of the same model and batch; ASP with 1 worker (the
  goal figure, >= 0.8x) ASP1_REPEATS times, each run next to its own baseline measurement;
* time from the orchestrator command's start to the first training step (min / median / max
  over the runs), next to the time one process takes to import TensorFlow and Keras as the
  chief does (measured in the same call);
* dry-run time of every committed experiment;
* where the start-up goes: each role's `startup` event (trainer/startup.py), median wall and
  CPU seconds per phase;
* transient servers: time from a worker kill to throughput back at ≥ 80 % (``replace``), time
  from a parameter-server kill to training resumed from a checkpoint (min / median / max over
  RECOVERY_REPEATS runs), and the in-place BSP→ASP switch overhead, each next to the papers'
  figures;
* ``python -m bench --only startup`` (or ``ps_kill``, ``asp1``, ``protocols``) measures just
  that piece and prints its markdown instead of writing the document; ``protocols`` is BSP
  against ASP (1 and 2 workers, PROTOCOL_REPEATS rounds, each round's four runs back to back
  so that each ratio compares runs under the same load) and the in-place switch;
* the sections of the modules in EXTRA_SECTIONS (each `section() -> list[str]`, measuring when
  called), appended in order; a missing module or a failing section leaves a note instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before the baseline imports TensorFlow
ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / ".bench"
DOC = ROOT / "docs" / "benchmarks.md"
BENCH_STEPS = 1500  # global steps per throughput run: long enough to amortise start-up
BASELINE_STEPS = 1500
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
RECOVERY_REPEATS = int(os.environ.get("BENCH_RECOVERY_REPEATS", "3"))  # chaos runs (~1 min each)
PROTOCOL_REPEATS = int(os.environ.get("BENCH_PROTOCOL_REPEATS", "3"))  # rounds of 4 runs + 1
ASP1_REPEATS = int(os.environ.get("BENCH_ASP1_REPEATS", "3"))  # ASP 1-worker runs (~40 s each)
STEADY_FROM = 0.2  # a run's rate after warm-up: from the report at this fraction of its steps
IMPORT_REPEATS = 3
# What the chief imports before its first step (trainer/startup.py): the start-up's floor.
IMPORT_COMMAND = "from trainer.startup import import_tensorflow; import_tensorflow()"
EXTRA_SECTIONS = ("bench.dispatch", "bench.ssh", "bench.hosts", "bench.sim", "bench.gce",
                  "bench.gce_real")


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


def measure_tf_import() -> list[float]:
    """Seconds for a fresh process to import TensorFlow and Keras as the chief does."""
    times = []
    for _ in range(IMPORT_REPEATS):
        t0 = time.time()
        subprocess.run([sys.executable, "-c", IMPORT_COMMAND], cwd=ROOT, check=True,
                       env={**ENV, "PYTHONPATH": str(ROOT)}, capture_output=True)
        times.append(time.time() - t0)
    return times


def throughput_run(tag: str, protocol: str, workers: int) -> tuple[float, Path, dict]:
    """One throughput run of BENCH_STEPS global steps (no checkpoint, no evaluation before
    the end): (command wall seconds, run dir, summary)."""
    wall, run_dir = run_orchestrator(tag, [
        f"sync={protocol}", f"cluster.workers={workers}", f"job.train_steps={BENCH_STEPS}",
        "job.eval_frequency=0", "job.checkpoint_frequency=0"])
    return wall, run_dir, json.loads((run_dir / "summary.json").read_text())


def measure_throughput() -> tuple[list[tuple], list[float], list[Path], list[tuple]]:
    """The throughput runs: (rows, first-step delays, run dirs, ASP-1 pairs). ASP with 1
    worker runs ASP1_REPEATS times, each after its own baseline measurement (pairs of
    (cluster steps/s, baseline steps/s)); the other configurations once."""
    rows, delays, run_dirs, pairs = [], [], [], []
    for protocol in ("asp", "bsp"):
        for workers in (1, 2):
            repeats = ASP1_REPEATS if (protocol, workers) == ("asp", 1) else 1
            for attempt in range(repeats):
                baseline = None
                if (protocol, workers) == ("asp", 1):
                    print(f"baseline {attempt + 1}/{repeats}: single-process loop ...",
                          flush=True)
                    baseline = measure_baseline()
                tag = f"{protocol}_{workers}w" + (f"_{attempt}" if attempt else "")
                print(f"cluster run {tag} ...", flush=True)
                wall, run_dir, summary = throughput_run(tag, protocol, workers)
                delays.append(first_step_delay(run_dir))
                run_dirs.append(run_dir)
                if baseline is not None:
                    pairs.append(asp1_pair(run_dir, baseline))
                if attempt == 0:
                    rows.append((protocol, workers, summary["steps_per_sec"], wall,
                                 summary["final_accuracy"]))
    return rows, delays, run_dirs, pairs


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


RECOVERY_SUSTAIN_S = 2.0  # throughput is "back" when a window this long holds >= 80 %
RECOVERY_BEFORE_S = 6.0  # the rate before a kill: global steps over this long before it


def _rate(points: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Global steps per second between the step reports nearest after `start` and `end`."""
    a = next((p for p in points if p[0] >= start), None)
    b = next((p for p in points if p[0] >= end), None)
    return None if a is None or b is None or b[0] <= a[0] else (b[1] - a[1]) / (b[0] - a[0])


def worker_recovery(events: list[dict], killed: float) -> dict[str, float | None]:
    """What a worker kill at `killed` costs: the coordinator's detection (`worker_failure`),
    the replacement's own start-up (its `startup` event) and rejoin (`worker_rejoined`), and
    the time until throughput is back: the first step report after the kill from which the
    global steps of the next RECOVERY_SUSTAIN_S reach 80 % of the rate of the
    RECOVERY_BEFORE_S before the kill (a sustained rate from the PS global step, not one
    throttled report's)."""
    points = [(e["time"], e["step"]) for e in events if e["kind"] == "step"]
    after = [e for e in events if e["time"] >= killed - 0.5]

    def first(kind: str, role: str = "chief") -> float | None:
        # >= 0: the chief may report the loss before the orchestrator records the kill
        return next((max(0.0, e["time"] - killed) for e in after if e["kind"] == kind
                     and e["role"] == role), None)

    startup = next((e["total_s"] for e in after if e["kind"] == "startup"
                    and e["role"] == "worker"), None)
    before = _rate(points, killed - RECOVERY_BEFORE_S, killed)
    back = None
    if before:
        for when, _ in (p for p in points if p[0] > killed):
            rate = _rate(points, when, when + RECOVERY_SUSTAIN_S)
            if rate is not None and rate >= 0.8 * before:
                back = when - killed
                break
    return {"worker_recovery_s": back, "worker_detect_s": first("worker_failure"),
            "replacement_startup_s": startup, "worker_rejoin_s": first("worker_rejoined")}


def recovery_times(run_dir: Path) -> dict[str, float | None]:
    """Worker kill (`worker_recovery`); PS kill → train resumed, first step after it."""
    events = events_of(run_dir)
    steps = [(e["time"], e["steps_per_sec"]) for e in events
             if e["kind"] == "step" and e.get("steps_per_sec")]
    out: dict[str, float | None] = {"worker_recovery_s": None, "ps_resume_s": None,
                                    "ps_first_step_s": None}
    for rev in (e for e in events if e["kind"] == "revocation"):
        t = rev["time"]
        if rev["role"] == "worker" and out["worker_recovery_s"] is None:
            out.update(worker_recovery(events, t))
        if rev["role"] == "ps":
            resumed = [e["time"] for e in events
                       if e["kind"] == "train_start" and e["time"] > t]
            first = [when for when, _ in steps if resumed and when > resumed[0]]
            out["ps_resume_s"] = resumed[0] - t if resumed else None
            out["ps_first_step_s"] = first[0] - t if first else None
    return out


def measure_transient() -> dict[str, Any]:
    """RECOVERY_REPEATS chaos runs (worker kill, then PS kill) and one in-place switch run;
    each recovery figure is the list over the repeats."""
    out: dict[str, Any] = {key: [] for key in (
        "worker_recovery_s", "worker_detect_s", "replacement_startup_s", "worker_rejoin_s",
        "ps_resume_s", "ps_first_step_s", "lost_steps", "fresh_start_s")}
    for attempt in range(RECOVERY_REPEATS):
        print(f"transient run {attempt + 1}/{RECOVERY_REPEATS}: worker and PS kills ...",
              flush=True)
        _, run_dir = run_orchestrator(f"recovery{attempt}", [
            "cluster.workers=2", "sync=asp", "job.train_steps=4000",
            "job.checkpoint_frequency=500", "job.eval_frequency=0",
            "cluster.ps_transient=true", "revocation=schedule",
            "revocation.events=[{target: worker-1, at_s: 10.0}, {target: ps-0, at_s: 30.0}]",
            "cluster.recovery.on_revocation=replace",
            "cluster.recovery.replacement_delay_s=0.0", "report_every_s=0.5"])
        for key, value in recovery_times(run_dir).items():
            if value is not None:
                out[key].append(value)
        out["fresh_start_s"].append(first_step_delay(run_dir))  # the restart's baseline
        out["lost_steps"].append(json.loads((run_dir / "summary.json").read_text()).get(
            "lost_steps"))
    print("switch run: BSP then ASP in place ...", flush=True)
    _, run_dir = run_orchestrator("switch", [
        "cluster.workers=2", "sync=switch", "job.train_steps=600",
        "job.checkpoint_frequency=0", "job.eval_frequency=0"])
    out["switch_overhead_s"] = json.loads((run_dir / "summary.json").read_text()).get(
        "switch_overhead_s")
    return out


def startup_phases(run_dirs: list[Path], field: str = "phases",
                   ) -> dict[str, dict[str, float]]:
    """Median seconds per start-up phase per role over the runs' `startup` events: wall
    seconds (`phases`, with the `total`) or CPU seconds (`cpu_s`)."""
    seen: dict[str, dict[str, list[float]]] = {}
    for run_dir in run_dirs:
        for event in events_of(run_dir):
            if event["kind"] != "startup" or field not in event:
                continue
            role = seen.setdefault(event["role"], {})
            total = {"total": event["total_s"] if field == "phases" else sum(
                event[field].values())}
            for phase, secs in {**event[field], **total}.items():
                role.setdefault(phase, []).append(secs)
    return {role: {phase: statistics.median(v) for phase, v in phases.items()}
            for role, phases in seen.items()}


def extra_sections() -> list[str]:
    """The sections of EXTRA_SECTIONS' modules; a note for each missing or failing one."""
    lines: list[str] = []
    for name in EXTRA_SECTIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                lines += [f"_Section `{name}` could not be imported: {exc}._", ""]
            else:
                print(f"{name}: not present, skipped", flush=True)
            continue
        print(f"section {name} ...", flush=True)
        try:
            lines += list(module.section())
        except Exception as exc:  # one broken section must not cost the others
            lines += [f"_Section `{name}` failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}_", ""]
    return lines


START_RUN_STEPS = 200  # the short runs of `--only startup`
START_REPEATS = 3


def startup_lines(delays: list[float], run_dirs: list[Path], imports: list[float]) -> list[str]:
    """The start-up section: command -> first step, its baseline, where it goes per role."""
    wall, cpu = startup_phases(run_dirs), startup_phases(run_dirs, "cpu_s")
    lines = [
        "## Time from the command's start to the first training step",
        "",
        f"Over {len(delays)} cluster runs of this benchmark: **{_spread(delays)}** (goal < 10 s). Baseline "
        "measured in the same call: one fresh process importing TensorFlow and Keras as the "
        f"chief does, {_spread(imports)}; the start-up is "
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
        found["switch_s"] = json.loads((run_dir / "summary.json").read_text()).get(
            "switch_overhead_s")
        rounds.append(found)
    return rounds


def protocol_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """BSP against ASP: each ratio taken within a round (the same load), min / median / max."""
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
        f"| **BSP 1 worker / ASP 1 worker, global steps/s** | {spread(one)} | ≥ 0.9 |",
        f"| ASP 2 workers, examples/s | {spread([64 * x for x in rate('asp2')], '{:.0f}')} | |",
        f"| BSP 2 workers, examples/s | {spread([128 * x for x in rate('bsp2')], '{:.0f}')} | |",
        f"| **BSP 2 workers / ASP 2 workers, examples/s** | {spread(two)} | ≥ 0.8 |",
        f"| BSP→ASP switch overhead, s | {spread([r['switch_s'] for r in rounds], '{:.3f}')} "
        "| < 0.2 |",
        *(f"| accuracy, {k[:3].upper()} {k[3]} worker{'s' if k[3] != '1' else ''} | "
          f"{spread(accuracy(k), '{:.3f}')} | ≥ 0.97 |" for k in ("asp1", "bsp1", "asp2",
                                                                  "bsp2")),
        "",
    ]


def steady_rate(run_dir: Path, steps: int = BENCH_STEPS) -> float:
    """Global steps/s of a run after its warm-up: from the first progress report at or after
    STEADY_FROM of `steps` to the last report."""
    points = [(e["time"], e["step"]) for e in events_of(run_dir) if e["kind"] == "step"]
    start = next(p for p in points if p[1] >= STEADY_FROM * steps)
    end = points[-1]
    return (end[1] - start[1]) / (end[0] - start[0])


def asp1_pair(run_dir: Path, baseline: float) -> tuple[float, float, float]:
    """(whole-run steps/s from the summary, steady steps/s, the pair's baseline steps/s)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["steps_per_sec"], steady_rate(run_dir), baseline


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
        f"{len(pairs)} pairs, each a single-process loop measurement then a local cluster run "
        f"(1 PS, 1 worker, chief, evaluator; {BENCH_STEPS} steps, batch 64, digits CNN). "
        "Goal: ≥ 0.8×. Like for like, both sides after their warm-up: the loop's rate leaves "
        f"out its first {WARMUP_STEPS} steps (its trace and first runs), the cluster's is "
        f"taken from its first progress report at or after {STEADY_FROM:.0%} of the steps, "
        "which leaves out the cluster's warm-up (its steps-per-closure choice, the unrolled "
        "closure's trace and its first run on the worker and the PS, together 1-3 s); the "
        "whole run's rate (the run summary's, warm-up included) is shown as well.",
        "",
        "| figure | median (min, max, n) |",
        "|---|---|",
        f"| single-process loop, steps/s (after warm-up) | {spread(bases)} |",
        f"| local ASP, 1 worker, global steps/s after warm-up | {spread(steadies)} |",
        f"| **ratio after warm-up (per pair; the goal figure)** | {spread(ratios, '×')} |",
        f"| local ASP, 1 worker, global steps/s, whole run | {spread(wholes)} |",
        f"| ratio, whole run (per pair) | {spread(whole_ratios, '×')} |",
        "",
    ]


def transient_lines(transient: dict[str, Any]) -> list[str]:
    switch = transient.get("switch_overhead_s")
    fresh = transient.get("fresh_start_s") or []
    resumed = transient["ps_resume_s"]
    ratio = (f"; {statistics.median(resumed) / statistics.median(fresh):.2f}× the same runs' "
             f"fresh start to the first step, {_spread(fresh)}" if resumed and fresh else "")
    return [
        "## Transient servers: recovery and switching",
        "",
        f"{RECOVERY_REPEATS} local runs (2 workers, ASP, checkpoint every 500 steps) whose "
        "worker-1 is SIGKILLed at 10 s and replaced at once (`replace`, no provisioning delay), "
        "and whose parameter server is SIGKILLed at 30 s (restart from the latest checkpoint); "
        "one BSP→ASP run. A PS restart is a start-up, so its baseline is those runs' own "
        "fresh start.",
        "",
        "| figure | ours (local) | the papers (GCE) |",
        "|---|---|---|",
        f"| worker kill → throughput back at ≥ 80 % | {_spread(transient['worker_recovery_s'])} "
        "| replacement VM ready 66–78 s + TF warm start 12 s (CM-DARE) |",
        f"| worker kill → the chief knows (`worker_failure`) | "
        f"{_spread(transient['worker_detect_s'])} | |",
        f"| the replacement worker's own start-up (`startup`, at nice 10) | "
        f"{_spread(transient['replacement_startup_s'])} | |",
        f"| worker kill → the replacement rejoined (`worker_rejoined`) | "
        f"{_spread(transient['worker_rejoin_s'])} | |",
        f"| PS kill → training resumed from checkpoint (goal < 10 s) | {_spread(resumed)}"
        f"{ratio} (first step at {_spread(transient['ps_first_step_s'])}; "
        f"{transient.get('lost_steps')} steps redone) | chief restart overhead 19–254 s "
        "(CM-DARE); ICAC'19 aborted the run |",
        f"| BSP→ASP switch overhead | {_secs(switch) if switch is None else f'{switch:.3f} s'} "
        "| 135 s median, checkpoint-and-restart (Sync-Switch) |",
        "",
        "The local figures exclude what only a cloud has (VM provisioning); they measure what "
        "the orchestrator and trainer add on top. \"Back\" means: from that step report on, "
        f"the global steps of the next {RECOVERY_SUSTAIN_S:.0f} s reach 80 % of the rate of "
        f"the {RECOVERY_BEFORE_S:.0f} s before the kill. The survivors never stop (the "
        "coordinator reruns the lost closure at once); on shared cores what dented their rate "
        "was the replacement's own start-up (seconds of TensorFlow import beside them), so a "
        "server that joins a running job now imports at nice 10 (trainer/server.py).",
        "",
    ]


def only(piece: str) -> list[str]:
    """One piece of the benchmark, measured now: its markdown lines."""
    if piece == "startup":
        delays, run_dirs = [], []
        for attempt in range(START_REPEATS):
            print(f"start-up run {attempt + 1}/{START_REPEATS} ...", flush=True)
            _, run_dir = run_orchestrator(f"startup{attempt}", [
                "sync=asp", "cluster.workers=1", f"job.train_steps={START_RUN_STEPS}",
                "job.eval_frequency=0", "job.checkpoint_frequency=0"])
            delays.append(first_step_delay(run_dir))
            run_dirs.append(run_dir)
        return startup_lines(delays, run_dirs, measure_tf_import())
    if piece == "ps_kill":
        return transient_lines(measure_transient())
    if piece == "asp1":
        pairs = []
        for attempt in range(ASP1_REPEATS):
            base = measure_baseline()
            _, run_dir = run_orchestrator(f"asp1_{attempt}", [
                "sync=asp", "cluster.workers=1", f"job.train_steps={BENCH_STEPS}",
                "job.eval_frequency=0", "job.checkpoint_frequency=0"])
            pairs.append(asp1_pair(run_dir, base))
        return asp1_lines(pairs)
    if piece == "protocols":
        return protocol_lines(measure_protocols())
    raise SystemExit(f"--only: one of {', '.join(PIECES)} (got {piece!r})")


PIECES = ("startup", "ps_kill", "asp1", "protocols")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: nothing (the whole benchmark, ~25 min) or ``--only PIECE``. An unknown
    argument or ``--help`` is answered before anything is measured."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure the local stack on this machine and write docs/benchmarks.md "
                    "(the whole run takes about 25 minutes; make bench runs it).")
    parser.add_argument("--only", choices=PIECES, metavar="PIECE",
                        help="measure just this piece (one of: " + ", ".join(PIECES) + ") and "
                             "print its markdown instead of writing the document")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    OUT_DIR.mkdir(exist_ok=True)
    if args.only is not None:
        print("\n".join(only(args.only)))
        return 0
    print("baseline: single-process TensorFlow loop ...", flush=True)
    baseline = measure_baseline()
    rows, delays, run_dirs, pairs = measure_throughput()
    print("TensorFlow import (start-up baseline) ...", flush=True)
    imports = measure_tf_import()
    print("dry runs ...", flush=True)
    dry = measure_dry_runs()
    transient = measure_transient()
    extra = extra_sections()
    write_doc(baseline, rows, dry, [*asp1_lines(pairs), *startup_lines(delays, run_dirs, imports),
                                    *transient_lines(transient)], extra)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def _spread(values: list[float]) -> str:
    """median (min–max, n) of a figure measured several times; n/a if never."""
    if not values:
        return "n/a"
    return (f"{statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f},"
            f" n={len(values)})")


def write_doc(baseline: float, rows: list[tuple], dry: dict[str, float],
              measured: list[str], extra: list[str]) -> None:
    """docs/benchmarks.md: the throughput table, the `measured` sections (ASP 1 worker,
    start-up, transient servers), the dry runs, then the extra sections."""
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
    lines += ["", *measured,
              "## Dry run of every committed experiment",
              "",
              "| experiment | seconds |",
              "|---|---|"]
    lines += [f"| {name} | {secs:.2f} |" for name, secs in dry.items()]
    lines += [f"| **all ({len(dry)})** | **{sum(dry.values()):.2f}** |", "", *extra]
    DOC.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
