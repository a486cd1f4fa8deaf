"""Cost and speed of transient vs on-demand clusters (ICAC'19), and of our own sweeps.

Why: the claim to check is "N cheap transient workers finish faster *and* cheaper than one or N
on-demand servers". We recompute it from the papers' per-run tables with their 2019 price
constants, then run the same comparison (and a time-vs-cost Pareto frontier) on any
``runs.csv`` of ours, so a sweep answers the same question for today's prices.

Run: ``python -m analysis cost [reference | SWEEP_DIR] [--json]``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cli import command_parser
from analysis.reference import load_icac19_experiment
from trainer.layout import ROLE_CHIEF, ROLE_WORKER

# GCE prices used by ICAC'19 (early 2019, $/h; recovered exactly from its cost.csv files).
PRICE_PER_H = {
    ("K80", "on-demand"): 0.7230,
    ("K80", "preemptible"): 0.2556,
    ("P100", "preemptible"): 0.5510,
    ("V100", "preemptible"): 0.8610,
    ("PS", "on-demand"): 0.1429,  # parameter server: on-demand CPU VM
}

# (workers, transient, training group, experiment folder) of the K80 comparison.
ICAC19_K80_CONFIGS = (
    (1, False, "k80_on_demand", "k80-demand"),
    (2, False, "k80_on_demand", "2-demand"),
    (4, False, "k80_on_demand", "4-demand"),
    (8, False, "k80_on_demand", "8-demand"),
    (2, True, "k80_spot", "2-spot"),
    (4, True, "k80_spot", "4-spot"),
    (8, True, "k80_spot", "8-spot"),
)


def cluster_cost_usd(
    duration_s: float, workers: int, worker_price_per_h: float, ps: int = 1,
    ps_price_per_h: float = PRICE_PER_H[("PS", "on-demand")],
) -> float:
    """Price model of ICAC'19 when no worker is lost: (workers × GPU price + PS price) × time.

    Single-worker runs were charged without a PS (pass ``ps=0``). Revoked workers cost less
    (charged until revocation): use the measured per-run costs for transient clusters.
    """
    return duration_s / 3600 * (workers * worker_price_per_h + ps * ps_price_per_h)


def icac19_k80_table() -> pd.DataFrame:
    """Mean time, cost and accuracy per K80 configuration, from the authors' per-run files."""
    rows = []
    for workers, transient, group, experiment in ICAC19_K80_CONFIGS:
        runs = load_icac19_experiment(group, experiment)
        price = PRICE_PER_H[("K80", "preemptible" if transient else "on-demand")]
        rows.append(
            {
                "config": f"{workers} {'transient' if transient else 'on-demand'} K80",
                "workers": workers,
                "transient": transient,
                "runs": len(runs),
                "time_s": runs["duration_s"].mean(),
                "time_std_s": runs["duration_s"].std(),
                "cost_usd": runs["cost_usd"].mean(),
                "accuracy": runs["accuracy"].mean(),
                "price_model_cost_usd": cluster_cost_usd(
                    runs["duration_s"].mean(), workers, price, ps=0 if workers == 1 else 1
                ),
            }
        )
    return pd.DataFrame(rows)


def add_comparisons(table: pd.DataFrame) -> pd.DataFrame:
    """Speed-up and savings of every row vs 1 on-demand worker and vs the on-demand cluster of
    the same size. NaN where that baseline was not measured, or is not one configuration (two
    on-demand configurations of one size, e.g. a sweep over learning rates: which would be the
    baseline?); :func:`comparison_notes` says why in the user's words."""
    out = table.copy()
    on_demand = out[~out["transient"]]
    sizes = on_demand["workers"]
    unique = on_demand[~sizes.duplicated(keep=False)].set_index("workers")
    base = (unique.loc[unique.index.min()] if len(unique) and len(sizes)
            and unique.index.min() == sizes.min() else None)
    if base is None:
        out["speedup_vs_1_on_demand"] = np.nan
        out["savings_vs_1_on_demand_pct"] = np.nan
    else:
        out["speedup_vs_1_on_demand"] = base["time_s"] / out["time_s"]
        out["savings_vs_1_on_demand_pct"] = 100 * (1 - out["cost_usd"] / base["cost_usd"])
    same = unique.reindex(out["workers"])
    out["speedup_vs_n_on_demand"] = same["time_s"].to_numpy() / out["time_s"].to_numpy()
    out["savings_vs_n_on_demand_pct"] = 100 * (1 - out["cost_usd"].to_numpy() / same["cost_usd"].to_numpy())
    out["pareto"] = pareto_mask(out["time_s"], out["cost_usd"])
    return out


def comparison_notes(table: pd.DataFrame) -> list[str]:
    """Why the speed-up and savings columns are empty, when they are (one line each)."""
    on_demand = table[~table["transient"]]
    if on_demand.empty:
        return ["no on-demand configuration in these runs (every cluster had transient workers), "
                "so speed-ups and savings have no baseline; sweep the workers' market, e.g. "
                "-m cluster.worker_groups.0.transient=true,false"]
    sizes = on_demand["workers"]
    shared = sorted({int(w) for w in sizes[sizes.duplicated(keep=False)]})
    if shared:
        return [f"several on-demand configurations have {', '.join(map(str, shared))} worker(s) "
                "(they differ in something other than size or market), so no one of them is the "
                "baseline; their speed-ups and savings are left empty"]
    return []


def pareto_mask(time_s: pd.Series, cost_usd: pd.Series) -> np.ndarray:
    """True for configurations no other one beats on both time and cost (both minimised)."""
    t, c = np.asarray(time_s, float), np.asarray(cost_usd, float)
    dominated = ((t[None, :] <= t[:, None]) & (c[None, :] <= c[:, None])
                 & ((t[None, :] < t[:, None]) | (c[None, :] < c[:, None]))).any(axis=1)
    return ~dominated & np.isfinite(t) & np.isfinite(c)


@dataclass(frozen=True)
class Headline:
    """ICAC'19's headline: best transient cluster vs one on-demand server and vs N on-demand."""

    workers: int
    transient_time_s: float
    on_demand_1_time_s: float
    speedup: float
    transient_cost_usd: float
    on_demand_n_cost_usd: float
    savings_vs_n_on_demand_pct: float
    savings_vs_1_on_demand_pct: float
    transient_accuracy: float
    on_demand_1_accuracy: float


def icac19_headline(workers: int = 8) -> Headline:
    """The 7.7× / 62.9 % claim recomputed (paper: up to 7.7× faster, 62.9 % cheaper)."""
    t = add_comparisons(icac19_k80_table()).set_index(["workers", "transient"])
    spot, od_n, od_1 = t.loc[(workers, True)], t.loc[(workers, False)], t.loc[(1, False)]
    return Headline(
        workers=workers,
        transient_time_s=float(spot["time_s"]),
        on_demand_1_time_s=float(od_1["time_s"]),
        speedup=float(spot["speedup_vs_1_on_demand"]),
        transient_cost_usd=float(spot["cost_usd"]),
        on_demand_n_cost_usd=float(od_n["cost_usd"]),
        savings_vs_n_on_demand_pct=float(spot["savings_vs_n_on_demand_pct"]),
        savings_vs_1_on_demand_pct=float(spot["savings_vs_1_on_demand_pct"]),
        transient_accuracy=float(spot["accuracy"]),
        on_demand_1_accuracy=float(od_1["accuracy"]),
    )


#: Columns that repeat a configuration rather than name one: runs differing only here are
#: repeats, averaged into one row.
REPEAT_KEYS = ("seed",)


def workers_transient(run_dir: str | Path) -> bool | None:
    """Whether a run's workers were transient, read from its ``plan.json`` (the hosts' markets:
    any transient worker makes the cluster revocable); None when the run has no plan."""
    path = Path(run_dir) / "plan.json"
    if not path.exists():
        return None
    workers = [h for h in json.loads(path.read_text()).get("hosts", [])
               if h.get("role") in (ROLE_WORKER, ROLE_CHIEF)]
    return any(bool(h.get("transient")) for h in workers) if workers else None


def own_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Our ``runs.csv`` → the same table: one row per configuration (mean over repeats).

    A configuration is the set of varying override columns (e.g. ``cluster.workers``; seeds
    are repeats, not configurations), else ``workers``. ``transient`` is what the run's plan
    rented (its workers' markets in ``plan.json``), else a ``transient`` override column. The
    comparisons need an on-demand configuration of one size (:func:`comparison_notes`). Failed
    runs are left out.
    """
    from analysis.runs import STATUS_COMPLETED, override_columns

    missing = [c for c in ("wall_time_s", "cost_usd", "final_accuracy") if c not in runs]
    if missing:
        raise ValueError(f"the runs' table has no {', '.join(missing)} column (a runs.csv of "
                         "another tool or version?)")
    df = runs.copy()
    if "status" in df:
        df = df[df["status"].fillna(STATUS_COMPLETED).eq(STATUS_COMPLETED)]
    if df.empty:
        raise ValueError("no completed runs to compare")
    transient_col = next((c for c in df.columns if c.split(".")[-1] == "transient"), None)
    planned = ([workers_transient(d) if isinstance(d, str) else None for d in df["run_dir"]]
               if "run_dir" in df else [None] * len(df))
    named = (df[transient_col].astype(str).str.lower().eq("true") if transient_col
             else pd.Series(False, index=df.index))
    df["transient"] = pd.Series([bool(n) if p is None else bool(p)
                                 for p, n in zip(planned, named, strict=True)],
                                index=df.index, dtype=bool)
    keys = [k for k in override_columns(df) if k.split(".")[-1] not in REPEAT_KEYS] or ["workers"]
    grouped = df.groupby([*keys, "transient"], dropna=False, sort=True)
    # keyed by workers (a single run, or repeats of one size): it is a group key already
    by_workers = {} if "workers" in keys else {"workers": ("workers", "first")}
    table = grouped.agg(
        **by_workers,
        runs=("wall_time_s", "size"),
        time_s=("wall_time_s", "mean"),
        time_std_s=("wall_time_s", "std"),
        cost_usd=("cost_usd", "mean"),
        accuracy=("final_accuracy", "mean"),
    ).reset_index()
    # "workers=2, protocol=bsp": short key names; transient is shown by the marker instead
    names = [k for k in keys if k != transient_col] or ["workers"]
    table["config"] = table[names].apply(
        lambda r: ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r.items()), axis=1)
    return add_comparisons(table)


def cost_table(source: str | Path = "reference") -> pd.DataFrame:
    """The comparison table for ``reference`` (ICAC'19 K80) or one of our sweep/run folders."""
    if str(source) == "reference":
        return add_comparisons(icac19_k80_table())
    from analysis.runs import load_runs_table

    return own_runs_table(load_runs_table(source))


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis cost``: print the comparison table (and the ICAC'19 headline)."""
    parser = command_parser(
        "cost",
        description="Time, cost, accuracy and savings of transient vs on-demand clusters.",
    )
    parser.add_argument("source", nargs="?", default="reference",
                        help="'reference' (ICAC'19 data) or a sweep/run directory of ours")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    table = cost_table(args.source)
    headline = icac19_headline() if args.source == "reference" else None
    if args.json:
        payload = {"table": json.loads(table.to_json(orient="records"))}
        if headline:
            payload["headline"] = asdict(headline)
        payload["notes"] = comparison_notes(table)
        print(json.dumps(payload, indent=1))
        return 0
    print(table.round(4).to_string(index=False))
    for note in comparison_notes(table):
        print(f"note: {note}")
    if headline:
        h = headline
        print(f"\n{h.workers} transient K80: {h.transient_time_s:,.1f} s vs {h.on_demand_1_time_s:,.1f} s "
              f"on 1 on-demand K80 = {h.speedup:.2f}× faster; ${h.transient_cost_usd:.4f} vs "
              f"${h.on_demand_n_cost_usd:.4f} for {h.workers} on-demand = "
              f"{h.savings_vs_n_on_demand_pct:.1f} % cheaper (paper: 7.7×, 62.9 %)")
    return 0
