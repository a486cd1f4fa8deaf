"""The plan's prediction as a band: simulate the planned run ``sim.repeats`` times.

A single estimate hides what transient servers do to a run (a revocation early in a run costs
much more than one at the end), so the dry run shows the 10th–90th percentile of time, cost and
revocations over seeded simulations, and ``summary.json`` of a real run keeps it
(``predicted``) beside what was measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import RunPlan
from orchestrator.preflight import PreflightError
from orchestrator.rundir import results
from orchestrator.simulate.cloud import cloud_market
from orchestrator.simulate.engine import simulate
from orchestrator.simulate.models import NoModelError, SimModels
from provisioning import catalog
from trainer.layout import ROLE_WORKER

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


def percentiles_or_never(values: Sequence[float | None], points: Sequence[int] = BAND
                         ) -> dict[str, float | None]:
    """Percentiles over every run where a run that never finished (None) counts as slower
    than any that did: a percentile that falls among them is None ("never")."""
    data = sorted(v for v in values if v is not None)
    out: dict[str, float | None] = {}
    for p in points:
        pos = (len(values) - 1) * p / 100
        lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
        if lo >= len(data) or (hi >= len(data) and pos > lo):
            out[f"p{p}"] = None
        else:
            out[f"p{p}"] = round(data[lo] + (data[hi] - data[lo]) * (pos - lo), 4)
    return out


def wilson_halfwidth(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of the Wilson score interval of a proportion ``p`` seen in ``n`` runs (never
    0, even at p = 0 or 1: 100 runs out of 100 do not make a certainty)."""
    denom = 1 + z * z / n
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom


def wilson_bounds(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval (low, high) of a proportion ``p`` seen in ``n`` runs."""
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = wilson_halfwidth(p, n, z)
    return max(0.0, center - half), min(1.0, center + half)


def share_text(p: float, n: int) -> str:
    """A share of ``n`` simulated runs said to what ``n`` runs know: all of them is the Wilson
    lower bound ("≥ 98%" from 200 of 200, never "100%"), none the upper ("≤ 2%"), any other
    share kept within 1–99 % (rounding 199 of 200 up would claim a certainty). The planner's
    table and the dry run's band both say P this way."""
    if n <= 0:
        return "-"
    low, high = wilson_bounds(p, n)
    if round(p * n) >= n:
        return f"≥ {math.floor(low * 100)}%"
    if round(p * n) <= 0:
        return f"≤ {math.ceil(high * 100)}%"
    return f"{min(99, max(1, round(p * 100)))}%"


def summarize_runs(summaries: list[dict[str, Any]], deadline_s: float | None = None
                   ) -> dict[str, Any]:
    """Distribution of simulated runs.

    Over every run: ``time_to_result_s`` (a failed run never gives one: percentiles that fall
    among failed runs are None), ``cost_usd`` (what a run costs, failed or not), revocations,
    P(completed) and, with a deadline, P(completed within it). Over the completed runs only,
    and saying so (``band_share`` = the share of runs they cover): ``wall_time_s`` and
    ``train_time_s``, which a completed real run is compared with (``prediction_error``)."""
    done = [s for s in summaries if s["status"] == results.STATUS_COMPLETED]
    basis = done or summaries
    out: dict[str, Any] = {
        "runs": len(summaries),
        "p_complete": round(len(done) / len(summaries), 4),
        "time_to_result_s": percentiles_or_never(
            [s["wall_time_s"] if s["status"] == results.STATUS_COMPLETED else None
             for s in summaries]),
        "wall_time_s": percentiles([s["wall_time_s"] for s in basis]),
        "train_time_s": percentiles([s["train_time_s"] for s in basis]),
        "band_share": round(len(basis) / len(summaries), 4),
        "cost_usd": percentiles([s["cost_usd"] for s in summaries]),
        "revocations": percentiles([s["revocations"] for s in summaries]),
        "mean_wall_time_s": round(statistics.fmean(s["wall_time_s"] for s in basis), 3),
        "mean_cost_usd": round(statistics.fmean(s["cost_usd"] for s in summaries), 6),
        "mean_revocations": round(statistics.fmean(s["revocations"] for s in summaries), 4),
        "final_accuracy": next((s["final_accuracy"] for s in done), None),
        # which measured runs that accuracy is (orchestrator.simulate.models.accuracy)
        "accuracy_source": next((s.get("accuracy_source") for s in done), None),
    }
    if deadline_s is not None:
        out["p_deadline"] = round(sum(1 for s in done if s["wall_time_s"] <= deadline_s)
                                  / len(summaries), 4)
    return out


def draws(cfg: ExperimentConfig, market: bool = True) -> str:
    """What each simulated run of ``cfg`` draws, for the text above a band or a plan. The
    cloud's revocations are drawn per run; an experiment's own ``revocation`` model is a seeded
    plan, the same in every run (what a real run of it injects), so the band does not cover
    other revocations. ``market``: a cloud revokes the hosts (False: local processes, SSH)."""
    from orchestrator.config.transient import RevocationModel

    rev = cfg.revocation
    if rev.model != RevocationModel.none:
        return (f"the speed model's error drawn per run; revocations: the experiment's "
                f"{rev.model} model (seed {rev.seed}), the same in every run")
    if not market:
        return "the speed model's error drawn per run; no cloud revokes these hosts"
    return "revocations and the speed model's error drawn per run"


def simulate_many(cfg: ExperimentConfig, plan: RunPlan, repeats: int,
                  models: SimModels | None = None, first: int = 0) -> list[dict[str, Any]]:
    """Summaries of ``repeats`` simulations with seeds ``sim.seed+first, sim.seed+first+1, …``
    (no metrics rows, the plan's dict made once: only the summaries are kept)."""
    models = models or SimModels.load()
    plan_dict = plan.to_dict()
    return [simulate(cfg, plan, cfg.sim.seed + first + i, models, metrics=False,
                     plan_dict=plan_dict).summary
            for i in range(repeats)]


def estimate(cfg: ExperimentConfig, plan: RunPlan, models: SimModels) -> dict[str, Any]:
    """The speed model's point estimate of the plan with ``models`` (calibrated or not): the
    same figures as the plan's ``est_*`` and, per worker GPU, how far its step time may be off;
    the dry run prints it above the band so both come from one model."""
    from orchestrator.plan import estimate_train_time_s

    train = estimate_train_time_s(cfg, plan.hosts, plan.phases, models)
    gpus = sorted({h.gpu for h in plan.hosts if h.role == ROLE_WORKER}, key=str)
    errors = {g or "cpu": models.step_time_error(cfg.job.hparam_set, g) for g in gpus}
    return {"steps_per_sec": round(plan.total_steps / train, 4), "train_time_s": round(train, 3),
            "cost_usd": round(catalog.cost_usd([plan.hourly_usd], train), 6),
            "speed_error": errors,
            "extrapolated": sorted(g for g, e in errors.items() if e["basis"] == "extrapolated")}


def predict_band(cfg: ExperimentConfig, plan: RunPlan) -> dict[str, Any] | None:
    """The band for the plan; ``{"unavailable": reason}`` when no model covers it; None when
    the run itself is a simulation (it is its own prediction).

    CPU workers on this machine (``provider=local``) are predicted from a calibration of this
    machine (:mod:`orchestrator.simulate.calibrate`): a run measures one when none is cached, a
    dry run only uses a cached one. A local run of a GPU cluster (CPU processes standing in)
    keeps the GPU cluster's band, marked ``stand_in``: it predicts the cloud run, not this one."""
    from orchestrator.simulate import calibrate

    if plan.backend.simulated and not cfg.dry_run:
        return None
    models = calibrate.with_gpu_calibrations(SimModels.load(), cfg)
    cal = None
    try:
        band = summarize_runs(simulate_many(cfg, plan, max(1, cfg.sim.repeats), models))
        band["estimate"] = estimate(cfg, plan, models)
    except NoModelError as ex:
        if not calibrate.applies(plan):
            return {"unavailable": str(ex)}
        try:
            cal = calibrate.calibration(cfg, measure_if_missing=not cfg.dry_run)
        except PreflightError as failed:  # a prediction is no reason to stop the run
            return {"unavailable": f"{ex}; calibrating this machine failed: {failed}"}
        if cal is None:
            return {"unavailable": f"{ex}; not calibrated on this machine yet: a run measures "
                                   "the step time here first"}
        try:
            local = calibrate.calibrated_models(models, cfg, cal)
            band = summarize_runs(simulate_many(cfg, plan, max(1, cfg.sim.repeats), local))
            band["estimate"] = estimate(cfg, plan, local)
        except NoModelError as still:  # e.g. a GPU cluster whose model the papers never ran
            return {"unavailable": f"{ex}; calibrated for CPU workers only: {still}"}
        band["calibration"] = cal
    market, _ = cloud_market(cfg, plan.backend)
    band["draws"] = draws(cfg, market is not None)
    band["source"] = (f"{cfg.sim.repeats} simulations (provider=sim models"
                      + (", step time, checkpoint and start-up calibrated on this machine"
                         if cal else "")
                      + (f", lifetimes {cfg.sim.lifetimes}, {market})" if market
                         else ", no cloud revocations)"))
    if cal is None and calibrate.applies(plan):
        band["stand_in"] = True  # GPU hosts played by local CPU processes
    return band
