"""Cost and speed of transient vs on-demand clusters (ICAC'19), and of our own sweeps.

Why: the claim to check is "N cheap transient workers finish faster *and* cheaper than one or N
on-demand servers". We recompute it from the papers' per-run tables with their 2019 price
constants, then run the same comparison (and a time-vs-cost Pareto frontier) on any
``runs.csv`` of ours, so a sweep answers the same question for today's prices.

Run: ``python -m analysis cost [reference | SWEEP_DIR] [--json]``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.reference import load_icac19_experiment

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
    the same size (NaN where that baseline was not measured)."""
    out = table.copy()
    on_demand = out[~out["transient"]].set_index("workers")
    base = on_demand.loc[on_demand.index.min()]
    out["speedup_vs_1_on_demand"] = base["time_s"] / out["time_s"]
    out["savings_vs_1_on_demand_pct"] = 100 * (1 - out["cost_usd"] / base["cost_usd"])
    same = on_demand.reindex(out["workers"])
    out["speedup_vs_n_on_demand"] = same["time_s"].to_numpy() / out["time_s"].to_numpy()
    out["savings_vs_n_on_demand_pct"] = 100 * (1 - out["cost_usd"].to_numpy() / same["cost_usd"].to_numpy())
    out["pareto"] = pareto_mask(out["time_s"], out["cost_usd"])
    return out


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


def own_runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Our ``runs.csv`` → the same table: one row per configuration (mean over repeats).

    A configuration is the set of varying override columns (e.g. ``cluster.workers``), else
    ``workers``. ``transient`` comes from a column of that name when present (baseline = the
    fewest on-demand workers), otherwise every row counts as on-demand and the baseline is the
    configuration with the fewest workers. Failed runs are left out.
    """
    from analysis.runs import override_columns

    df = runs.copy()
    if "status" in df:
        df = df[df["status"].fillna("completed").eq("completed")]
    if df.empty:
        raise ValueError("no completed runs to compare")
    keys = override_columns(df) or ["workers"]
    transient_col = next((c for c in df.columns if c.split(".")[-1] == "transient"), None)
    df["transient"] = df[transient_col].astype(str).str.lower().eq("true") if transient_col else False
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
    if not (~table["transient"]).any():
        table.loc[table["workers"].idxmin(), "transient"] = False
    return add_comparisons(table)


def cost_table(source: str | Path = "reference") -> pd.DataFrame:
    """The comparison table for ``reference`` (ICAC'19 K80) or one of our sweep/run folders."""
    if str(source) == "reference":
        return add_comparisons(icac19_k80_table())
    from analysis.runs import load_runs_table

    return own_runs_table(load_runs_table(source))


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis cost``: print the comparison table (and the ICAC'19 headline)."""
    parser = argparse.ArgumentParser(
        prog="python -m analysis cost",
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
        print(json.dumps(payload, indent=1))
        return 0
    print(table.round(4).to_string(index=False))
    if headline:
        h = headline
        print(f"\n{h.workers} transient K80: {h.transient_time_s:,.1f} s vs {h.on_demand_1_time_s:,.1f} s "
              f"on 1 on-demand K80 = {h.speedup:.2f}× faster; ${h.transient_cost_usd:.4f} vs "
              f"${h.on_demand_n_cost_usd:.4f} for {h.workers} on-demand = "
              f"{h.savings_vs_n_on_demand_pct:.1f} % cheaper (paper: 7.7×, 62.9 %)")
    return 0
