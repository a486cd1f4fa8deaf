"""Loaders for the papers' measured data shipped in ``analysis/reference_data/``.

Every loader returns a tidy :class:`pandas.DataFrame` and absorbs one documented quirk of the
files (see ``reference_data/README.md``) so that the analyses never re-parse raw files:

* ``icac19/lifetime/lifetime.csv`` stacks sections (GPU titles, day lines, zone lines);
* ``cmdare/derived/lifetimes_by_region.csv`` is binned to whole hours (interval-censored);
* ``icac19/training`` mixes ``agg_data.csv`` (completed runs) and per-run processed files;
* Sync-Switch folder names are not uniform and ``Time`` must be used instead of wall clock.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pandas as pd

from analysis.data_dir import REFERENCE_DIR

LIFETIME_CAP_H = 24.0  # GCE stops every preemptible VM after 24 h: lifetimes are censored here
# A VM terminated within this slack of the cap was stopped by the cap, not revoked: the Feb 2019
# sheet has minute resolution and GCE's stop lands a few minutes after the 24 h mark.
CAP_SLACK_H = 0.25
MINUTE_H = 1 / 60  # resolution of the February 2019 timestamps

_GPU_SECTIONS = ("K80", "P100", "V100")
_ZONE_RE = re.compile(r"([a-z]+-[a-z]+\d+-[a-z])")


def reference_path(*parts: str) -> Path:
    """Path inside the shipped reference data; raises FileNotFoundError naming the fix."""
    path = REFERENCE_DIR.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(
            f"reference data file missing: {path} (the package ships analysis/reference_data/; "
            "reinstall the package or copy ../shared/reference_data there)"
        )
    return path


def zone_to_region(zone: str) -> str:
    """``us-west1-b`` → ``us-west1``; a region passes through unchanged."""
    return re.sub(r"-[a-z]$", "", zone)


# --------------------------------------------------------------------------- lifetimes
def load_cmdare_lifetimes() -> pd.DataFrame:
    """CM-DARE's 396 GPU VMs: ``gpu, region, revoked, lifetime_hours, lifetime_hours_lower``.

    Lifetimes are hour bins reconstructed from CDFs: a revoked VM died in
    ``(lifetime_hours_lower, lifetime_hours]``; a VM with ``revoked == False`` reached the cap.
    """
    df = pd.read_csv(reference_path("cmdare", "derived", "lifetimes_by_region.csv"))
    df["revoked"] = df["revoked"].astype(str).str.lower().eq("true")
    df["dataset"] = "cmdare"
    return df[["dataset", "gpu", "region", "revoked", "lifetime_hours", "lifetime_hours_lower"]]


def _parse_feb2019(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%m/%d/%y %H:%M")


def load_icac19_lifetimes() -> pd.DataFrame:
    """ICAC'19's February 2019 sections (64 K80, 40 P100, 48 V100 VMs) with exact lifetimes.

    The older "Previous experiments" block is skipped on purpose: it holds clock times only (a
    lifetime crossing midnight is ambiguous) and many VMs there were stopped by hand, so its
    censoring is unknown. ``stress`` is False for the idle ``…less`` VMs.
    """
    rows = []
    gpu: str | None = None
    for line in reference_path("icac19", "lifetime", "lifetime.csv").read_text().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells[0] in _GPU_SECTIONS and not any(cells[1:]):
            gpu = cells[0]
            continue
        if cells[0].startswith("Previous experiments"):
            break
        if gpu is None or cells[0] in ("", "VM name") or len(cells) < 3:
            continue
        match = _ZONE_RE.search(cells[0])
        hours = (_parse_feb2019(cells[2]) - _parse_feb2019(cells[1])).total_seconds() / 3600
        revoked = hours < LIFETIME_CAP_H - CAP_SLACK_H
        rows.append(
            {
                "dataset": "icac19",
                "gpu": gpu,
                "zone": match.group(1) if match else "unknown",
                "vm": cells[0],
                "stress": not cells[0].endswith("less"),
                "revoked": revoked,
                # A VM revoked within its first minute reads 0 h; survival fits need t > 0.
                "lifetime_hours": max(hours, MINUTE_H) if revoked else LIFETIME_CAP_H,
            }
        )
    df = pd.DataFrame(rows)
    df["region"] = df["zone"].map(zone_to_region)
    # Exact minute timestamps: the interval is (t - 1 min, t]; kept for a uniform schema.
    df["lifetime_hours_lower"] = (df["lifetime_hours"] - MINUTE_H).clip(lower=0)
    return df


# --------------------------------------------------------------------------- ICAC'19 training
def _read_optional(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.exists() else None


def load_icac19_experiment(group: str, experiment: str) -> pd.DataFrame:
    """Per-run ``zone, run, duration_s, accuracy, cost_usd`` of one ICAC'19 experiment folder.

    ``agg_data.csv`` is preferred: it is the authors' table of runs that finished (runs lost to a
    revoked master are mostly missing). Folders without it (``k80-demand``) are joined from
    ``train_data_processed.csv`` and ``cost.csv`` on the run number and zone.
    """
    folder = reference_path("icac19", "training", group, experiment)
    agg = _read_optional(folder / "agg_data.csv")
    if agg is None:
        proc = pd.read_csv(folder / "train_data_processed.csv")
        cost = pd.read_csv(folder / "cost.csv")
        keys = ["Run"] + (["Zone"] if "Zone" in proc and "Zone" in cost else [])
        if "Zone" in cost:  # cost.csv zones carry a "spot8-" style prefix in some folders
            cost["Zone"] = cost["Zone"].str.replace(r"^[a-z]+\d+-(?=[a-z]+-)", "", regex=True)
        agg = proc.merge(cost, on=keys, how="left")
    agg = agg.rename(
        columns={
            "Zone": "zone",
            "Run": "run",
            "Duration": "duration_s",
            "Accuracy": "accuracy",
            "Cost": "cost_usd",
        }
    )
    if "zone" not in agg:
        agg["zone"] = "unknown"
    agg["experiment"] = experiment
    return agg[["experiment", "zone", "run", "duration_s", "accuracy", "cost_usd"]]


# --------------------------------------------------------------------------- Sync-Switch
def read_syncswitch_curve(run_dir: Path) -> tuple[pd.DataFrame, float | None]:
    """Evaluation curve ``time_s, step, accuracy`` of one Sync-Switch run and its training time.

    ``time_s`` is the processed ``Time`` column (restart gaps at protocol switches removed). The
    training time is the last ``Time`` of ``acc_proc.csv``, or of ``loss_proc.csv`` where the run
    has no processed evaluation curve. A single-row ``acc.csv`` (a checkpoint re-evaluated a day
    later, e.g. ``baseline/bsp_3``) yields an empty curve: its accuracy is not a converged curve
    point and its timestamp is not the run's.
    """
    acc_proc = _read_optional(run_dir / "acc_proc.csv")
    loss_proc = _read_optional(run_dir / "loss_proc.csv")
    curve = pd.DataFrame(columns=["time_s", "step", "accuracy"])
    time_s: float | None = None
    if acc_proc is not None and "Time" in acc_proc and len(acc_proc) > 1:
        curve = pd.DataFrame(
            {"time_s": acc_proc["Time"], "step": acc_proc["Step"], "accuracy": acc_proc["Value"]}
        ).sort_values("step", kind="stable")
        time_s = float(curve["time_s"].iloc[-1])
    elif loss_proc is not None and "Time" in loss_proc and len(loss_proc):
        time_s = float(loss_proc["Time"].iloc[-1])
    return curve.reset_index(drop=True), time_s
