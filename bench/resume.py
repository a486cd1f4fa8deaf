"""``--resume`` against a cold start: how long from the command to training again.

Issue 26 asks for the time from ``python -m orchestrator --resume DIR`` to training resumed,
against a cold start of the same point. Each pair here is one local digits run (1 PS, 2 workers,
chief and evaluator as processes): started cold, SIGKILLed at its third chief step report
(``TRANSIENT_KILL_AT=train_step:3``, orchestrator/killpoints.py: the orchestrator dies, its
roles with it), then resumed in the same directory. Both are timed from the command's start to
the chief's ``train_start`` event (its first step about to run; for the resume, after restoring
the newest checkpoint), and the resume also to its ``resumed`` event (its own work: the checks,
the journal clean-up, runs.csv, composing the recorded command again). The resume is killed
at its first step report in turn: what comes after is an ordinary run.

``python -m bench --only resume`` prints the section; ``make bench`` writes it into
docs/benchmarks.md (EXTRA_SECTIONS).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time

from bench.runs import ENV, OUT_DIR, ROOT, events_of
from orchestrator.rundir.results import EVENT_RESUMED
from trainer.events import EVENT_TRAIN_START
from trainer.layout import ROLE_CHIEF

PAIRS = int(os.environ.get("BENCH_RESUME_PAIRS", "3"))
OVERRIDES = ["+experiment=digits_local", "job.train_steps=2000", "job.checkpoint_frequency=50",
             "job.eval_frequency=0", "progress=false"]
KILL_COLD, KILL_RESUMED = "train_step:3", "train_step:1"
TIMEOUT_S = 600


def _orchestrate(args: list[str], kill_at: str) -> float:
    """Run the orchestrator until its kill point; returns the command's start (unix s)."""
    env = {**ENV, "PYTHONPATH": str(ROOT), "TRANSIENT_KILL_AT": kill_at}
    env.pop("TRANSIENT_RESUMING", None)
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != -9:
        raise RuntimeError(f"orchestrator {' '.join(args[:2])}: rc {done.returncode}, not "
                           f"killed at {kill_at}:\n{done.stderr[-2000:]}")
    return t0


def _after(events: list[dict], t0: float, kind: str, role: str | None = None) -> float:
    """Seconds from t0 to the first `kind` event at or after it."""
    for event in events:
        if event["kind"] == kind and event["time"] >= t0 and role in (None, event.get("role")):
            return event["time"] - t0
    raise RuntimeError(f"no {kind} event after the command started")


def measure_pair(tag: str) -> dict[str, float]:
    """One cold start killed while training, then its resume: the delays and lost steps."""
    run_dir = OUT_DIR / tag
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cold_t0 = _orchestrate([*OVERRIDES, f"hydra.run.dir={run_dir}"], KILL_COLD)
    time.sleep(1.0)  # the roles' parent-death signal
    resume_t0 = _orchestrate(["--resume", str(run_dir)], KILL_RESUMED)
    events = events_of(run_dir)
    resumed = next(e for e in events if e["kind"] == EVENT_RESUMED)
    return {"cold_s": _after(events, cold_t0, EVENT_TRAIN_START, ROLE_CHIEF),
            "resume_s": _after(events, resume_t0, EVENT_TRAIN_START, ROLE_CHIEF),
            "own_s": _after(events, resume_t0, EVENT_RESUMED),
            "from_step": resumed["from_step"], "lost_steps": resumed["lost_steps"]}


def measure() -> list[dict[str, float]]:
    pairs = []
    for i in range(PAIRS):
        print(f"resume: pair {i + 1}/{PAIRS} ...", flush=True)
        pairs.append(measure_pair(f"resume_{i}"))
    return pairs


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.1f} ({min(values):.1f}, {max(values):.1f})"
            if values else "n/a")


def lines(pairs: list[dict[str, float]]) -> list[str]:
    load = os.getloadavg()[0]
    cold, res, own = ([p[k] for p in pairs] for k in ("cold_s", "resume_s", "own_s"))
    ratio = (f"; the resume takes {statistics.median(res) / statistics.median(cold):.2f}× "
             "the cold start's median" if cold and res else "")
    return [
        f"## Resume after the orchestrator died ({time.strftime('%Y-%m-%d')}, load average "
        f"{load:.1f} on {os.cpu_count()} cores)",
        "",
        "`python -m orchestrator --resume DIR` against a cold start of the same run "
        "(bench/resume.py): `+experiment=digits_local` (1 PS, 2 workers, chief, evaluator as "
        "local processes, a checkpoint every 50 steps), the orchestrator SIGKILLed at its third "
        "chief step report, then resumed. From the command's start to the chief's "
        f"`train_start` event (its first step about to run), {len(pairs)} pairs{ratio}:",
        "",
        "| | cold start | `--resume` | of which the resume's own work (checks, clean-up, "
        "records, Hydra replay) |",
        "|---|---|---|---|",
        f"| median (min, max) s | {_spread(cold)} | {_spread(res)} | {_spread(own)} |",
        "",
        "The resume's own work is the time to its `resumed` event; the rest is a run's usual "
        "start (roles, TensorFlow imports) and restoring the checkpoint. Resumed from steps "
        f"{[int(p['from_step']) for p in pairs]}, recording "
        f"{[int(p['lost_steps']) for p in pairs]} `lost_steps` (the chief's last recorded step "
        "past the checkpoint).",
        "",
    ]


def section() -> list[str]:
    return lines(measure())


if __name__ == "__main__":
    print("\n".join(section()))
