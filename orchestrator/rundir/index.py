"""A sweep's index: ``runs.csv`` (one row per finished point), marking a run whose orchestrator
was killed, and a resume's repair of ``runs.csv`` and ``launches.jsonl``.

A row is written by whoever finishes a point (the entry point, the concurrent launcher, the
simulator's batched sweep, :func:`mark_killed` for a dead one); a resume
(:mod:`orchestrator.resume`) asks :func:`reconcile_runs_csv` and :func:`repair_launches` to make
the index match the points it keeps.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import killpoints
from orchestrator.rundir import record, results

RUNS_CSV = "runs.csv"
#: The concurrent launcher's record of when each point was queued, started and ended.
LAUNCHES_FILE = "launches.jsonl"


def override_columns(overrides: Sequence[str]) -> dict[str, str]:
    """``key=value`` task overrides as columns (``+`` / ``~`` prefixes dropped)."""
    cols: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        cols[key.lstrip("+~")] = value
    return cols


def append_run_row(csv_path: Path, overrides: Sequence[str], run_dir: Path,
                   summary: Mapping[str, Any]) -> None:
    """Append one run's row under a file lock (parallel launchers may finish together).

    Columns: the overrides that define the run, ``run_dir``, then the summary fields. The header
    is written once; a row with new columns is still written, matched by name.
    """
    row: dict[str, Any] = {**override_columns(overrides), "run_dir": str(run_dir)}
    for key in (*results.SUMMARY_FIELDS, *results.TRANSIENT_SUMMARY_FIELDS):
        if key == "phases":
            continue  # a list: summary.json holds it
        value = summary.get(key)
        row[key] = "" if value is None else value
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "a+", newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        existing = fh.read()
        header = next(csv.reader([existing.splitlines()[0]])) if existing.strip() else None
        fieldnames = header or list(row)
        extra = [k for k in row if k not in fieldnames]
        writer = csv.DictWriter(fh, fieldnames=fieldnames + extra, extrasaction="ignore")
        if header is None:
            writer.writeheader()
        killpoints.hit("runs_csv_row", torn=lambda: _torn_row(fh, writer.fieldnames, row))
        writer.writerow(row)
        fh.flush()  # before the unlock: the next writer must see this header and row
        fcntl.flock(fh, fcntl.LOCK_UN)


def _torn_row(fh: Any, fieldnames: Sequence[str], row: Mapping[str, Any]) -> None:
    """The first half of ``row`` as its line would be written (a crash inside the write)."""
    import io

    text = io.StringIO()
    csv.DictWriter(text, fieldnames=list(fieldnames), extrasaction="ignore").writerow(row)
    fh.write(text.getvalue()[: len(text.getvalue()) // 2])
    fh.flush()


def mark_killed(run_dir: Path) -> dict[str, Any] | None:
    """Record a run whose orchestrator died (``kill -9``, power loss) as ``killed``.

    Only a run directory that has a config but no summary and that no live process owns (its
    lock is free) qualifies; taking the lock keeps a concurrent caller out. Writes summary.json
    (status ``killed``, from what is on disk), a ``killed`` event, and the run's row in
    ``runs.csv`` (the sweep's, or the run's own). Returns the summary, None when not killed.
    Idempotent: once the summary exists, nothing more happens.
    """
    from orchestrator.config.errors import ConfigError

    run_dir = Path(run_dir)
    ours = (results.CONFIG_FILE, results.PLAN_FILE, results.EVENTS_FILE)
    if not all((run_dir / name).is_file() for name in ours) or \
            (run_dir / results.SUMMARY_FILE).exists():
        return None
    try:
        lock = results.RunDirLock(run_dir)
    except ConfigError:
        return None  # alive
    try:
        if (run_dir / results.SUMMARY_FILE).exists():
            return None
        summary = record.killed_summary(run_dir).to_dict()
        with open(run_dir / results.EVENTS_FILE, "a") as fh:
            fh.write(json.dumps({results.EVENT_TIME: time.time(),
                                 results.EVENT_KIND: results.EVENT_KILLED,
                                 results.EVENT_ROLE: results.ROLE_ORCHESTRATOR,
                                 "error": summary["error"]}) + "\n")
        results.write_atomic(run_dir / results.SUMMARY_FILE,
                             json.dumps(summary, indent=2, sort_keys=True) + "\n")
        sweep_dir = run_dir.parent if (run_dir.parent / "multirun.yaml").exists() else None
        append_run_row((sweep_dir or run_dir) / RUNS_CSV, recorded_overrides(run_dir), run_dir,
                       summary)
        return summary
    finally:
        lock.release()


def mark_killed_runs(root: Path) -> list[Path]:
    """:func:`mark_killed` for ``root`` and every run directory below it; the ones marked."""
    root = Path(root)
    candidates = [root, *sorted(p.parent for p in root.rglob(results.PLAN_FILE))]
    return [d for d in dict.fromkeys(candidates) if mark_killed(d) is not None]


def mark_killed_siblings(run_dir: Path) -> list[Path]:
    """Before a run starts: earlier runs beside it (the same sweep, or the same experiment's
    outputs folder) whose orchestrator was killed are marked so, with their runs.csv row."""
    parent = Path(run_dir).parent
    if not parent.is_dir():
        return []
    return [d for d in sorted(parent.iterdir())
            if d.is_dir() and d != Path(run_dir) and mark_killed(d) is not None]


def recorded_overrides(run_dir: Path) -> list[str]:
    """The run's command-line overrides, as Hydra recorded them."""
    import yaml

    try:
        data = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    return [str(o) for o in data] if isinstance(data, list) else []


# --- a resume's repair of the sweep's index (orchestrator/resume.py) ---------------------


def reconcile_runs_csv(path: Path, kept_points: Mapping[Path, Sequence[str]]) -> None:
    """A resume's repair of ``runs.csv`` (at `path`): one intact row per kept point (its run
    folder → its overrides), nothing else; a kept point without a row (the crash came between
    its summary and its row) gets it now."""
    kept = {str(d): d for d in kept_points}
    text = path.read_text() if path.exists() else ""
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    out = io.StringIO()
    writer = csv.writer(out)
    have: set[str] = set()
    if header:
        writer.writerow(header)
        col = header.index("run_dir") if "run_dir" in header else None
        for row in body:
            if col is None or len(row) != len(header):
                continue  # torn
            if row[col] in kept and row[col] not in have:
                have.add(row[col])
                writer.writerow(row)
    if header and len(have) == 0:
        path.unlink()
    elif header:
        results.write_atomic(path, out.getvalue())
    for run_dir, folder in kept.items():
        summary = results.read_summary(folder)
        if run_dir not in have and summary is not None:
            append_run_row(path, recorded_overrides(folder) or list(kept_points[folder]), folder,
                           summary)


def repair_launches(sweep_dir: Path, actions: Mapping[str, list[int]]) -> None:
    """Drop a torn last line of launches.jsonl and record the resume (`actions`: what it does
    with which point: keep, resume, start, rerun)."""
    path = sweep_dir / LAUNCHES_FILE
    if not path.exists():
        return
    lines = path.read_text().split("\n")
    good = []
    for line in lines:
        try:
            json.loads(line)
            good.append(line)
        except ValueError:
            continue
    entry = {"time": time.time(), "kind": "resume", **actions}
    results.write_atomic(path, "".join(line + "\n" for line in good) + json.dumps(entry) + "\n")
