"""Why the planner's answer is empty: the limit that binds (every run failing, the parameter
servers' capacity, a deadline below the fastest run or met too rarely, the budget) with the
nearest configurations; and, when there is no configuration to simulate at all, the one
config error line that says why.
"""

from __future__ import annotations

import math
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig, Protocol
from orchestrator.config.simulate import PlannerConfig
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.planner_candidates import configure, machine_type_for, rentable
from orchestrator.simulate.planner_report import _hours


def _meets_deadline(r: dict[str, Any], p: PlannerConfig) -> bool:
    """Whether row ``r`` meets the deadline as :func:`rank` asks (completes, likely enough)."""
    return r["p_complete"] > 0 and (p.deadline_h is None or r.get("p_deadline", 0)
                                    >= max(p.min_p_deadline, 1e-9))


def ps_bound_s(rows: list[dict[str, Any]], cfg: ExperimentConfig
               ) -> list[tuple[float, dict[str, Any]]]:
    """(seconds, row): the least time each row's ASP steps take at what its parameter servers
    serve (``SimModels.ps_capacity``), whatever its GPUs; 0 for a run without ASP steps. Empty
    when the speed model has no capacity figure for the job."""
    from orchestrator.plan import plan_phases

    models, hparam = SimModels.load(), cfg.job.hparam_set
    if hparam not in models.params.get("parameters", {}):
        return []
    steps: dict[tuple[int, float | None], int] = {}  # ASP global steps by (workers, schedule)
    out = []
    for r in rows:
        c = r["candidate"]
        if (c.workers, c.bsp_fraction) not in steps:
            steps[c.workers, c.bsp_fraction] = sum(
                ph.end_step - ph.start_step for ph in plan_phases(configure(cfg, c), c.workers)
                if ph.protocol == Protocol.asp.value)
        out.append((steps[c.workers, c.bsp_fraction]
                    / models.ps_capacity(hparam, c.parameter_servers), r))
    return out


def binding_limit(rows: list[dict[str, Any]], cfg: ExperimentConfig) -> str:
    """Which limit leaves the answer empty, read from the rows: every run failing; the
    parameter servers' capacity (every row's ASP steps at what its PS serve take longer than
    the deadline, so no GPU helps, only more PS); a deadline below the fastest row's median;
    a deadline met too rarely (under ``planner.min_p_deadline``); or the budget, with what the
    cheapest row meeting the rest costs."""
    p = cfg.planner
    if not any(r["p_complete"] > 0 for r in rows):
        return "no configuration completes a run: every simulated run failed"
    if p.deadline_h is not None and not any(_meets_deadline(r, p) for r in rows):
        deadline_s = p.deadline_h * 3600
        bounds = ps_bound_s(rows, cfg)
        if bounds and min(b for b, _ in bounds) > deadline_s:
            bound, r = min(bounds, key=lambda br: (br[0], br[1]["mean_cost_usd"]))
            n = r["candidate"].parameter_servers
            models = SimModels.load()
            cap = models.ps_capacity(cfg.job.hparam_set, n)
            need = bound * cap / deadline_s  # the ASP steps over the deadline
            k = math.ceil(need / models.ps_capacity(cfg.job.hparam_set, 1))
            return (f"the parameter servers' capacity bounds every configuration ({n} PS "
                    f"serve{'s' if n == 1 else ''} {cap:.1f} steps/s; the deadline needs "
                    f"≥ {need:.1f} steps/s, so ≥ {k} PS: planner.parameter_servers=[{k}])")
        done = [r for r in rows if r["time_to_result_s"]["p50"] is not None]
        fastest = min(done, key=lambda r: r["time_to_result_s"]["p50"], default=None)
        if fastest is None:
            return ("the deadline is below the fastest possible: no configuration completes "
                    "half of its runs")
        if fastest["time_to_result_s"]["p50"] > deadline_s:
            return (f"the deadline is below the fastest possible: the fastest configuration's "
                    f"median is {_hours(fastest['time_to_result_s']['p50'])} h "
                    f"({fastest['candidate'].label})")
        likeliest = max(rows, key=lambda r: (r.get("p_deadline", 0), -r["mean_cost_usd"]))
        return (f"the deadline is met too rarely: at best P(deadline) "
                f"{likeliest['p_deadline']:.0%} ({likeliest['candidate'].label}), under "
                f"planner.min_p_deadline {p.min_p_deadline:.0%}")
    meet = [r for r in rows if _meets_deadline(r, p)]
    cheapest = min(meet, key=lambda r: r["mean_cost_usd"])
    what = "configuration" if p.deadline_h is None else "configuration that meets the deadline"
    return (f"over budget: the cheapest {what} costs ${cheapest['mean_cost_usd']:.2f} (mean; "
            f"{cheapest['candidate'].label}), the budget is ${p.budget_usd or 0:g}")


def nearest_misses(rows: list[dict[str, Any]], cfg: ExperimentConfig, n: int = 3) -> str:
    """When nothing meets the limits, two lines: the limit that binds (:func:`binding_limit`),
    then the ``n`` candidates nearest to it, so the user sees what a looser limit would buy.
    A deadline that binds: nearest by time, the median time to the result ascending among
    the rows that complete half their runs (as printed, to 0.01 h; the cheapest first among
    ties). The budget: short of the minimum P(deadline) by the least, then over the budget by
    the least, cheapest first. A question without a deadline shows the share of runs that
    complete, not a P(deadline)."""
    p = cfg.planner
    by_time = p.deadline_h is not None and not any(_meets_deadline(r, p) for r in rows)

    def key(r: dict[str, Any]) -> tuple[float, ...]:
        if by_time:
            p50 = r["time_to_result_s"]["p50"]
            return (p50 is None, 0.0 if p50 is None else round(p50 / 3600, 2),
                    -r["p_complete"], r["mean_cost_usd"])
        short = 0.0 if p.deadline_h is None else max(0.0, p.min_p_deadline - r["p_deadline"])
        over = 0.0 if p.budget_usd is None else max(0.0, r["mean_cost_usd"] / p.budget_usd - 1)
        return (r["p_complete"] == 0, short, over, -r["p_complete"], r["mean_cost_usd"])

    def odds(r: dict[str, Any]) -> str:
        return (f"completes {r['p_complete']:.0%}" if p.deadline_h is None
                else f"P(deadline) {r['p_deadline']:.0%}")

    parts = [f"{r['candidate'].label}{' †' if r['extrapolated'] else ''} in "
             f"{r['candidate'].zone}: {_hours(r['time_to_result_s']['p50'])} h (median), "
             f"{odds(r)}, mean ${r['mean_cost_usd']:.2f}"
             for r in sorted(rows, key=key)[:n]]
    return (f"nothing meets the limits: {binding_limit(rows, cfg)}\n"
            f"closest by {'time' if by_time else 'cost'}: " + "; ".join(parts))


def nothing_to_plan(cfg: ExperimentConfig) -> ConfigError:
    """Why a question has no configuration to simulate, as one config error line: the job
    has no GPU speed figure (a CPU-only job), none of its GPUs can be rented under this
    pricing or ``planner.gpus``, or every configuration fails validation."""
    from orchestrator.simulate.calibrate import with_gpu_calibrations

    hparam = cfg.job.hparam_set
    known = sorted(with_gpu_calibrations(SimModels.load(), cfg)
                   .params["step_time_s"].get(hparam, {}))
    if not known:
        return ConfigError("job.hparam_set", f"{hparam}: the speed model has no GPU figure for "
                           "this job, so there is no GPU cluster to plan (a CPU-only job; the "
                           "planner rents GPU workers)", "record one measured on a GPU: python "
                           f"-m orchestrator.simulate.calibrate +experiment={cfg.name} "
                           "--gpu G --step-s S")
    rentable_known = [g for g in known if g in cfg.pricing.gpus and rentable(cfg, g)]
    if cfg.planner.gpus:
        def why(gpu: str) -> str:
            if gpu not in known:
                return f"no speed figure for job.hparam_set={hparam}"
            if gpu in cfg.pricing.gpus and machine_type_for(cfg, gpu) is not None:
                return f"retired under pricing={cfg.pricing.name}"
            return f"not rented under pricing={cfg.pricing.name}"

        return ConfigError("planner.gpus", "no GPU to plan: " + "; ".join(
            f"{g}: {why(g)}" for g in cfg.planner.gpus), "rentable, with a speed figure: "
            + (", ".join(rentable_known) or "none"))
    if not rentable_known:
        return ConfigError("pricing", f"{cfg.pricing.name} rents none of the GPUs the speed "
                           f"model knows for job.hparam_set={hparam} ({', '.join(known)}: "
                           "retired, or on no catalog machine type)",
                           "pricing=papers_2019 keeps the 2019 GPUs")
    return ConfigError("planner.workers", "no configuration of "
                       f"{', '.join(rentable_known)} × workers {list(cfg.planner.workers)} "
                       "passes validation", "python -m orchestrator "
                       f"+experiment={cfg.name} dry_run=true names the first problem")
