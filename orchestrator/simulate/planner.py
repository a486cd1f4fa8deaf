"""The planner: which cluster to rent for this experiment, before paying for any.

``python -m orchestrator.plan +experiment=NAME deadline_h=1 budget_usd=5 [objective=cost]``
(``deadline_h``, ``budget_usd``, ``objective`` are shorthands of ``planner.*``; every other
argument is a Hydra override of the experiment, e.g. ``pricing=papers_2019``).

For every candidate (GPU types the catalog offers and the speed model knows × worker counts ×
transient or on-demand × zones × sync schedules × parameter servers: the experiment's count, and
when nothing meets the limits with it, one more where the workers could outrun it;
``planner.parameter_servers`` lists them instead)
the run is simulated ``planner.repeats`` times (more, up to ``planner.max_repeats``, until
P(deadline) is known to ``planner.p_precision``), each run drawing its revocations *and* how
far the speed model is off on that GPU (its held-out error: a GPU it was not fitted on is an
extrapolation, marked †). With a deadline, configurations less likely than
``planner.min_p_deadline`` (0.9) to meet it are dropped (the header says so); the rest are
ranked by the objective. A lone transient worker whose policy cannot survive its first
revocation (shrink) is planned with ``replace`` and shown so. Bands cover every run: a
run that fails never gives a result ("never"), and the share that completes is its own column.
The time-vs-cost plot (Pareto-optimal candidates labelled) and the table as CSV go to
``outputs/plan/<name>/<time>/``. Figures are said to what is known: a share every run met as
its Wilson bound ("≥ 98%", never "100%"), accuracy only where measured runs support it (with
their source), the examples each answer trains, lifetimes borrowed from other GPUs named. After
the table, the dry-run command of the top answer; when nothing meets the limits, the limit that
binds (the parameter servers' capacity, a deadline below the fastest run, the budget) and the
nearest configurations; a job with nothing to plan (no GPU speed figure: a CPU-only job) exits
2 saying why.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.simulate import Objective, PlannerConfig
from orchestrator.simulate.band import (
    simulate_many,
    summarize_runs,
    wilson_bounds,
    wilson_halfwidth,
)
from orchestrator.simulate.models import NoModelError, SimModels
from orchestrator.simulate.planner_candidates import Candidate, candidates, configure
from orchestrator.simulate.planner_misses import nearest_misses, nothing_to_plan
from orchestrator.simulate.planner_report import (
    dry_run_command,
    pareto_plot,
    print_table,
    samples_of,
    supported,
    write_csv,
)

if TYPE_CHECKING:
    from orchestrator.plan import RunPlan


#: ``key=value`` shorthands accepted on the command line for ``planner.key=value``.
SHORTHANDS = ("deadline_h", "budget_usd", "objective")


#: The first runs of a candidate, as a share of ``planner.repeats``: a candidate they already
#: rule out of the table (:func:`cannot_rank`) is not simulated further (200 → 50 runs).
SCREEN_SHARE = 0.25

#: z of the interval that rules a candidate out of the table before P is known to
#: ``planner.p_precision``: 3σ (99.7 %), wider than the 95 % one P is printed with, so a row
#: that a full refinement would rank is not dropped early by chance.
OUT_Z = 3.0


def cannot_rank(dist: dict[str, Any], runs: list[dict[str, Any]], p: PlannerConfig) -> bool:
    """Whether ``runs`` already show, at :data:`OUT_Z`, that the candidate misses the limits
    :func:`rank` applies: P(deadline)'s upper bound under ``planner.min_p_deadline``, or the
    mean cost's lower bound over ``planner.budget_usd``. Such a row is never shown, so refining
    its P (up to ``planner.max_repeats`` runs) would buy nothing the answer prints."""
    n = len(runs)
    if (p.deadline_h is not None and "p_deadline" in dist
            and wilson_bounds(dist["p_deadline"], n, OUT_Z)[1] < p.min_p_deadline):
        return True
    if p.budget_usd is not None and n > 1:
        sd = statistics.stdev(s["cost_usd"] for s in runs)
        return dist["mean_cost_usd"] - OUT_Z * sd / math.sqrt(n) > p.budget_usd
    return False


def simulate_candidate(run_cfg: ExperimentConfig, plan: RunPlan, models: SimModels,
                       deadline_s: float | None, p: PlannerConfig, prune: bool = True
                       ) -> list[dict[str, Any]]:
    """``planner.repeats`` runs, then more (doubling, up to ``planner.max_repeats``) while the
    95 % interval of P(deadline) or P(complete) is wider than ``±planner.p_precision``, unless
    the runs so far (the first :data:`SCREEN_SHARE` of ``repeats`` already) rule the candidate
    out of the table (:func:`cannot_rank`): the rows shown are the ones a full refinement
    shows, from the same seeds (``prune`` False: every candidate refined, the reference)."""
    repeats = max(1, p.repeats)
    runs = simulate_many(run_cfg, plan, max(1, round(repeats * SCREEN_SHARE)) if prune
                         else repeats, models)
    if len(runs) < repeats and not cannot_rank(summarize_runs(runs, deadline_s), runs, p):
        runs += simulate_many(run_cfg, plan, repeats - len(runs), models, first=len(runs))
    while len(runs) < p.max_repeats:
        dist = summarize_runs(runs, deadline_s)
        share = dist["p_deadline"] if deadline_s is not None else dist["p_complete"]
        if wilson_halfwidth(share, len(runs)) <= p.p_precision or (
                prune and cannot_rank(dist, runs, p)):
            break
        more = min(len(runs), p.max_repeats - len(runs))
        runs += simulate_many(run_cfg, plan, more, models, first=len(runs))
    return runs


def _simulate_one(cfg: ExperimentConfig, c: Candidate, models: SimModels,
                  deadline_s: float | None, prune: bool
                  ) -> tuple[ExperimentConfig, RunPlan, list[dict[str, Any]]] | None:
    """Candidate ``c``'s config, plan and runs; None when it is invalid (left out)."""
    from orchestrator.config.validation import validate
    from orchestrator.plan import make_plan

    run_cfg = configure(cfg, c)
    try:
        validate(run_cfg)
        plan = make_plan(run_cfg)
        return run_cfg, plan, simulate_candidate(run_cfg, plan, models, deadline_s,
                                                 cfg.planner, prune)
    except (ConfigError, NoModelError):
        return None


_JOB: tuple[Any, ...] = ()  # a worker process's (cfg, candidates, models, deadline_s, prune)


def _start_worker(job: tuple[Any, ...]) -> None:
    import signal

    global _JOB
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent ends the pool
    _JOB = job


def _simulate_index(i: int) -> tuple[ExperimentConfig, RunPlan, list[dict[str, Any]]] | None:
    cfg, cands, models, deadline_s, prune = _JOB
    return _simulate_one(cfg, cands[i], models, deadline_s, prune)


def default_processes() -> int:
    """Worker processes of a search: one per CPU this process may use."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def simulated(cfg: ExperimentConfig, cands: list[Candidate], models: SimModels,
              deadline_s: float | None, prune: bool = True, processes: int | None = None
              ) -> Iterator[tuple[ExperimentConfig, RunPlan, list[dict[str, Any]]] | None]:
    """:func:`_simulate_one` of each candidate, in order, over ``processes`` (None: one per
    CPU this process may use) forked worker processes: the candidates are independent and
    seeded, so the rows are the same as one process's. Ctrl-C ends the workers with the
    parent (they ignore SIGINT and leave no traceback of their own)."""
    import multiprocessing

    processes = min(default_processes() if processes is None else processes, len(cands))
    if (processes <= 1 or "fork" not in multiprocessing.get_all_start_methods()
            or multiprocessing.current_process().daemon):  # a pool's worker has no children
        for c in cands:
            yield _simulate_one(cfg, c, models, deadline_s, prune)
        return
    job = (cfg, cands, models, deadline_s, prune)
    with multiprocessing.get_context("fork").Pool(processes, _start_worker, (job,)) as pool:
        yield from pool.imap(_simulate_index, range(len(cands)))


def evaluate(cfg: ExperimentConfig, models: SimModels | None = None, *, prune: bool = True,
             processes: int | None = None, more_ps: bool = False) -> list[dict[str, Any]]:
    """Simulate every candidate; one row per candidate (invalid ones are left out). GPU
    calibrations of this job in the cache replace the speed model's figure for their GPU.
    ``prune``, ``processes``: see :func:`simulate_candidate`, :func:`simulated` (False, 1: the
    unoptimised reference the tests compare the answer with). When nothing meets the limits
    with the experiment's parameter servers (and ``planner.parameter_servers`` is not set),
    the search is run again with one more PS where the workers could outrun them
    (``more_ps``): the answer a tight deadline needs, without doubling every question's
    search. When nothing meets the limits still, every row is refined (the nearest misses
    print their P)."""
    from orchestrator.feedback import Feedback, plural
    from orchestrator.simulate.calibrate import with_gpu_calibrations

    models = models or with_gpu_calibrations(SimModels.load(), cfg)
    deadline_s = None if cfg.planner.deadline_h is None else cfg.planner.deadline_h * 3600
    rows = []
    cands = candidates(cfg, models, more_ps)
    doing = f"simulating {plural(len(cands), 'configuration')}" + (
        "" if prune else ", each refined")
    with Feedback(doing, len(cands)) as feedback:  # minutes for a wide question: say so
        for c, done in zip(cands, simulated(cfg, cands, models, deadline_s, prune, processes),
                           strict=True):
            feedback.advance(note=f"{c.label} {c.zone}" + (
                f" {c.sync_label}" if c.bsp_fraction is not None else ""))
            if done is None:  # invalid (ConfigError, NoModelError): left out
                continue
            run_cfg, plan, runs = done
            error = models.step_time_error(cfg.job.hparam_set, c.gpu)
            policy = str(run_cfg.cluster.recovery.on_revocation)
            rows.append({"candidate": c, "gpu": c.gpu, "workers": c.workers,
                         "transient": c.transient, "zone": c.zone, "sync": c.sync_label,
                         "recovery": policy,
                         "recovery_changed": policy != str(cfg.cluster.recovery.on_revocation),
                         "hourly_usd": plan.hourly_usd, "speed_basis": error["basis"],
                         "speed_sigma_log": error["sigma_log"],
                         "extrapolated": models.extrapolated(cfg.job.hparam_set, c.gpu),
                         "speed_supported": models.supported(cfg.job.hparam_set, c.gpu),
                         **summarize_runs(runs, deadline_s)})
    if rows and not rank(rows, cfg):
        if not more_ps and not cfg.planner.parameter_servers:  # one more PS, where it helps
            return evaluate(cfg, models, prune=False, processes=processes, more_ps=True)
        if prune:  # the nearest misses print P: all refined
            return evaluate(cfg, models, prune=False, processes=processes, more_ps=more_ps)
    return rows


def rank(rows: list[dict[str, Any]], cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Rows meeting the budget and, with a deadline, likely enough to meet it
    (``planner.min_p_deadline``), best first by ``planner.objective``; a row whose speed
    nothing supports (:func:`supported`) after every row whose speed is supported, never the
    answer while another exists."""
    p = cfg.planner
    ok = [r for r in rows if r["p_complete"] > 0
          and (p.budget_usd is None or r["mean_cost_usd"] <= p.budget_usd)
          and (p.deadline_h is None or r.get("p_deadline", 0) >= max(p.min_p_deadline, 1e-9))]
    keys = {
        Objective.cost: lambda r: (r["mean_cost_usd"], r["mean_wall_time_s"]),
        Objective.time: lambda r: (r["mean_wall_time_s"], r["mean_cost_usd"]),
        Objective.deadline: lambda r: (-r.get("p_deadline", 0), r["mean_cost_usd"]),
    }
    return sorted(ok, key=lambda r: (not supported(r), keys[Objective(p.objective)](r)))


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
    if not rows:
        raise nothing_to_plan(cfg)
    ranked = rank(rows, cfg)
    for r in ranked:
        r["samples"] = samples_of(cfg, r)
    out = out_dir or Path("outputs") / "plan" / cfg.name / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    print_table(ranked, cfg, len(rows))
    own = cfg.cluster.parameter_servers
    if not cfg.planner.parameter_servers and any(
            r["candidate"].parameter_servers != own for r in rows):
        print(f"no configuration with cluster.parameter_servers={own} meets the limits: one "
              "PS more was tried where the workers could outrun them")
    if not ranked:
        print(nearest_misses(rows, cfg))
    else:
        print(f"dry run of #1: {dry_run_command(overrides, cfg, ranked[0])}")
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
    except KeyboardInterrupt:  # the search's worker processes end with this one
        print("interrupted: nothing was planned", file=sys.stderr)
        sys.exit(130)
    except Exception as ex:  # ConfigError or Hydra/OmegaConf errors: one line naming the field
        exit_on_config_error(ex, args)
