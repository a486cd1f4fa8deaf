"""The planner: which cluster to rent for this experiment, before paying for any.

``python -m orchestrator.plan +experiment=NAME deadline_h=1 budget_usd=5 [objective=cost]``
(``deadline_h``, ``budget_usd``, ``objective`` are shorthands of ``planner.*``; every other
argument is a Hydra override of the experiment, e.g. ``pricing=papers_2019``).

For every candidate (GPU types the catalog offers and the speed model knows × worker counts ×
transient or on-demand × zones × sync schedules) the run is simulated ``sim.repeats`` times;
the table ranks the candidates that meet the budget (mean cost) and the deadline
(``P(finish before the deadline) ≥ planner.min_p_deadline``) by the objective, with the
10th–90th percentile of time and cost, P(deadline) and the expected revocations. The
time-vs-cost plot with those bands (Pareto-optimal candidates labelled) and the table as CSV
go to ``outputs/plan/<name>/<time>/``.
"""

from __future__ import annotations

import copy
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import ExperimentConfig, Protocol, SyncPhase
from orchestrator.simulate.band import simulate_many, summarize_runs
from orchestrator.simulate.config import Objective
from orchestrator.simulate.models import NoModelError, SimModels

#: ``key=value`` shorthands accepted on the command line for ``planner.key=value``.
SHORTHANDS = ("deadline_h", "budget_usd", "objective")


@dataclass(frozen=True)
class Candidate:
    gpu: str
    workers: int
    transient: bool
    zone: str
    bsp_fraction: float | None  # None = the experiment's own sync

    @property
    def sync_label(self) -> str:
        if self.bsp_fraction is None:
            return "as configured"
        if self.bsp_fraction >= 1:
            return "BSP"
        if self.bsp_fraction <= 0:
            return "ASP"
        return f"BSP {self.bsp_fraction:.0%} → ASP"

    @property
    def label(self) -> str:
        kind = "transient" if self.transient else "on-demand"
        return f"{self.workers}× {self.gpu} {kind}"


def _zones(cfg: ExperimentConfig, gpu: str) -> list[str]:
    zones = cfg.pricing.zones_for(gpu)
    if cfg.planner.zones == "first" or not zones:
        return zones[:1]
    by_region: dict[str, str] = {}
    for zone in zones:
        by_region.setdefault(zone.rsplit("-", 1)[0], zone)
    return list(by_region.values())


def candidates(cfg: ExperimentConfig, models: SimModels) -> list[Candidate]:
    """The search space: catalog GPUs with a speed model (or ``planner.gpus``) × workers ×
    transient × zones (transient only: on-demand VMs are not revoked, one zone suffices) ×
    schedules."""
    known = models.params["step_time_s"].get(cfg.job.hparam_set, {})
    gpus = list(cfg.planner.gpus) or [g for g in cfg.pricing.gpus if g in known]
    fractions: list[float | None] = list(cfg.planner.bsp_fractions) or [None]
    out = []
    for gpu in gpus:
        for transient in cfg.planner.transient:
            zones = _zones(cfg, gpu) if transient else _zones(cfg, gpu)[:1]
            for zone in zones:
                for workers in cfg.planner.workers:
                    for fraction in fractions:
                        out.append(Candidate(gpu, workers, transient, zone, fraction))
    return out


def configure(cfg: ExperimentConfig, c: Candidate) -> ExperimentConfig:
    """The experiment on candidate ``c``'s cluster (a copy)."""
    out = copy.deepcopy(cfg)
    out.provider.name = "sim"
    out.cluster.workers = c.workers
    group = out.cluster.worker_groups[0]
    group.gpu, group.zone, group.transient, group.count = c.gpu, c.zone, c.transient, c.workers
    out.cluster.worker_groups = [group]
    out.cluster.ps_zone = c.zone
    if c.bsp_fraction is not None:
        out.sync.switch_order, out.sync.fractions, out.sync.phase_hparams = "", [], []
        phases = [(Protocol.bsp, c.bsp_fraction), (Protocol.asp, 1 - c.bsp_fraction)]
        out.sync.phases = [SyncPhase(p, round(f, 6), {}) for p, f in phases if f > 0]
    return out


def evaluate(cfg: ExperimentConfig, models: SimModels | None = None) -> list[dict[str, Any]]:
    """Simulate every candidate; one row per candidate (invalid ones are left out)."""
    from orchestrator.config.validation import validate
    from orchestrator.plan import make_plan

    models = models or SimModels.load()
    deadline_s = None if cfg.planner.deadline_h is None else cfg.planner.deadline_h * 3600
    rows = []
    for c in candidates(cfg, models):
        run_cfg = configure(cfg, c)
        try:
            validate(run_cfg)
            plan = make_plan(run_cfg)
            dist = summarize_runs(simulate_many(run_cfg, plan, max(1, cfg.sim.repeats), models),
                                  deadline_s)
        except (ConfigError, NoModelError):
            continue
        rows.append({"candidate": c, "gpu": c.gpu, "workers": c.workers,
                     "transient": c.transient, "zone": c.zone, "sync": c.sync_label,
                     "hourly_usd": plan.hourly_usd, **dist})
    return rows


def rank(rows: list[dict[str, Any]], cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Rows meeting the budget and deadline, best first by ``planner.objective``."""
    p = cfg.planner
    ok = [r for r in rows if r["p_complete"] > 0
          and (p.budget_usd is None or r["mean_cost_usd"] <= p.budget_usd)
          and (p.deadline_h is None or r.get("p_deadline", 0) >= max(p.min_p_deadline, 1e-9))]
    keys = {
        Objective.cost: lambda r: (r["mean_cost_usd"], r["mean_wall_time_s"]),
        Objective.time: lambda r: (r["mean_wall_time_s"], r["mean_cost_usd"]),
        Objective.deadline: lambda r: (-r.get("p_deadline", 0), r["mean_cost_usd"]),
    }
    return sorted(ok, key=keys[Objective(p.objective)])


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def print_table(ranked: list[dict[str, Any]], cfg: ExperimentConfig, total: int) -> None:
    from rich.table import Table

    from orchestrator.display import make_console

    p = cfg.planner
    console = make_console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    limits = []
    if p.deadline_h is not None:
        limits.append(f"deadline {p.deadline_h:g} h (P ≥ {p.min_p_deadline:.0%})")
    if p.budget_usd is not None:
        limits.append(f"budget ${p.budget_usd:g}")
    table = Table(title=f"Plan: {cfg.name}, {len(ranked)} of {total} configurations meet "
                  f"{', '.join(limits) or 'no limit'}; ranked by {p.objective} "
                  f"({cfg.sim.repeats} simulations each, prices {cfg.pricing.name})",
                  title_justify="left")
    for col in ("#", "cluster", "zone", "sync", "time h (p10–p90)", "cost $ (mean)",
                "cost $ (p10–p90)", "P(deadline)", "revocations", "accuracy"):
        table.add_column(col, justify="left" if col in ("cluster", "zone", "sync") else "right")
    for i, r in enumerate(ranked[:p.top], 1):
        c = r["candidate"]
        w, cost = r["wall_time_s"], r["cost_usd"]
        table.add_row(str(i), c.label, c.zone, c.sync_label,
                      f"{_hours(w['p10'])}–{_hours(w['p90'])}", f"{r['mean_cost_usd']:.2f}",
                      f"{cost['p10']:.2f}–{cost['p90']:.2f}",
                      "-" if "p_deadline" not in r else f"{r['p_deadline']:.0%}",
                      f"{r['mean_revocations']:.2f}",
                      "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}")
    console.print(table)


def pareto_plot(rows: list[dict[str, Any]], cfg: ExperimentConfig, path: Path) -> Path:
    """Median time vs median cost, p10–p90 error bars, Pareto-optimal candidates labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from analysis.cost import pareto_mask

    t = [r["wall_time_s"]["p50"] / 3600 for r in rows]
    c = [r["cost_usd"]["p50"] for r in rows]
    best = pareto_mask(t, c)
    fig, ax = plt.subplots(figsize=(9, 6))
    for r, ti, ci, on in zip(rows, t, c, best, strict=True):
        w, cost = r["wall_time_s"], r["cost_usd"]
        color = "tab:orange" if r["transient"] else "tab:blue"
        ax.errorbar(ti, ci, xerr=[[max(0.0, ti - w["p10"] / 3600)],
                                  [max(0.0, w["p90"] / 3600 - ti)]],
                    yerr=[[max(0.0, ci - cost["p10"])], [max(0.0, cost["p90"] - ci)]], fmt="o",
                    color=color,
                    alpha=0.9 if on else 0.25, ms=6 if on else 3, capsize=2, lw=0.8)
        if on:
            ax.annotate(f"{r['candidate'].label}\n{r['candidate'].zone}", (ti, ci), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    if cfg.planner.deadline_h is not None:
        ax.axvline(cfg.planner.deadline_h, color="red", ls="--", lw=1, label="deadline")
    if cfg.planner.budget_usd is not None:
        ax.axhline(cfg.planner.budget_usd, color="purple", ls=":", lw=1, label="budget")
    ax.plot([], [], "o", color="tab:orange", label="transient")
    ax.plot([], [], "o", color="tab:blue", label="on-demand")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("time to result, hours (median; bars: 10th–90th percentile)")
    ax.set_ylabel("cost, USD (median; bars: 10th–90th percentile)")
    ax.set_title(f"{cfg.name}: simulated time vs cost ({cfg.sim.repeats} runs per cluster, "
                 f"prices {cfg.pricing.name}); labelled: Pareto-optimal", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    cols = ["gpu", "workers", "transient", "zone", "sync", "hourly_usd", "mean_wall_time_s",
            "mean_cost_usd", "mean_revocations", "p_complete", "p_deadline", "final_accuracy"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*cols, "wall_p10", "wall_p90", "cost_p10", "cost_p90"])
        for r in rows:
            writer.writerow([r.get(k, "") for k in cols] + [
                r["wall_time_s"]["p10"], r["wall_time_s"]["p90"], r["cost_usd"]["p10"],
                r["cost_usd"]["p90"]])


def parse_args(argv: list[str]) -> list[str]:
    """Command-line arguments → Hydra overrides (shorthands mapped to ``planner.*``)."""
    out = []
    for arg in argv:
        key = arg.split("=", 1)[0]
        out.append(f"planner.{arg}" if key in SHORTHANDS else arg)
    return out


def plan_experiment(overrides: list[str], out_dir: Path | None = None
                    ) -> tuple[list[dict[str, Any]], Path]:
    """Compose, search, print, write the CSV and the plot; returns (ranked rows, out dir)."""
    from orchestrator.config.validation import validate
    from orchestrator.simulate.validate import compose

    cfg = compose(overrides)
    validate(cfg)
    rows = evaluate(cfg)
    ranked = rank(rows, cfg)
    out = out_dir or Path("outputs") / "plan" / cfg.name / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    print_table(ranked, cfg, len(rows))
    write_csv(ranked, out / "plan.csv")
    if rows:
        pareto_plot(rows, cfg, out / "pareto.png")
    print(f"plot and table: {out}/pareto.png, {out}/plan.csv")
    return ranked, out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    try:
        plan_experiment(parse_args(args))
    except ConfigError as err:
        print(err.line(), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    except Exception as ex:  # Hydra/OmegaConf errors: one line naming the field
        from orchestrator.config.hydra_errors import config_error_from_hydra

        err = config_error_from_hydra(ex)
        if err is None:
            raise
        print(err.line(), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
