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
least 200 for the others. Progress (the planner's search, then the fresh runs per configuration)
goes to stderr, so that stdout is the table alone.
"""

from __future__ import annotations

import argparse
import copy
import math
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.feedback import Feedback, plural
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
    from orchestrator.simulate.planner import evaluate
    from orchestrator.simulate.planner_candidates import configure
    from orchestrator.simulate.validate import compose

    cfg = compose(overrides)
    validate(cfg)
    if cfg.planner.deadline_h is None:
        raise ConfigError("deadline_h", "the reliability check needs a deadline",
                          "hours, e.g. deadline_h=2")
    deadline_s = cfg.planner.deadline_h * 3600
    models = with_gpu_calibrations(SimModels.load(), cfg)
    out = []
    rows = evaluate(cfg, models, prune=False)  # every row refined, shown or not
    doing = f"checking {plural(len(rows), 'configuration')} on fresh seeds"
    with Feedback(doing, len(rows)) as feedback:
        for row in rows:
            c = row["candidate"]
            run_cfg = configure(cfg, c)
            plan = make_plan(run_cfg)
            printed = row["p_deadline"]
            n = fresh if uncertain(printed) else EXTREME_RUNS
            share = summarize_runs(simulate_many(run_cfg, plan, n, models,
                                                 first=FRESH_SEED_OFFSET),
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
            feedback.advance(note=f"{c.label} {c.zone}: printed {printed:.1%}, fresh {share:.1%}")
    return out


def uncertain(printed: float) -> bool:
    """Where sampling noise is largest, and the fresh sample is ``--fresh`` runs."""
    return 0.02 < printed < 0.98


def markdown(rows: list[dict[str, Any]], every: bool = False) -> list[str]:
    """The table of ``docs/simulation.md``, by printed P: the configurations whose P is not
    near 0 or 1 (all of them with ``every``), then one line for the rest."""
    lines = ["| cluster | zone | on revocation | printed P(deadline) | runs | fresh share | runs | "
             "difference (points) | without the speed error |",
             "|---|---|---|---|---|---|---|---|---|"]
    ordered = sorted(rows, key=lambda r: (-r["printed"], r["cluster"], r["zone"]))
    for r in ordered:
        if not (every or uncertain(r["printed"])):
            continue
        mark = " †" if r["extrapolated"] else ""
        lines.append(f"| {r['cluster']}{mark} | {r['zone']} | {r['recovery']} | "
                     f"{r['printed']:.1%} | {r['planner_runs']} | {r['fresh']:.1%} | "
                     f"{r['fresh_runs']} | {100 * r['difference']:+.1f} | "
                     f"{r['without_speed_error']:.1%} |")
    within = sum(r["within"] for r in rows)
    worst = max(abs(r["difference"]) for r in rows) if rows else 0.0
    rest = [r for r in rows if not uncertain(r["printed"])]
    if rest and not every:
        lines += ["", f"{len(rest)} more configurations printed P ≤ 2 % or ≥ 98 % "
                  f"({EXTREME_RUNS} fresh runs each): largest difference "
                  f"{100 * max(abs(r['difference']) for r in rest):.1f} points."]
    lines += ["", f"{within} of {len(rows)} configurations within ±{100 * TOLERANCE:.0f} points; "
              f"largest difference {100 * worst:.1f} points."]
    return lines


def speed_error_markdown(hparam_set: str = "resnet_cifar_32") -> list[str]:
    """The speed model's held-out folds and the spread each GPU's step time is drawn with (the
    tables of ``docs/simulation.md``), from ``sim_models.json``."""
    from orchestrator.simulate.models import SimModels

    models = SimModels.load()
    error = models.params["step_time_error"]
    model = error["model"]
    lines = ["| held-out GPU | fitted on | outside the fitted TFLOPS/bandwidth (log) | rows | "
             "MAPE | mean log error | RMS log error |", "|---|---|---|---|---|---|---|"]
    for gpu, f in model["folds"].items():
        lines.append(f"| {gpu} | {', '.join(f['fitted_on'])} | {f['distance']:.2f} | {f['n']} | "
                     f"{f['mape']:.1f} % | {f['mean_log_error']:+.3f} | "
                     f"{f['rms_log_error']:.3f} |")
    lines += ["", f"measured {model['measured']:.3f}, architecture {model['architecture']:.3f}, "
              f"inside {model['inside']:.3f}, per log-unit outside {model['per_log_tflops']:.3f}"
              f" (measured {model['tflops_range'][0]:g}–{model['tflops_range'][1]:g} TFLOPS, "
              f"{model['mem_bw_range'][0]:g}–{model['mem_bw_range'][1]:g} GB/s); "
              f"w = {model['hardware_exponent']:.2f}",
              "", f"| GPU | {hparam_set} step (s, batch 128) | steps/s | basis | σ (log) | "
              "1σ factor | supported |", "|---|---|---|---|---|---|---|"]
    for gpu, e in sorted(error["by_job"][hparam_set].items()):
        step = models.step_time_s(hparam_set, gpu, 128)
        ok, why = models.supported(hparam_set, gpu)
        lines.append(f"| {gpu} | {step:.4f} | {1 / step:.1f} | {e['basis']} | "
                     f"{e['sigma_log']:.3f} | ×/÷{math.exp(e['sigma_log']):.2f} | "
                     f"{'yes' if ok else 'no'}: {why} |")
    lines += ["", "| GPU | public ratio to V100 | model (ResNet-32) | log error | 2σ | agrees | "
              "source |", "|---|---|---|---|---|---|---|"]
    for c in model.get("public_checks", []):
        if c["ratio"] is None:
            lines.append(f"| {c['gpu']} | none found | {c['predicted_ratio']:.2f} | | "
                         f"{2 * c['sigma_log']:.2f} | unchecked | |")
            continue
        lines.append(f"| {c['gpu']} | {c['ratio']:.2f} | {c['predicted_ratio']:.2f} | "
                     f"{c['log_error']:+.2f} | {2 * c['sigma_log']:.2f} | "
                     f"{'yes' if c['within'] else 'no'} | [{c['what']}]({c['url']}) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from orchestrator.simulate.planner import exit_on_config_error, parse_args
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(prog=prog_name("orchestrator.simulate.reliability"),
                                     description=__doc__.splitlines()[0])
    add_version_argument(parser, "orchestrator.simulate.reliability")
    parser.add_argument("overrides", nargs="*", help="the planner's question, e.g. "
                        "+experiment=cifar10_res32 deadline_h=2")
    parser.add_argument("--fresh", type=int, default=1000,
                        help="fresh runs per configuration with 2 %% < P < 98 %% (default 1000)")
    parser.add_argument("--every", action="store_true",
                        help="a row for every configuration (default: those with 2 %% < P < 98 %%)")
    parser.add_argument("--speed-error", action="store_true",
                        help="print the speed model's held-out error tables instead")
    args = parser.parse_args(argv)
    if args.speed_error:
        print("\n".join(speed_error_markdown()))
        return 0
    try:
        rows = check(parse_args(args.overrides), args.fresh)
    except Exception as ex:  # ConfigError or Hydra/OmegaConf errors: one line naming the field
        exit_on_config_error(ex, args.overrides)
    print("\n".join(markdown(rows, args.every)))
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
