"""The planner: which cluster to rent for this experiment, before paying for any.

``python -m orchestrator.plan +experiment=NAME deadline_h=1 budget_usd=5 [objective=cost]``
(``deadline_h``, ``budget_usd``, ``objective`` are shorthands of ``planner.*``; every other
argument is a Hydra override of the experiment, e.g. ``pricing=papers_2019``).

For every candidate (GPU types the catalog offers and the speed model knows × worker counts ×
transient or on-demand × zones × sync schedules) the run is simulated ``planner.repeats`` times
(more, up to ``planner.max_repeats``, until P(deadline) is known to ``planner.p_precision``),
each run drawing its revocations *and* how far the speed model is off on that GPU (its held-out
error: a GPU it was not fitted on is an extrapolation, marked †). With a deadline, configurations
less likely than ``planner.min_p_deadline`` (0.9) to meet it are dropped (the header says so);
the rest are ranked by the objective. A lone transient worker whose policy cannot survive its
first revocation (shrink) is planned with ``replace`` and shown so. Bands cover every run: a
run that fails never gives a result ("never"), and the share that completes is its own column.
The time-vs-cost plot (Pareto-optimal candidates labelled) and the table as CSV go to
``outputs/plan/<name>/<time>/``.
"""

from __future__ import annotations

import copy
import csv
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import ExperimentConfig, Protocol, SyncPhase
from orchestrator.config.simulate import Objective, PlannerConfig
from orchestrator.config.transient import OnRevocation
from orchestrator.simulate.band import draws, simulate_many, summarize_runs
from orchestrator.simulate.models import NoModelError, SimModels

if TYPE_CHECKING:
    from orchestrator.plan import RunPlan

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


def machine_type_for(cfg: ExperimentConfig, gpu: str) -> str | None:
    """The worker machine type a ``gpu`` host is rented as: the configured one when Compute
    Engine accepts ``gpu`` on it, else the cheapest catalog type that does (L4 → G2, A100 → A2;
    the check is provisioning/gce/body.py ``accelerators``, the dry run's own). None: no
    catalog machine type carries it, so the GPU cannot be rented from this catalog."""
    from provisioning.base import BadRequestError
    from provisioning.gce.body import accelerators

    def accepts(machine_type: str) -> bool:
        try:
            accelerators(machine_type, gpu)
        except BadRequestError:
            return False
        return True

    configured = cfg.cluster.worker_groups[0].machine_type
    if accepts(configured):
        return configured
    offers = cfg.pricing.machine_types
    fits = sorted((m for m in offers if accepts(m)),
                  key=lambda m: (offers[m].preemptible_usd_per_h, m))
    return fits[0] if fits else None


def rentable(cfg: ExperimentConfig, gpu: str) -> bool:
    """Whether the planner may answer ``gpu``: not retired by the priced cloud (K80 on today's
    GCE catalogue; the papers' 2019 catalogue keeps it) and carried by a catalog machine type."""
    from provisioning.catalog import retirement

    return retirement(cfg.pricing.name, gpu) is None and machine_type_for(cfg, gpu) is not None


def candidates(cfg: ExperimentConfig, models: SimModels) -> list[Candidate]:
    """The search space: rentable catalog GPUs with a speed model (or ``planner.gpus``) ×
    workers × transient × zones (transient only: on-demand VMs are not revoked, one zone
    suffices) × schedules."""
    known = models.params["step_time_s"].get(cfg.job.hparam_set, {})
    gpus = [g for g in (list(cfg.planner.gpus) or [g for g in cfg.pricing.gpus if g in known])
            if g in cfg.pricing.gpus and rentable(cfg, g)]
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
    """The experiment on candidate ``c``'s cluster (a copy). A lone transient worker under
    ``shrink`` would end the run at its first revocation: it is planned with ``replace``."""
    from orchestrator.plan import lone_worker_cannot_survive, plan_hosts

    out = copy.deepcopy(cfg)
    out.provider.name = "sim"
    out.cluster.workers = c.workers
    group = out.cluster.worker_groups[0]
    group.gpu, group.zone, group.transient, group.count = c.gpu, c.zone, c.transient, c.workers
    group.machine_type = machine_type_for(cfg, c.gpu) or group.machine_type
    out.cluster.worker_groups = [group]
    out.cluster.ps_zone = c.zone
    if c.bsp_fraction is not None:
        out.sync.switch_order, out.sync.fractions, out.sync.phase_hparams = "", [], []
        phases = [(Protocol.bsp, c.bsp_fraction), (Protocol.asp, 1 - c.bsp_fraction)]
        out.sync.phases = [SyncPhase(p, round(f, 6), {}) for p, f in phases if f > 0]
    if lone_worker_cannot_survive(out, plan_hosts(out)):
        out.cluster.recovery.on_revocation = OnRevocation.replace
    return out


def wilson_halfwidth(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of the Wilson score interval of a proportion ``p`` seen in ``n`` runs (never
    0, even at p = 0 or 1: 100 runs out of 100 do not make a certainty)."""
    denom = 1 + z * z / n
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom


def simulate_candidate(run_cfg: ExperimentConfig, plan: RunPlan, models: SimModels,
                       deadline_s: float | None, p: PlannerConfig) -> list[dict[str, Any]]:
    """``planner.repeats`` runs, then more (doubling, up to ``planner.max_repeats``) while the
    95 % interval of P(deadline) or P(complete) is wider than ``±planner.p_precision``."""
    runs = simulate_many(run_cfg, plan, max(1, p.repeats), models)
    while len(runs) < p.max_repeats:
        dist = summarize_runs(runs, deadline_s)
        share = dist["p_deadline"] if deadline_s is not None else dist["p_complete"]
        if wilson_halfwidth(share, len(runs)) <= p.p_precision:
            break
        more = min(len(runs), p.max_repeats - len(runs))
        runs += simulate_many(run_cfg, plan, more, models, first=len(runs))
    return runs


def evaluate(cfg: ExperimentConfig, models: SimModels | None = None) -> list[dict[str, Any]]:
    """Simulate every candidate; one row per candidate (invalid ones are left out). GPU
    calibrations of this job in the cache replace the speed model's figure for their GPU."""
    from orchestrator.config.validation import validate
    from orchestrator.plan import make_plan
    from orchestrator.simulate.calibrate import with_gpu_calibrations

    models = models or with_gpu_calibrations(SimModels.load(), cfg)
    deadline_s = None if cfg.planner.deadline_h is None else cfg.planner.deadline_h * 3600
    rows = []
    for c in candidates(cfg, models):
        run_cfg = configure(cfg, c)
        try:
            validate(run_cfg)
            plan = make_plan(run_cfg)
            runs = simulate_candidate(run_cfg, plan, models, deadline_s, cfg.planner)
            error = models.step_time_error(cfg.job.hparam_set, c.gpu)
        except (ConfigError, NoModelError):
            continue
        policy = str(run_cfg.cluster.recovery.on_revocation)
        rows.append({"candidate": c, "gpu": c.gpu, "workers": c.workers,
                     "transient": c.transient, "zone": c.zone, "sync": c.sync_label,
                     "recovery": policy,
                     "recovery_changed": policy != str(cfg.cluster.recovery.on_revocation),
                     "hourly_usd": plan.hourly_usd, "speed_basis": error["basis"],
                     "speed_sigma_log": error["sigma_log"],
                     "extrapolated": models.extrapolated(cfg.job.hparam_set, c.gpu),
                     **summarize_runs(runs, deadline_s)})
    return rows


def rank(rows: list[dict[str, Any]], cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Rows meeting the budget and, with a deadline, likely enough to meet it
    (``planner.min_p_deadline``), best first by ``planner.objective``."""
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


def _hours(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 3600:.2f}"


def _narrow(band: dict[str, float | None]) -> bool:
    """A time band under 2 % wide: with the speed error drawn per run, only a cap that is not
    drawn (the parameter server's capacity) holds a run's time that still."""
    return band["p10"] is not None and band["p90"] is not None and band["p90"] <= 1.02 * band["p10"]


def _spread(sigma_log: float) -> str:
    """A log-normal spread as its 1σ factor: "×/÷1.49" = between 1.49× slower and faster."""
    return f"×/÷{math.exp(sigma_log):.2f}"


def header(cfg: ExperimentConfig, shown: int, total: int) -> str:
    """What the table answers: the limits (the minimum P(deadline) included), the ranking and
    how many runs stand behind each row."""
    p = cfg.planner
    limits = []
    if p.deadline_h is not None:
        limits.append(f"deadline {p.deadline_h:g} h with P ≥ {p.min_p_deadline:.0%}")
    if p.budget_usd is not None:
        limits.append(f"budget ${p.budget_usd:g} (mean cost)")
    runs = (f"{p.repeats}–{p.max_repeats} simulated runs each" if p.max_repeats > p.repeats
            else f"{p.repeats} simulated runs each")
    return (f"Plan: {cfg.name}, {shown} of {total} configurations meet "
            f"{', '.join(limits) or 'no limit'}; ranked by {p.objective} ({runs}, "
            f"{draws(cfg)}; prices {cfg.pricing.name})")


def print_table(ranked: list[dict[str, Any]], cfg: ExperimentConfig, total: int,
                console: Any = None) -> None:
    """The ranked table (``planner.top`` rows) and its notes: the marks and what bands cover."""
    from rich.table import Table

    from orchestrator.display import make_console

    p = cfg.planner
    console = console or make_console()
    table = Table(title=header(cfg, len(ranked), total), title_justify="left")
    for col in ("#", "cluster", "zone", "sync", "on revocation", "P(deadline)", "completes",
                "time h (p10–p90)", "cost $ (mean)", "cost $ (p10–p90)", "revocations",
                "accuracy"):
        table.add_column(col, justify="left" if col in ("cluster", "zone", "sync",
                                                        "on revocation") else "right")
    shown = ranked[:p.top]
    for i, r in enumerate(shown, 1):
        c = r["candidate"]
        w, cost = r["time_to_result_s"], r["cost_usd"]
        table.add_row(str(i), c.label + (" †" if r["extrapolated"] else ""), c.zone,
                      c.sync_label, r["recovery"] + (" *" if r["recovery_changed"] else ""),
                      "-" if "p_deadline" not in r else f"{r['p_deadline']:.0%}",
                      f"{r['p_complete']:.0%}", f"{_hours(w['p10'])}–{_hours(w['p90'])}",
                      f"{r['mean_cost_usd']:.2f}", f"{cost['p10']:.2f}–{cost['p90']:.2f}",
                      f"{r['mean_revocations']:.2f}",
                      "-" if r["final_accuracy"] is None else f"{r['final_accuracy']:.4f}")
    if not console.is_terminal:  # a file or a pipe: whole rows, no zone cut to "europe-west4…"
        from rich.measure import Measurement

        need = Measurement.get(console, console.options.update(width=1000), table).maximum
        console.width = max(console.width, need)
    console.print(table)
    notes = ["time: to the result over every run (\"never\": the share that fails, see "
             "completes); cost: what a run costs, completed or failed"]
    extrapolated = sorted({(r["gpu"], r["speed_sigma_log"]) for r in shown if r["extrapolated"]})
    if extrapolated:
        spread = ", ".join(f"{g} {_spread(s)}" for g, s in extrapolated)
        notes.append(f"† step time extrapolated by TFLOPS to a GPU the speed model was not "
                     f"fitted on (its held-out error, 1σ: {spread}); a calibration on that GPU "
                     f"replaces it: python -m orchestrator.simulate.calibrate "
                     f"+experiment={cfg.name} [--gpu G --step-s S]")
    narrow = [r for r in shown if _narrow(r["time_to_result_s"])]
    if narrow:
        n = cfg.cluster.parameter_servers
        cap = SimModels.load().ps_capacity(cfg.job.hparam_set, n)
        serve = "one parameter server serves" if n == 1 else f"{n} parameter servers serve"
        notes.append(f"time bands of almost no width ({narrow[0]['candidate'].label}): the "
                     f"cluster outruns what {serve} ({cap:.0f} steps/s for this job, "
                     "CM-DARE's measured saturation); "
                     "no error is drawn for that limit, so the band is only as sure as it is")
    if any(r["recovery_changed"] for r in shown):
        notes.append(f"* planned with replace: on_revocation="
                     f"{cfg.cluster.recovery.on_revocation} would end a lone transient "
                     "worker's run at its first revocation")
    for note in notes:
        console.print(note, highlight=False)


def pareto_plot(rows: list[dict[str, Any]], cfg: ExperimentConfig, path: Path) -> Path:
    """Median time vs median cost, p10–p90 error bars, Pareto-optimal candidates labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from analysis.cost import pareto_mask

    rows = [r for r in rows if r["time_to_result_s"]["p50"] is not None]  # most runs fail
    never = 2 * max([r["time_to_result_s"]["p90"] or 0.0 for r in rows] + [1.0])  # bar end
    t = [r["time_to_result_s"]["p50"] / 3600 for r in rows]
    c = [r["cost_usd"]["p50"] for r in rows]
    best = pareto_mask(t, c)
    fig, ax = plt.subplots(figsize=(9, 6))
    for r, ti, ci, on in zip(rows, t, c, best, strict=True):
        w, cost = r["time_to_result_s"], r["cost_usd"]
        color = "tab:orange" if r["transient"] else "tab:blue"
        p90 = (w["p90"] if w["p90"] is not None else never) / 3600
        ax.errorbar(ti, ci, xerr=[[max(0.0, ti - w["p10"] / 3600)], [max(0.0, p90 - ti)]],
                    yerr=[[max(0.0, ci - cost["p10"])], [max(0.0, cost["p90"] - ci)]],
                    fmt="o", color=color, mfc="white" if r["extrapolated"] else color,
                    alpha=0.9 if on else 0.25, ms=6 if on else 3, capsize=2, lw=0.8)
        if on:
            mark = " †" if r["extrapolated"] else ""
            ax.annotate(f"{r['candidate'].label}{mark}\n{r['candidate'].zone}", (ti, ci),
                        fontsize=7, xytext=(4, 4), textcoords="offset points")
    if cfg.planner.deadline_h is not None:
        ax.axvline(cfg.planner.deadline_h, color="red", ls="--", lw=1, label="deadline")
    if cfg.planner.budget_usd is not None:
        ax.axhline(cfg.planner.budget_usd, color="purple", ls=":", lw=1, label="budget")
    ax.plot([], [], "o", color="tab:orange", label="transient")
    ax.plot([], [], "o", color="tab:blue", label="on-demand")
    if any(r["extrapolated"] for r in rows):
        ax.plot([], [], "o", color="grey", mfc="white",
                label="† step time extrapolated (GPU not in the speed model's fit)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("time to result, hours (median; bars: 10th–90th percentile of every run, "
                  "a failed run never finishing)")
    ax.set_ylabel("cost, USD (median; bars: 10th–90th percentile)")
    ax.set_title(f"{cfg.name}: simulated time vs cost (≥ {cfg.planner.repeats} runs per cluster, "
                 f"prices {cfg.pricing.name}); labelled: Pareto-optimal", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The ranked table; time bands over every run (empty = never), ``wall_*`` over the
    completed runs only (``band_share`` of them)."""
    cols = ["gpu", "workers", "transient", "zone", "sync", "recovery", "hourly_usd", "runs",
            "p_complete", "p_deadline", "mean_wall_time_s", "mean_cost_usd", "mean_revocations",
            "final_accuracy", "speed_basis", "speed_sigma_log", "extrapolated", "band_share"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*cols, "time_p10", "time_p50", "time_p90", "wall_completed_p10",
                         "wall_completed_p90", "cost_p10", "cost_p90"])
        for r in rows:
            t = r["time_to_result_s"]
            writer.writerow([r.get(k, "") for k in cols] + [
                "" if t[k] is None else t[k] for k in ("p10", "p50", "p90")] + [
                r["wall_time_s"]["p10"], r["wall_time_s"]["p90"], r["cost_usd"]["p10"],
                r["cost_usd"]["p90"]])


def parse_args(argv: list[str]) -> list[str]:
    """Command-line arguments → Hydra overrides (shorthands mapped to ``planner.*``)."""
    out = []
    for arg in argv:
        key = arg.split("=", 1)[0]
        out.append(f"planner.{arg}" if key in SHORTHANDS else arg)
    return out


def nearest_misses(rows: list[dict[str, Any]], cfg: ExperimentConfig, n: int = 3) -> str:
    """When nothing meets the limits: the candidates closest to them, so the user sees what a
    looser deadline or budget would buy. Closest = short of the minimum P(deadline) by the
    least, then over the budget by the least (the probability first, as in the ranking); a
    question without a deadline shows the share of runs that complete, not a P(deadline)."""
    p = cfg.planner

    def key(r: dict[str, Any]) -> tuple[float, ...]:
        short = 0.0 if p.deadline_h is None else max(0.0, p.min_p_deadline - r["p_deadline"])
        over = 0.0 if p.budget_usd is None else max(0.0, r["mean_cost_usd"] / p.budget_usd - 1)
        return (r["p_complete"] == 0, short, over, -r["p_complete"], r["mean_cost_usd"])

    def odds(r: dict[str, Any]) -> str:
        return (f"completes {r['p_complete']:.0%}" if p.deadline_h is None
                else f"P(deadline) {r['p_deadline']:.0%}")

    parts = [f"{r['candidate'].label}{' †' if r['extrapolated'] else ''} in "
             f"{r['candidate'].zone}: {odds(r)}, mean ${r['mean_cost_usd']:.2f}, "
             f"time {_hours(r['time_to_result_s']['p50'])} h (median)"
             for r in sorted(rows, key=key)[:n]]
    return "nothing meets the limits; closest: " + "; ".join(parts)


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
    if not ranked and rows:
        print(nearest_misses(rows, cfg))
    write_csv(ranked, out / "plan.csv")
    if rows:
        pareto_plot(rows, cfg, out / "pareto.png")
    print(f"plot and table: {out}/pareto.png, {out}/plan.csv")
    return ranked, out


def as_typed(err: ConfigError, args: list[str]) -> ConfigError:
    """The error naming the field as the user typed it: ``deadline_h``, not the
    ``planner.deadline_h`` its shorthand stands for."""
    short = err.path.removeprefix("planner.")
    if short in SHORTHANDS and any(a.split("=", 1)[0] == short for a in args):
        err.path = short
    return err


def exit_on_config_error(ex: Exception, args: list[str]) -> NoReturn:
    """A config error (ours or Hydra's) as one line naming the field as typed, exit code 2;
    anything else is raised again. Shared by the planner's and the reliability check's CLI."""
    from orchestrator.config.hydra_errors import config_error_from_hydra

    err = ex if isinstance(ex, ConfigError) else config_error_from_hydra(ex)
    if err is None:
        raise ex
    print(as_typed(err, args).line(), file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    if "--version" in args:
        from orchestrator.version import version_line

        print(version_line("orchestrator.plan"))
        return
    try:
        plan_experiment(parse_args(args))
    except Exception as ex:  # ConfigError or Hydra/OmegaConf errors: one line naming the field
        exit_on_config_error(ex, args)
