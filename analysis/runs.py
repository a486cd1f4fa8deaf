"""Read the project's own results: run directories and sweep directories (files only).

``analysis/`` never imports ``orchestrator``: the results schema (``summary.json`` with its
``schema_version``) is the contract, so a results folder copied from another machine, or written
by an older version, can still be analysed. Layout (issue 2, extended by issue 4)::

    SWEEP/runs.csv                 one row per run: override columns + summary fields
    SWEEP/<run>/config.yaml        resolved config
    SWEEP/<run>/plan.json
    SWEEP/<run>/events.jsonl       {"time", "kind", "role", ...} per line
    SWEEP/<run>/metrics.csv        wall_time_s, global_step, steps_per_sec, loss, eval_accuracy
    SWEEP/<run>/summary.json
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

SUPPORTED_SCHEMA_MAJOR = 1
SUMMARY_FILE = "summary.json"
RUNS_TABLE_FILE = "runs.csv"
METRICS_COLUMNS = ("wall_time_s", "global_step", "steps_per_sec", "loss", "eval_accuracy")
#: summary.json ``status`` of a finished run (the schema's STATUS_COMPLETED; read, not imported)
STATUS_COMPLETED = "completed"
MAX_SEARCH_DEPTH = 4  # Hydra multirun nests runs as multirun/<date>/<time>/<job>/


@dataclass(frozen=True)
class Phase:
    """One protocol phase of a run (issue 4): global steps [start_step, end_step)."""

    protocol: str
    start_step: int
    end_step: int
    wall_s: float


@dataclass
class RunSummary:
    """``summary.json``; fields added by later schema versions default to None / empty.

    Unknown keys are kept in ``extra`` rather than rejected, so a newer writer does not break
    this reader.
    """

    schema_version: str | int | None = None
    run_id: str | None = None
    status: str | None = None
    experiment: str | None = None
    provider: str | None = None
    protocol: str | None = None
    workers: int | None = None
    parameter_servers: int | None = None
    global_steps: int | None = None
    wall_time_s: float | None = None
    train_time_s: float | None = None
    final_accuracy: float | None = None
    steps_per_sec: float | None = None
    cost_usd: float | None = None
    error: str | None = None
    revocations: int | None = None
    replacements: int | None = None
    recoveries: int | None = None
    lost_steps: int | None = None
    phases: list[Phase] = field(default_factory=list)
    switch_overhead_s: float | None = None
    stragglers: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        known = {f.name for f in fields(cls)} - {"extra", "phases"}
        summary = cls(**{k: v for k, v in data.items() if k in known})
        summary.phases = [
            Phase(str(p["protocol"]).lower(), int(p["start_step"]), int(p["end_step"]),
                  float(p.get("wall_s") or 0.0))
            for p in data.get("phases") or []
        ]
        summary.extra = {k: v for k, v in data.items() if k not in known and k != "phases"}
        return summary


@dataclass
class Run:
    """One run directory, fully read. ``metrics``/``events`` are empty frames when absent."""

    path: Path
    summary: RunSummary
    config: dict[str, Any]
    plan: dict[str, Any]
    metrics: pd.DataFrame
    events: pd.DataFrame

    @property
    def name(self) -> str:
        return self.summary.run_id or self.path.name


def _check_schema(version: Any, path: Path) -> None:
    try:
        major = int(str(version).split(".")[0])
    except ValueError:
        return
    if major > SUPPORTED_SCHEMA_MAJOR:
        warnings.warn(
            f"{path}: summary schema_version {version} is newer than this reader "
            f"({SUPPORTED_SCHEMA_MAJOR}); unknown fields are kept in RunSummary.extra",
            stacklevel=3,
        )


def read_metrics(path: Path) -> pd.DataFrame:
    """``metrics.csv`` sorted by step. A step logged twice (steps are at-least-once after a
    worker loss) keeps its last row, so curves never go back in time."""
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=list(METRICS_COLUMNS))
    df = pd.read_csv(path)
    for col in METRICS_COLUMNS:
        if col not in df:
            df[col] = pd.NA
        df[col] = pd.to_numeric(df[col], errors="coerce")
    if df["global_step"].notna().any():
        df = df.drop_duplicates("global_step", keep="last").sort_values("global_step")
    return df.reset_index(drop=True)


def read_events(path: Path) -> pd.DataFrame:
    """``events.jsonl``; a torn last line (the writer was killed mid-line) is skipped."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return pd.DataFrame.from_records(records, columns=None if records else ["time", "kind", "role"])


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def load_run(path: str | Path) -> Run:
    """Read one run directory; raises FileNotFoundError if it has no ``summary.json``."""
    path = Path(path)
    summary_path = path / SUMMARY_FILE
    if not summary_path.exists():
        raise FileNotFoundError(f"{path} is not a run directory: no {SUMMARY_FILE}")
    data = json.loads(summary_path.read_text())
    _check_schema(data.get("schema_version"), summary_path)
    plan_path = path / "plan.json"
    return Run(
        path=path,
        summary=RunSummary.from_dict(data),
        config=_read_yaml(path / "config.yaml"),
        plan=json.loads(plan_path.read_text()) if plan_path.exists() else {},
        metrics=read_metrics(path / "metrics.csv"),
        events=read_events(path / "events.jsonl"),
    )


def find_run_dirs(root: str | Path) -> list[Path]:
    """Run directories at or below ``root`` (depth ≤ MAX_SEARCH_DEPTH), sorted by path."""
    root = Path(root)
    if (root / SUMMARY_FILE).exists():
        return [root]
    found = []
    for depth in range(1, MAX_SEARCH_DEPTH + 1):
        found += [p.parent for p in root.glob("/".join(["*"] * depth) + "/" + SUMMARY_FILE)]
    return sorted(set(found))


def load_runs(root: str | Path) -> list[Run]:
    """Every run under a sweep (or the single run) at ``root``."""
    return [load_run(p) for p in find_run_dirs(root)]


def _summary_row(run: Run) -> dict[str, Any]:
    row = {f.name: getattr(run.summary, f.name) for f in fields(RunSummary)}
    row.pop("extra")
    row["phases"] = json.dumps([p.__dict__ for p in run.summary.phases]) or None
    row["run_dir"] = str(run.path)
    return row


def load_runs_table(root: str | Path) -> pd.DataFrame:
    """One row per run: ``runs.csv`` when the sweep has one, else built from the summaries.

    Raises FileNotFoundError when ``root`` holds neither. Numeric summary columns are coerced
    to numbers (a failed run writes empty cells).
    """
    root = Path(root)
    table_path = root / RUNS_TABLE_FILE
    if table_path.exists():
        df = pd.read_csv(table_path)
    else:
        runs = load_runs(root)
        if not runs:
            raise FileNotFoundError(
                f"{root}: no {RUNS_TABLE_FILE} and no run directories with {SUMMARY_FILE}"
            )
        df = pd.DataFrame([_summary_row(r) for r in runs])
    for col in ("workers", "parameter_servers", "global_steps", "wall_time_s", "train_time_s",
                "final_accuracy", "steps_per_sec", "cost_usd", "switch_overhead_s"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def override_columns(df: pd.DataFrame) -> list[str]:
    """Columns of ``runs.csv`` that are sweep overrides (dotted Hydra keys, e.g.
    ``cluster.workers``) and vary across rows: they name a configuration."""
    dotted = [c for c in df.columns if "." in c]
    return [c for c in dotted if df[c].nunique(dropna=False) > 1]
