"""The planner's search space: the clusters it may answer (GPU types the catalog rents and the
speed model knows × worker counts × transient or on-demand × zones × sync schedules ×
parameter servers) and each one as the experiment the simulation plays (:func:`configure`).
Kept apart from the search (:mod:`orchestrator.simulate.planner`) so that what the planner
shows and why its answer is empty (``planner_report``, ``planner_misses``) read the candidates
without importing the search that ranks them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from orchestrator.config.schema import ExperimentConfig, Protocol, SyncPhase, schedule_phases
from orchestrator.config.transient import OnRevocation
from orchestrator.simulate.models import NoModelError, SimModels


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
