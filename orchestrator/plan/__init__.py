"""Turn a validated experiment into a RunPlan: hosts, prices, phases and step targets.

The plan is what the dry run prints and what ``plan.json`` records, so a run can later be
compared against what was predicted. ``python -m orchestrator.plan`` is the planner
(:mod:`orchestrator.plan.__main__`), which searches over plans; this module only makes one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config.schema import ExperimentConfig, Protocol, schedule_phases
from orchestrator.config.transient import OnRevocation, RevocationModel
from orchestrator.plan.hosts import HostPlan, host_specs, plan_hosts
from orchestrator.simulate.models import NoModelError, SimModels
from orchestrator.transient.revocation import RevocationSchedule
from provisioning import catalog
from provisioning.base import HostSpec
from provisioning.catalog import Market
from trainer.layout import ROLE_WORKER


@dataclass(frozen=True)
class BackendTraits:
    """What the plan's backend is, looked up once by ``make_plan`` (``Provider`` class
    attributes), so that code holding a plan reads it here instead of asking the registry by
    name again; plan.json records it (``backend``)."""

    name: str
    simulated: bool  # the entry point plays the plan in the simulation (``sim``)
    hosts_here: bool  # the hosts are processes on this machine (``local``)
    billed: bool  # False: the prices are what the cluster would cost, nothing is billed
    transient_market: Market | None  # for the plan's catalog; None: no cloud revokes its hosts

    @classmethod
    def of(cls, provider: str, pricing: Any) -> BackendTraits:
        """The traits of backend ``provider`` pricing its transient VMs with ``pricing``."""
        from provisioning.registry import provider_class

        backend = provider_class(provider)
        return cls(provider, backend.simulated, backend.hosts_here, backend.billed,
                   backend.transient_market(pricing))


@dataclass
class PhasePlan:
    protocol: str
    start_step: int  # global step at which the phase starts
    end_step: int  # global-step target at which it ends (cumulative)
    bsp_equivalent_steps: float
    hparams: dict[str, float] = field(default_factory=dict)


@dataclass
class RunPlan:
    experiment: str
    provider: str
    catalog: str
    hosts: list[HostPlan]
    phases: list[PhasePlan]
    workers: int
    parameter_servers: int
    hourly_usd: float
    # the speed model's point estimate (orchestrator.simulate.models, the one model of speed the
    # band, the planner and the scheduler use too); None: it cannot predict this setup
    est_steps_per_sec: float | None
    est_train_time_s: float | None
    est_cost_usd: float | None
    backend: BackendTraits  # the provider's traits, looked up once (make_plan)
    revocation_model: str = "none"
    planned_revocations: list[dict[str, Any]] = field(default_factory=list)  # within the horizon
    risks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    prediction: dict[str, Any] | None = None  # simulated band (orchestrator.simulate.band)
    # per worker GPU: how far its step time may be off (SimModels.step_time_error)
    speed_error: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def extrapolated_gpus(self) -> list[str]:
        """Worker GPUs whose step time is the speed model extrapolated to a GPU it was not
        fitted on (no paper measured it and no calibration replaced it)."""
        return sorted(g for g, e in self.speed_error.items() if e["basis"] == "extrapolated")

    @property
    def total_steps(self) -> int:
        return self.phases[-1].end_step

    @property
    def gpus(self) -> int:
        """GPUs the run holds at once (what a GPU quota counts): one per machine with a GPU;
        a colocated role shares its owner's machine and holds none of its own."""
        return sum(1 for h in self.hosts if h.gpu and h.colocate_with is None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def host_specs(self) -> list[HostSpec]:
        """The hosts as the provider is asked for them."""
        return host_specs(self.hosts)


def plan_phases(cfg: ExperimentConfig, workers: int) -> list[PhasePlan]:
    """Global-step targets for each sync phase.

    Without ``sync.phases`` the run is one phase of ``sync.protocol`` ending at
    ``job.train_steps`` global steps. With phases the budget is in BSP-equivalent steps, as in
    Sync-Switch: a BSP phase of fraction f takes f·B global steps, an ASP phase f·B·N.
    """
    budget = cfg.job.train_steps
    schedule = schedule_phases(cfg.sync)
    if not schedule:
        return [PhasePlan(cfg.sync.protocol.value, 0, budget, float(budget))]
    phases: list[PhasePlan] = []
    start = 0
    for phase in schedule:
        bsp_steps = phase.fraction * budget
        scale = workers if phase.protocol == Protocol.asp else 1
        end = start + max(1, round(bsp_steps * scale))
        phases.append(PhasePlan(phase.protocol.value, start, end, bsp_steps, dict(phase.hparams)))
        start = end
    return phases


def samples_trained(batch_size: int, workers: int, phases: list[PhasePlan]) -> int:
    """Examples a run trains at its planned global steps: an ASP global step is one worker's
    batch, a BSP one all ``workers``' batches. A switch schedule's budget is in BSP-equivalent
    steps, so it trains budget·workers·batch (fewer workers, fewer examples); ASP alone trains
    budget·batch whatever the workers. Revoked workers under ``shrink`` are not counted out."""
    return sum((p.end_step - p.start_step) * batch_size
               * (workers if p.protocol == Protocol.bsp.value else 1) for p in phases)


def checkpoint_count(cfg: ExperimentConfig, total_steps: int) -> int:
    """Checkpoint pauses of a run: one per ``checkpoint_frequency``/``eval_frequency`` boundary
    (the smaller), else the final one."""
    every = [f for f in (cfg.job.checkpoint_frequency, cfg.job.eval_frequency) if f > 0]
    return total_steps // min(every) if every else 1


def estimate_train_time_s(cfg: ExperimentConfig, hosts: list[HostPlan], phases: list[PhasePlan],
                          models: SimModels) -> float:
    """Training seconds at the speed model's point estimate: every worker throughout, no
    revocation, the checkpoint pauses; NoModelError when the model cannot predict a worker."""
    return models.train_time_s(
        cfg.job.hparam_set, cfg.job.batch_size, [h.gpu for h in hosts if h.role == ROLE_WORKER],
        cfg.cluster.parameter_servers, [(p.protocol, p.end_step - p.start_step) for p in phases],
        checkpoint_count(cfg, phases[-1].end_step))


def lone_worker_cannot_survive(cfg: ExperimentConfig, hosts: list[HostPlan],
                               backend: BackendTraits | None = None) -> bool:
    """One transient worker that something revokes (the revocation model or the backend's
    cloud), and a policy (shrink) that replaces none: the run ends at its first revocation.
    ``backend`` None: looked up (the planner asks before any plan exists)."""
    workers = [h for h in hosts if h.role == ROLE_WORKER]
    if (len(workers) != 1 or not workers[0].transient
            or cfg.cluster.recovery.on_revocation != OnRevocation.shrink):
        return False
    if cfg.revocation.model != RevocationModel.none:
        return True
    backend = backend or BackendTraits.of(cfg.provider.name, cfg.pricing)
    return backend.transient_market is not None


def make_plan(cfg: ExperimentConfig) -> RunPlan:
    """Build the plan of one run; pure (reads the config, touches nothing)."""
    backend = BackendTraits.of(cfg.provider.name, cfg.pricing)
    hosts = plan_hosts(cfg)
    workers = sum(1 for h in hosts if h.role == ROLE_WORKER)
    phases = plan_phases(cfg, workers)
    hourly = sum(h.hourly_usd for h in hosts)
    models = SimModels.load()
    est_time: float | None
    try:
        est_time = estimate_train_time_s(cfg, hosts, phases, models)
    except NoModelError:
        est_time = None
    speed_all = None if not est_time else phases[-1].end_step / est_time
    speed_error = {h.gpu or "cpu": models.step_time_error(cfg.job.hparam_set, h.gpu)
                   for h in hosts if h.role == ROLE_WORKER and est_time is not None}
    horizon = est_time if est_time is not None else None
    planned = [e.to_record() for e in RevocationSchedule.from_config(cfg.revocation, hosts).pending
               if horizon is None or e.at_s is None or e.at_s <= horizon]
    risks = []
    if cfg.cluster.ps_transient:
        risks.append("parameter servers are transient: a revocation restarts training "
                     "from the last checkpoint")
    if cfg.cluster.chief_transient and not cfg.cluster.chief_on_ps:
        risks.append("the chief is transient: a revocation restarts the coordinator")
    if lone_worker_cannot_survive(cfg, hosts, backend):
        risks.append("a lone transient worker with cluster.recovery.on_revocation=shrink: its "
                     "first revocation ends the run (replace survives it)")
    return RunPlan(
        experiment=cfg.name,
        provider=cfg.provider.name,
        catalog=cfg.pricing.name,
        hosts=hosts,
        phases=phases,
        workers=workers,
        parameter_servers=cfg.cluster.parameter_servers,
        hourly_usd=round(hourly, 6),
        est_steps_per_sec=speed_all,
        est_train_time_s=est_time,
        est_cost_usd=None if est_time is None else catalog.cost_usd([hourly], est_time),
        backend=backend,
        revocation_model=str(cfg.revocation.model),
        planned_revocations=planned,
        risks=risks,
        speed_error=speed_error,
    )

