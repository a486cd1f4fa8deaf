"""The simulator against the papers: simulated vs measured time and cost, side by side.

``python -m orchestrator.simulate.validate [--repeats N] [--markdown]`` prints the table that
``docs/simulation.md`` shows and ``tests/simulate/test_validation.py`` asserts.

Two ways of fitting, both honest about what was seen:

* **independent** (the simulator's default parameters): per-step time from CM-DARE's K80
  measurement, scaling from CM-DARE's cluster runs, checkpoint cost from CM-DARE's checkpoint
  model; the only parameter fitted on a compared run is BSP's per-worker sync cost (Sync-Switch's
  8-worker BSP mean, marked *fit*). Every other row is predicted.
* **calibrated** (Sync-Switch rows only): the per-worker step time is refitted on Sync-Switch's
  8-worker ASP mean and the sync cost on its 8-worker BSP mean (both *fit*); the hybrid
  schedules and the 16-worker runs are held out. This separates "the model's structure" from "Sync-Switch's GPUs were a
  little faster than CM-DARE's K80".

Measured values: ICAC'19 per-configuration means (``analysis.cost.icac19_k80_table``; time =
training duration, cost = the authors' per-run cost: workers until their revocation or the end,
plus the PS, none for one worker) and Sync-Switch means (``analysis.syncswitch``; time = the
files' ``Time``). Sync-Switch reported no cost: its reference cost is the measured time priced
with the 2019 K80 price per worker (its PS ran on the workers).
"""

from __future__ import annotations

import argparse
import copy
import statistics
from dataclasses import dataclass
from typing import Any

from orchestrator.rundir import results
from orchestrator.simulate.engine import Simulation
from orchestrator.simulate.models import SimModels
from provisioning import catalog
from trainer.layout import ROLE_PS, ROLE_WORKER


@dataclass(frozen=True)
class Case:
    study: str
    label: str
    overrides: tuple[str, ...]
    measured_time_s: float
    measured_cost_usd: float
    workers: int
    fitted: frozenset[str] = frozenset()  # fit modes in which this row was fitted on


def compose(overrides: list[str]) -> Any:
    """Compose and convert a config (Hydra's compose API, same files as the CLI)."""
    from orchestrator.config.compose import compose_config
    from orchestrator.config.load import to_experiment

    return to_experiment(compose_config(overrides))


def cases() -> list[Case]:
    """The compared configurations with their measured means."""
    from analysis.cost import PRICE_PER_H, icac19_k80_table
    from analysis.syncswitch import load_reference_runs, summarize

    out = []
    # the papers' means are compared with the model's point estimate (no drawn speed error)
    common = ("+experiment=icac19_k80", "provider=sim", "sim.speed_error=false",
              "sim.lifetimes=icac19",
              "sim.lifetime_region=all", "cluster.recovery.on_revocation=shrink")
    for r in icac19_k80_table().itertuples():
        out.append(Case("ICAC'19", str(r.config), (*common, f"cluster.workers={r.workers}",
                                                   f"cluster.worker_groups.0.transient={r.transient}"),
                        float(r.time_s), float(r.cost_usd), int(r.workers)))
    from analysis.reference import load_icac19_experiment

    for experiment, gpu, workers in (("p100", "p100", 1), ("4p100", "p100", 4),
                                     ("v100", "v100", 1), ("4v100", "v100", 4)):
        runs = load_icac19_experiment("p100_v100_spot", experiment)
        out.append(Case("ICAC'19", f"{workers} transient {gpu.upper()}",
                        (*common, f"cluster.workers={workers}", f"cluster.worker_groups.0.gpu={gpu}",
                         "cluster.worker_groups.0.zone=null", "cluster.ps_zone=null",
                         "cluster.worker_groups.0.transient=True"),
                        float(runs["duration_s"].mean()), float(runs["cost_usd"].mean()), workers))
    k80 = PRICE_PER_H[("K80", "on-demand")]
    base = ("+experiment=syncswitch_cifar10_res32", "provider=sim", "sim.speed_error=false",
            "cluster.worker_groups.0.transient=false")
    for dataset, workers, budget in (("cifar10_res32", 8, 8000), ("cluster_16", 16, 4000)):
        table = summarize(load_reference_runs(dataset))
        for r in table.itertuples():
            f = float(r.bsp_fraction)
            if r.asp_first or f not in (0.0, 0.05, 0.25, 0.5, 1.0):
                continue
            if dataset == "cifar10_res32" and f == 0.5:
                continue  # the 50 % runs vary ±306 s; the 16-worker 50/50 is compared instead
            order = "'1'" if f == 1.0 else "'0'" if f == 0.0 else "'10'"
            fractions = "[1.0]" if f in (0.0, 1.0) else f"[{f},{round(1 - f, 4)}]"
            sync = (f"sync.switch_order={order}", f"sync.fractions={fractions}",
                    "sync.phase_hparams=[]", f"job.train_steps={budget}")
            fitted = {"independent", "calibrated"} if (f == 1.0 and workers == 8) else set()
            if f == 0.0 and workers == 8:
                fitted.add("calibrated")
            out.append(Case("Sync-Switch", f"{workers} workers, {r.protocol}",
                            (*base, f"cluster.workers={workers}",
                             f"cluster.parameter_servers={workers}", *sync),
                            float(r.time_s), catalog.cost_usd([k80] * workers, float(r.time_s)), workers,
                            frozenset(fitted)))
    return out


def calibrated_models() -> SimModels:
    """The default parameters with the K80 step time refitted on Sync-Switch's 8-worker ASP
    runs and the BSP sync cost refitted on its 8-worker BSP runs (with that step time)."""
    from analysis.syncswitch import DATASETS, load_reference_runs, summarize

    models = SimModels.load()
    params = copy.deepcopy(models.params)
    table = summarize(load_reference_runs("cifar10_res32"))
    workers, budget = DATASETS["cifar10_res32"]
    asp = float(table[(table["bsp_fraction"] == 0) & ~table["asp_first"]]["time_s"].iloc[0])
    bsp = float(table[(table["bsp_fraction"] == 1) & ~table["asp_first"]]["time_s"].iloc[0])
    eff = models.efficiency("k80")
    ckpt = (budget * workers // 4000) * models.checkpoint_s("resnet_cifar_32")  # every 4k steps
    step = eff * (asp - ckpt) / budget  # ASP: budget·N steps at N·eff/step steps/s
    params["step_time_s"]["resnet_cifar_32"]["k80"] = step
    params["bsp"]["sync_s_per_worker"] = (bsp / budget - step) / workers
    return SimModels(params)


def simulate_case(case: Case, models: SimModels, repeats: int) -> dict[str, Any]:
    """Mean training time and cost (by the paper's rule) over ``repeats`` seeds."""
    from orchestrator.plan import make_plan

    cfg = compose(list(case.overrides))
    plan = make_plan(cfg)
    times, costs, revs = [], [], []
    for seed in range(repeats):
        sim = Simulation(cfg, plan, seed, models)
        summary = sim.run().summary
        if summary["status"] != results.STATUS_COMPLETED:
            continue
        times.append(summary["train_time_s"])
        revs.append(summary["revocations"])
        roles = (ROLE_WORKER,) if case.study == "Sync-Switch" or case.workers == 1 else (
            ROLE_WORKER, ROLE_PS)
        costs.append(sim.cost_usd(roles, training_only=True))
    return {"time_s": statistics.fmean(times), "cost_usd": statistics.fmean(costs),
            "revocations": statistics.fmean(revs), "completed": len(times) / repeats}


def compare(repeats: int = 30, mode: str = "independent") -> list[dict[str, Any]]:
    """One row per case: measured, simulated and the relative errors (%)."""
    default = SimModels.load()
    calibrated = calibrated_models() if mode == "calibrated" else default
    rows = []
    for case in cases():
        models = calibrated if case.study == "Sync-Switch" else default
        n = repeats if any("transient=True" in o for o in case.overrides) else 2
        sim = simulate_case(case, models, n)
        rows.append({
            "study": case.study, "config": case.label, "role": "fit" if mode in case.fitted
            else "predicted",
            "measured_time_s": round(case.measured_time_s, 1),
            "sim_time_s": round(sim["time_s"], 1),
            "time_err_pct": round(100 * (sim["time_s"] / case.measured_time_s - 1), 2),
            "measured_cost_usd": round(case.measured_cost_usd, 4),
            "sim_cost_usd": round(sim["cost_usd"], 4),
            "cost_err_pct": round(100 * (sim["cost_usd"] / case.measured_cost_usd - 1), 2),
            "sim_revocations": round(sim["revocations"], 2),
        })
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| study | configuration | role | time measured (s) | simulated | error | "
             "cost measured ($) | simulated | error | revocations/run (sim) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['study']} | {r['config']} | {r['role']} | "
                     f"{r['measured_time_s']:,.1f} | {r['sim_time_s']:,.1f} | "
                     f"{r['time_err_pct']:+.1f} % | {r['measured_cost_usd']:.4f} | "
                     f"{r['sim_cost_usd']:.4f} | {r['cost_err_pct']:+.1f} % | "
                     f"{r['sim_revocations']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(prog=prog_name("orchestrator.simulate.validate"),
                                     description=__doc__.splitlines()[0])
    add_version_argument(parser, "orchestrator.simulate.validate")
    parser.add_argument("--repeats", type=int, default=30, help="seeds per transient config")
    parser.add_argument("--mode", choices=("independent", "calibrated"), default="independent")
    args = parser.parse_args(argv)
    print("\n".join(markdown(compare(args.repeats, args.mode))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
