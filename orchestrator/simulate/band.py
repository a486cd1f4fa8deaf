"""The plan's prediction as a band: simulate the planned run ``sim.repeats`` times.

A single estimate hides what transient servers do to a run (a revocation early in a run costs
much more than one at the end), so the dry run shows the 10th–90th percentile of time, cost and
revocations over seeded simulations, and ``summary.json`` of a real run keeps it
(``predicted``) beside what was measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import RunPlan
from orchestrator.simulate.engine import cloud_market, simulate
from orchestrator.simulate.models import NoModelError, SimModels

BAND = (10, 50, 90)  # percentiles shown


def percentiles(values: Sequence[float], points: Sequence[int] = BAND) -> dict[str, float]:
    """``{"p10": …, "p50": …, "p90": …}`` by linear interpolation (exact for one value)."""
    data = sorted(values)
    out = {}
    for p in points:
        pos = (len(data) - 1) * p / 100
        lo = int(pos)
        hi = min(lo + 1, len(data) - 1)
        out[f"p{p}"] = round(data[lo] + (data[hi] - data[lo]) * (pos - lo), 4)
    return out


def summarize_runs(summaries: list[dict[str, Any]], deadline_s: float | None = None
                   ) -> dict[str, Any]:
    """Distribution of simulated runs: bands of wall time and cost (over the runs that
    completed: a failed run gives no result), revocations (over all); P(completed) and, with a
    deadline, P(completed within it)."""
    done = [s for s in summaries if s["status"] == "completed"]
    basis = done or summaries
    out: dict[str, Any] = {
        "runs": len(summaries),
        "p_complete": round(len(done) / len(summaries), 4),
        "wall_time_s": percentiles([s["wall_time_s"] for s in basis]),
        "cost_usd": percentiles([s["cost_usd"] for s in basis]),
        "revocations": percentiles([s["revocations"] for s in summaries]),
        "mean_wall_time_s": round(statistics.fmean(s["wall_time_s"] for s in basis), 3),
        "mean_cost_usd": round(statistics.fmean(s["cost_usd"] for s in basis), 6),
        "mean_revocations": round(statistics.fmean(s["revocations"] for s in summaries), 4),
        "final_accuracy": next((s["final_accuracy"] for s in done), None),
    }
    if deadline_s is not None:
        out["p_deadline"] = round(sum(1 for s in done if s["wall_time_s"] <= deadline_s)
                                  / len(summaries), 4)
    return out


def simulate_many(cfg: ExperimentConfig, plan: RunPlan, repeats: int,
                  models: SimModels | None = None) -> list[dict[str, Any]]:
    """Summaries of ``repeats`` simulations with seeds ``sim.seed, sim.seed+1, …``."""
    models = models or SimModels.load()
    return [simulate(cfg, plan, cfg.sim.seed + i, models).summary for i in range(repeats)]


def predict_band(cfg: ExperimentConfig, plan: RunPlan) -> dict[str, Any] | None:
    """The band for the plan; ``{"unavailable": reason}`` when no fitted model covers it (e.g.
    CPU workers); None when the run itself is a simulation (it is its own prediction)."""
    if cfg.provider.name == "sim" and not cfg.dry_run:
        return None
    try:
        band = summarize_runs(simulate_many(cfg, plan, max(1, cfg.sim.repeats)))
    except NoModelError as ex:
        return {"unavailable": str(ex)}
    market, _ = cloud_market(cfg)
    band["source"] = (f"{cfg.sim.repeats} simulations (provider=sim models, "
                      + (f"lifetimes {cfg.sim.lifetimes}, {market})" if market
                         else "no cloud revocations)"))
    return band
