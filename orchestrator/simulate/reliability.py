"""Is the planner's P(deadline) honest? Its printed figure against the share of fresh runs.

``python -m orchestrator.simulate.reliability +experiment=cifar10_res32 deadline_h=2`` asks the
planner the question (every configuration it searches, not only those it shows), then plays
every configuration again on seeds the planner never used, with revocations *and* the speed
model's error drawn per run, as the planner does, and prints one row per configuration: the
printed P(deadline) and the runs behind it, the share of the fresh runs that met the deadline,
the difference, and what the planner would have printed without the speed model's error
(revocations only, the point step time). ``docs/simulation.md`` shows its table.

Why fresh seeds: the planner's figure is an estimate from a finite sample; the check is that
another sample of the same model lands within ±5 points of it. ``--fresh`` runs per
configuration whose P lies strictly between 2 % and 98 % (where sampling noise is largest), at
least 200 for the others.
"""

from __future__ import annotations

import argparse
import copy
import math
from typing import Any

from orchestrator.simulate.band import simulate_many, summarize_runs

#: Seeds of the fresh runs start here: far from the planner's ``sim.seed + 0 …``.
FRESH_SEED_OFFSET = 1_000_000
#: Runs per configuration at an extreme P (≤ 2 % or ≥ 98 %), where the share cannot wander.
EXTREME_RUNS = 200
TOLERANCE = 0.05


def check(overrides: list[str], fresh: int = 1000) -> list[dict[str, Any]]:
    """One row per configuration of the planner's question ``overrides`` (which must set a
    deadline): printed P, fresh share, their difference, and P without the speed error."""
    from orchestrator.config.validation import validate
    from orchestrator.plan import make_plan
    from orchestrator.simulate.calibrate import with_gpu_calibrations
    from orchestrator.simulate.models import SimModels
    from orchestrator.simulate.planner import configure, evaluate
    from orchestrator.simulate.validate import compose

    cfg = compose(overrides)
    validate(cfg)
    if cfg.planner.deadline_h is None:
        raise ValueError("the reliability check needs a deadline (deadline_h=…)")
    deadline_s = cfg.planner.deadline_h * 3600
    models = with_gpu_calibrations(SimModels.load(), cfg)
    out = []
    for row in evaluate(cfg, models):
        c = row["candidate"]
        run_cfg = configure(cfg, c)
        plan = make_plan(run_cfg)
        printed = row["p_deadline"]
        n = fresh if 0.02 < printed < 0.98 else EXTREME_RUNS
        share = summarize_runs(simulate_many(run_cfg, plan, n, models, first=FRESH_SEED_OFFSET),
                               deadline_s)["p_deadline"]
        point_cfg = copy.deepcopy(run_cfg)
        point_cfg.sim.speed_error = False
        point = summarize_runs(simulate_many(point_cfg, plan, row["runs"], models),
                               deadline_s)["p_deadline"]
        out.append({"cluster": c.label, "zone": c.zone, "sync": c.sync_label,
                    "recovery": row["recovery"], "extrapolated": row["extrapolated"],
                    "printed": printed, "planner_runs": row["runs"], "fresh": share,
                    "fresh_runs": n, "difference": round(share - printed, 4),
                    "without_speed_error": point,
                    "within": abs(share - printed) <= TOLERANCE + 1e-9})
    return out


def binomial_bound(p: float, n1: int, n2: int, sigmas: float = 5.0) -> float:
    """``sigmas`` standard deviations of the difference of two independent shares of ``n1``
    and ``n2`` runs with probability ``p``: the bound a test asserts (5σ cannot flake)."""
    return sigmas * math.sqrt(max(p * (1 - p), 1e-4) * (1 / n1 + 1 / n2))


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The table of ``docs/simulation.md``: by printed P, then cluster."""
    lines = ["| cluster | zone | on revocation | printed P(deadline) | runs | fresh share | runs | "
             "difference | without the speed error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (-r["printed"], r["cluster"], r["zone"])):
        mark = " †" if r["extrapolated"] else ""
        lines.append(f"| {r['cluster']}{mark} | {r['zone']} | {r['recovery']} | "
                     f"{r['printed']:.1%} | {r['planner_runs']} | {r['fresh']:.1%} | "
                     f"{r['fresh_runs']} | {100 * r['difference']:+.1f} | "
                     f"{r['without_speed_error']:.1%} |")
    within = sum(r["within"] for r in rows)
    worst = max(abs(r["difference"]) for r in rows) if rows else 0.0
    lines += ["", f"{within} of {len(rows)} configurations within ±{TOLERANCE:.0%} points; "
              f"largest difference {100 * worst:.1f} points."]
    return lines


def main(argv: list[str] | None = None) -> int:
    from orchestrator.simulate.planner import parse_args

    parser = argparse.ArgumentParser(prog="python -m orchestrator.simulate.reliability",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="the planner's question, e.g. "
                        "+experiment=cifar10_res32 deadline_h=2")
    parser.add_argument("--fresh", type=int, default=1000,
                        help="fresh runs per configuration with 2 %% < P < 98 %% (default 1000)")
    args = parser.parse_args(argv)
    rows = check(parse_args(args.overrides), args.fresh)
    print("\n".join(markdown(rows)))
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
