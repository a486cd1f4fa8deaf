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

import copy
import csv
import math
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import ExperimentConfig, Protocol, SyncPhase, schedule_phases
from orchestrator.config.simulate import Objective, PlannerConfig
from orchestrator.config.transient import OnRevocation
from orchestrator.simulate.band import (
    draws,
    share_text,
    simulate_many,
    summarize_runs,
    wilson_bounds,
    wilson_halfwidth,
)
from orchestrator.simulate.models import NoModelError, SimModels
from provisioning.gce.billing import LIVE_SOURCE

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
    parameter_servers: int = 1

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
        ps = "" if self.parameter_servers == 1 else f", {self.parameter_servers} PS"
        return f"{self.workers}× {self.gpu} {kind}{ps}"


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


#: How fast, in σ of the speed model's error, a cluster's workers are taken to run when the
#: default ``planner.parameter_servers`` asks whether they could outrun their parameter
#: servers: 2σ (a run in ~40 draws that fast), so a cluster that saturates them only in its
#: fast runs is tried with one more PS too.
FAST_SIGMAS = 2.0


def has_asp(cfg: ExperimentConfig, bsp_fraction: float | None) -> bool:
    """Whether the run has an ASP phase: only ASP's rate is capped by the parameter servers
    (a BSP step waits for the slowest worker and the aggregation instead)."""
    if bsp_fraction is not None:
        return bsp_fraction < 1
    phases = schedule_phases(cfg.sync)
    return (any(ph.protocol == Protocol.asp for ph in phases) if phases
            else cfg.sync.protocol == Protocol.asp)


def could_outrun(cfg: ExperimentConfig, models: SimModels, gpu: str, workers: int,
                 bsp_fraction: float | None, parameter_servers: int) -> bool:
    """Whether ``workers`` ASP workers on ``gpu`` could step faster than ``parameter_servers``
    PS serve (``SimModels.ps_capacity``) in a run whose speed draw is :data:`FAST_SIGMAS` fast:
    only then can another PS shorten the run, else it adds cost and nothing else. False when
    the speed model has no capacity or step-time figure for the job."""
    hparam = cfg.job.hparam_set
    if hparam not in models.params.get("parameters", {}) or not has_asp(cfg, bsp_fraction):
        return False
    try:
        step_s = models.step_time_s(hparam, gpu, cfg.job.batch_size)
    except NoModelError:
        return False
    fast_s = step_s * math.exp(-FAST_SIGMAS * models.step_time_error(hparam, gpu)["sigma_log"])
    return workers * models.efficiency(gpu) / fast_s > models.ps_capacity(
        hparam, parameter_servers)


def candidates(cfg: ExperimentConfig, models: SimModels,
               more_ps: bool = False) -> list[Candidate]:
    """The search space: rentable catalog GPUs with a speed model (or ``planner.gpus``) ×
    workers × transient × zones (transient only: on-demand VMs are not revoked, one zone
    suffices) × schedules × parameter servers (``planner.parameter_servers``; by default the
    experiment's count and, with ``more_ps``, one more where :func:`could_outrun` says the
    workers could outrun it: elsewhere the extra PS only costs, so the search grows by the
    clusters it may help, at most twofold)."""
    known = models.params["step_time_s"].get(cfg.job.hparam_set, {})
    gpus = [g for g in (list(cfg.planner.gpus) or [g for g in cfg.pricing.gpus if g in known])
            if g in cfg.pricing.gpus and rentable(cfg, g)]
    fractions: list[float | None] = list(cfg.planner.bsp_fractions) or [None]
    own = cfg.cluster.parameter_servers
    out = []
    for gpu in gpus:
        for transient in cfg.planner.transient:
            zones = _zones(cfg, gpu) if transient else _zones(cfg, gpu)[:1]
            for zone in zones:
                for workers in cfg.planner.workers:
                    for fraction in fractions:
                        counts = list(cfg.planner.parameter_servers) or [own] + (
                            [own + 1] if more_ps
                            and could_outrun(cfg, models, gpu, workers, fraction, own) else [])
                        out += [Candidate(gpu, workers, transient, zone, fraction, ps)
                                for ps in counts]
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
    out.cluster.parameter_servers = c.parameter_servers
    if c.bsp_fraction is not None:
        out.sync.switch_order, out.sync.fractions, out.sync.phase_hparams = "", [], []
        phases = [(Protocol.bsp, c.bsp_fraction), (Protocol.asp, 1 - c.bsp_fraction)]
        out.sync.phases = [SyncPhase(p, round(f, 6), {}) for p, f in phases if f > 0]
    if lone_worker_cannot_survive(out, plan_hosts(out)):
        out.cluster.recovery.on_revocation = OnRevocation.replace
    return out


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


def supported(row: dict[str, Any]) -> bool:
    """Whether anything (a measurement, a calibration, the measured GPUs' range, a public
    throughput) supports the row's step time (``SimModels.supported``)."""
    return bool(row.get("speed_supported", (True, ""))[0])


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


def _hours(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 3600:.2f}"


def _narrow(band: dict[str, float | None]) -> bool:
    """A time band under 2 % wide: with the speed error drawn per run, only a cap that is not
    drawn (the parameter server's capacity) holds a run's time that still."""
    return band["p10"] is not None and band["p90"] is not None and band["p90"] <= 1.02 * band["p10"]


def _spread(sigma_log: float) -> str:
    """A log-normal spread as its 1σ factor: "×/÷1.49" = between 1.49× slower and faster."""
    return f"×/÷{math.exp(sigma_log):.2f}"


#: The GPU every measured accuracy was trained on: ICAC'19's and Sync-Switch's K80 workers.
ACCURACY_MEASURED_ON = "k80"

#: Which measured lifetimes ``sim.lifetimes`` names, as the planner's notes say them.
LIFETIME_DATA = {"cmdare": "CM-DARE's 2019–20", "icac19": "ICAC'19's February 2019"}


def measured_accuracy(r: dict[str, Any]) -> float | None:
    """A row's accuracy where measured runs support it: the papers' runs of the same setup on
    the GPU they trained on (K80). None elsewhere: ASP's staleness, and so its accuracy,
    follows the GPUs' speed, and a K80 figure copied to a T4 would be a guess."""
    if r.get("final_accuracy") is None or r["gpu"] != ACCURACY_MEASURED_ON:
        return None
    return float(r["final_accuracy"])


def samples_of(cfg: ExperimentConfig, r: dict[str, Any]) -> int:
    """Examples the row's run trains at its planned global steps (the row's ``samples`` when
    it has them): a switch schedule's budget trains more with more workers, ASP's does not."""
    if "samples" in r:
        return int(r["samples"])
    from orchestrator.plan import plan_phases, samples_trained

    run_cfg = configure(cfg, r["candidate"])
    return samples_trained(run_cfg.job.batch_size, r["workers"],
                           plan_phases(run_cfg, r["workers"]))


def precision_notes(shown: list[dict[str, Any]], cfg: ExperimentConfig) -> list[str]:
    """What the table's figures rest on: bounds where every (or no) run met it, where the
    accuracy comes from or why it is missing, the work each answer trains, and lifetimes
    borrowed from other GPUs."""
    notes = []
    shares = [(r[k], r["runs"]) for r in shown for k in ("p_deadline", "p_complete") if k in r]
    if any(round(p * n) in (0, n) for p, n in shares):
        low, high = min(n for _, n in shares), max(n for _, n in shares)
        notes.append("P(deadline), completes: shares of the row's simulated runs (runs per row: "
                     f"{low if low == high else f'{low}–{high}'}); "
                     "\"≥ x%\" (\"≤ x%\"): all (none) of them, said as the 95 % Wilson "
                     "bound for that many runs, since no number of runs shows a certainty")
    sources = sorted({r["accuracy_source"] for r in shown
                      if measured_accuracy(r) is not None and r.get("accuracy_source")})
    if sources:
        notes.append(f"accuracy: the mean final test accuracy of measured runs of the same "
                     f"setup (workers, schedule, budget) on {ACCURACY_MEASURED_ON.upper()}, "
                     f"to 3 decimals: {'; '.join(sources)}")
    if any(measured_accuracy(r) is None for r in shown):
        same = sorted({f"{r['final_accuracy']:.3f} ({r['accuracy_source']})" for r in shown
                       if r.get("final_accuracy") is not None and r.get("accuracy_source")
                       and measured_accuracy(r) is None})
        also = f"; the same setup on K80: {'; '.join(same)}" if same else ""
        notes.append(f"accuracy -: no measured run supports it (the papers measured "
                     f"{ACCURACY_MEASURED_ON.upper()} workers only, ICAC'19 ASP 1–8 workers and "
                     f"Sync-Switch 8 and 16; not carried to other GPUs or setups{also})")
    counts = {samples_of(cfg, r) for r in shown}
    schedules = bool(schedule_phases(cfg.sync)) or any(
        r["candidate"].bsp_fraction is not None for r in shown)
    if len(counts) > 1 or schedules:
        b, batch = cfg.job.train_steps, cfg.job.batch_size
        notes.append(f"samples: examples trained by the planned global steps (an ASP step: one "
                     f"worker's batch of {batch}; a BSP step: all N workers'); a switch "
                     f"schedule's budget job.train_steps={b} is in BSP-equivalent steps, "
                     f"f·{b} BSP + (1−f)·{b}·N ASP = {b}·N·{batch} examples: fewer workers "
                     f"train fewer (ASP alone trains {b}·{batch} whatever N); compare equal "
                     "work before cost")
    lifetime = lifetime_note(shown, cfg)
    if lifetime:
        notes.append(lifetime)
    return notes


def lifetime_note(shown: list[dict[str, Any]], cfg: ExperimentConfig) -> str | None:
    """Whose lifetimes revoke the transient rows: the measured GPUs', and for a GPU nobody
    measured (T4, L4, A100) those borrowed, pooled (CloudLifetimes); None when no cloud
    revokes them (the experiment's own revocation model does)."""
    from orchestrator.config.transient import RevocationModel
    from provisioning.registry import provider_class

    if cfg.revocation.model != RevocationModel.none or not any(r["transient"] for r in shown):
        return None
    # the planner's candidates all run on the simulated cloud and no plan exists here: by name
    market = provider_class("sim").transient_market(cfg.pricing)
    data = SimModels.load().lifetime_models(str(cfg.sim.lifetimes))
    measured = sorted(data["gpus"])
    vms = sum(g.get("all", {}).get("vms", 0) for g in data["gpus"].values())
    borrowed = sorted({r["gpu"].upper() for r in shown
                       if r["transient"] and r["gpu"].upper() not in measured})
    said = (f"lifetimes: revocations drawn from {LIFETIME_DATA.get(str(cfg.sim.lifetimes), '')} "
            f"measured preemptible {', '.join(measured)} VMs ({vms} VMs, "
            f"sim.lifetimes={cfg.sim.lifetimes})")
    if market is not None and market.value != "preemptible":
        said += f", applied to today's {market.value.capitalize()} VMs"
    if borrowed:
        said += (f"; {', '.join(borrowed)}: nobody measured their lifetimes, borrowed from "
                 f"{', '.join(measured)} pooled")
    return said


def header(cfg: ExperimentConfig, shown: int, total: int,
           runs: list[int] | None = None) -> str:
    """What the table answers: the limits (the minimum P(deadline) included), the ranking and
    how many runs stand behind each row: the shown rows' own counts (``runs``; a candidate
    ruled out early rests on fewer, but is not shown), else what the settings allow."""
    p = cfg.planner
    limits = []
    if p.deadline_h is not None:
        limits.append(f"deadline {p.deadline_h:g} h with P ≥ {p.min_p_deadline:.0%}")
    if p.budget_usd is not None:
        limits.append(f"budget ${p.budget_usd:g} (mean cost)")
    if runs:
        low, high = min(runs), max(runs)
        said = f"{low:,}" if low == high else f"{low:,}–{high:,}"
        behind = f"{said} simulated runs per row"
    else:
        behind = (f"{p.repeats}–{p.max_repeats} simulated runs each" if p.max_repeats > p.repeats
                  else f"{p.repeats} simulated runs each")
    return (f"Plan: {cfg.name}, {shown} of {total} configurations meet "
            f"{', '.join(limits) or 'no limit'}; ranked by {p.objective} ({behind}, "
            f"{draws(cfg)}; prices {cfg.pricing.name} {cfg.pricing.date or 'undated'}"
            f"{' from ' + cfg.pricing.source if cfg.pricing.source == LIVE_SOURCE else ''})")


def print_table(ranked: list[dict[str, Any]], cfg: ExperimentConfig, total: int,
                console: Any = None) -> None:
    """The ranked table (``planner.top`` rows) and its notes: the marks and what bands cover."""
    from rich.table import Table

    from orchestrator.display import make_console

    p = cfg.planner
    console = console or make_console()
    table = Table(title=header(cfg, len(ranked), total, [r["runs"] for r in ranked]),
                  title_justify="left")
    for col in ("#", "cluster", "zone", "sync", "on revocation", "P(deadline)", "completes",
                "time h (p10–p90)", "cost $ (mean)", "cost $ (p10–p90)", "revocations",
                "samples", "accuracy"):
        table.add_column(col, justify="left" if col in ("cluster", "zone", "sync",
                                                        "on revocation") else "right")
    shown = ranked[:p.top]
    for i, r in enumerate(shown, 1):
        c = r["candidate"]
        w, cost = r["time_to_result_s"], r["cost_usd"]
        if not supported(r):  # no figure nothing supports: the row, its reason in the notes
            table.add_row(str(i), c.label + " ‡", c.zone, c.sync_label, r["recovery"],
                          *["‡"] * 2, *["—"] * 4, f"{samples_of(cfg, r) / 1e6:.3g}M", "-")
            continue
        table.add_row(str(i), c.label + (" †" if r["extrapolated"] else ""), c.zone,
                      c.sync_label, r["recovery"] + (" *" if r["recovery_changed"] else ""),
                      "-" if "p_deadline" not in r else share_text(r["p_deadline"], r["runs"]),
                      share_text(r["p_complete"], r["runs"]),
                      f"{_hours(w['p10'])}–{_hours(w['p90'])}",
                      f"{r['mean_cost_usd']:.2f}", f"{cost['p10']:.2f}–{cost['p90']:.2f}",
                      f"{r['mean_revocations']:.2f}", f"{samples_of(cfg, r) / 1e6:.3g}M",
                      "-" if measured_accuracy(r) is None else f"{measured_accuracy(r):.3f}")
    if not console.is_terminal:  # a file or a pipe: whole rows, no zone cut to "europe-west4…"
        from rich.measure import Measurement

        need = Measurement.get(console, console.options.update(width=1000), table).maximum
        console.width = max(console.width, need)
    console.print(table)
    notes = ["time: to the result over every run (\"never\": the share that fails, see "
             "completes); cost: what a run costs, completed or failed"]
    unsupported = sorted({(r["gpu"], r["speed_supported"][1]) for r in shown
                          if not supported(r)})
    for gpu, why in unsupported:
        notes.append(f"‡ {gpu}: no figure shown: {why}; ranked after every supported row. A "
                     f"measured step time replaces the estimate: python -m "
                     f"orchestrator.simulate.calibrate +experiment={cfg.name} --gpu {gpu} "
                     "--step-s SECONDS")
    extrapolated = sorted({(r["gpu"], r["speed_sigma_log"]) for r in shown
                           if r["extrapolated"] and supported(r)})
    if extrapolated:
        spread = ", ".join(f"{g} {_spread(s)}" for g, s in extrapolated)
        notes.append(f"† step time scaled by TFLOPS and memory bandwidth to a GPU no paper "
                     f"measured (its held-out error, 1σ: {spread}); a calibration on that GPU "
                     f"replaces it: python -m orchestrator.simulate.calibrate "
                     f"+experiment={cfg.name} [--gpu G --step-s S]")
    narrow = [r for r in shown if _narrow(r["time_to_result_s"])]
    if narrow:
        n = narrow[0]["candidate"].parameter_servers
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
    notes += precision_notes(shown, cfg)
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
    least = min((r["runs"] for r in rows), default=cfg.planner.repeats)  # a ruled-out one: fewer
    ax.set_title(f"{cfg.name}: simulated time vs cost (≥ {least} runs per cluster, "
                 f"prices {cfg.pricing.name}); labelled: Pareto-optimal", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The ranked table; time bands over every run (empty = never), ``wall_*`` over the
    completed runs only (``band_share`` of them); ``samples`` (set by plan_experiment) as in
    the table; ``final_accuracy`` only where measured (:func:`measured_accuracy`), with its
    ``accuracy_source``."""
    cols = ["gpu", "workers", "parameter_servers", "transient", "zone", "sync", "recovery",
            "hourly_usd", "runs", "p_complete", "p_deadline", "mean_wall_time_s",
            "mean_cost_usd", "mean_revocations", "samples", "final_accuracy", "accuracy_source",
            "speed_basis", "speed_sigma_log", "extrapolated", "band_share"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*cols, "time_p10", "time_p50", "time_p90", "wall_completed_p10",
                         "wall_completed_p90", "cost_p10", "cost_p90"])
        for r in rows:
            t = r["time_to_result_s"]
            measured = measured_accuracy(r)
            shown = {**r, "parameter_servers": r["candidate"].parameter_servers,
                     "final_accuracy": "" if measured is None else measured,
                     "accuracy_source": "" if measured is None else r.get("accuracy_source")}
            writer.writerow([shown.get(k, "") for k in cols] + [
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


def answer_overrides(cfg: ExperimentConfig, r: dict[str, Any]) -> list[str]:
    """The Hydra overrides that make the experiment row ``r``'s cluster, as :func:`configure`
    plans it: GPU, workers, zone, machine type, transient, parameter servers, the recovery
    the row was planned with, and its schedule where the row sets one."""
    run_cfg = configure(cfg, r["candidate"])
    cluster, group = run_cfg.cluster, run_cfg.cluster.worker_groups[0]
    transient = str(group.transient).lower()
    if len(cfg.cluster.worker_groups) == 1:
        out = [f"cluster.workers={group.count}", f"cluster.worker_groups.0.gpu={group.gpu}",
               f"cluster.worker_groups.0.zone={group.zone}",
               f"cluster.worker_groups.0.machine_type={group.machine_type}",
               f"cluster.worker_groups.0.transient={transient}"]
    else:  # one group replaces the experiment's several
        out = [f"cluster.workers={group.count}",
               f"cluster.worker_groups=[{{count:{group.count},gpu:{group.gpu},zone:{group.zone},"
               f"machine_type:{group.machine_type},transient:{transient}}}]"]
    out += [f"cluster.ps_zone={cluster.ps_zone}",
            f"cluster.parameter_servers={cluster.parameter_servers}"]
    if cluster.recovery.on_revocation != cfg.cluster.recovery.on_revocation:
        out.append(f"cluster.recovery.on_revocation={cluster.recovery.on_revocation}")
    if r["candidate"].bsp_fraction is not None:
        phases = ",".join(f"{{protocol:{ph.protocol.value},fraction:{ph.fraction:g}}}"
                          for ph in run_cfg.sync.phases)
        out += [f"sync.phases=[{phases}]", "sync.switch_order=", "sync.fractions=[]",
                "sync.phase_hparams=[]"]
    return out


def dry_run_command(overrides: list[str], cfg: ExperimentConfig, r: dict[str, Any]) -> str:
    """The one command that dry-runs row ``r``: the question's own overrides but the
    planner's and those the row sets (a schedule of its own replaces the question's ``sync``),
    then the row's (:func:`answer_overrides`)."""
    import shlex

    from orchestrator.version import prog_name

    answer = answer_overrides(cfg, r)
    keys = {o.split("=", 1)[0] for o in answer} | {
        "planner", "dry_run", "cluster.worker_groups.0.count"}
    if r["candidate"].bsp_fraction is not None:
        keys.add("sync")

    def own(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+~")
        return not any(key == k or key.startswith(k + ".") for k in keys)

    return " ".join([prog_name("orchestrator"), *map(shlex.quote, [
        *(o for o in overrides if own(o)), *answer, "dry_run=true"])])


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
