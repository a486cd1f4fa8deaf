"""Structured-config schemas: the source of truth for every config group (the ``job`` group's
is the trainer's own launch spec, :class:`trainer.spec.JobSpec`, mounted here).

YAML files in ``conf/<group>/`` and ``experiments/`` choose and fill these dataclasses; Hydra
checks types while composing and :mod:`orchestrator.config.validation` checks meaning afterwards.
Convert a composed config once with :func:`orchestrator.config.load.to_experiment` so the rest
of the code sees real dataclasses, never a ``DictConfig``. Data only: this module imports
neither the loader nor the error translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from orchestrator.config.simulate import PlannerConfig, QueueConfig, SimConfig
from orchestrator.config.transient import (
    RecoveryConfig,
    RevocationConfig,
    StragglerConfig,
    SyncPolicyConfig,
    register_transient_configs,
)
from provisioning.base import ProviderConfig
from provisioning.catalog import PricingConfig
from provisioning.registry import all_backends
from trainer import layout
from trainer.spec import JobSpec


class Protocol(StrEnum):
    """Parameter synchronisation protocol on the parameter servers."""

    bsp = layout.PROTOCOL_BSP  # bulk synchronous: one global step = one gradient from every worker
    asp = layout.PROTOCOL_ASP  # asynchronous: every worker step is a global step


@dataclass
class WorkerGroup:
    """Identical workers that share a GPU type, zone and pricing model."""

    count: int = 1  # hosts in this group; CLI: cluster.worker_groups.0.count=4
    gpu: str | None = None  # catalog GPU name (k80, p100, v100, t4, a100, l4); None = CPU only
    zone: str | None = None  # GCE zone; None = the planner picks the first zone offering the GPU
    machine_type: str = "n1-standard-4"  # host VM type (priced from the catalog)
    transient: bool = True  # spot/preemptible: cheaper, may be revoked


@dataclass
class ClusterConfig:
    """Who trains: parameter servers, the chief/coordinator and worker groups."""

    name: str = MISSING  # label shown in the plan
    workers: int | None = None  # homogeneous shorthand: sets worker_groups[0].count (sweepable)
    worker_groups: list[WorkerGroup] = field(default_factory=lambda: [WorkerGroup()])
    parameter_servers: int = 1  # PS tasks; variables are spread over them
    ps_machine_type: str = "n1-standard-4"
    ps_zone: str | None = None  # None = the zone of the first worker group
    ps_transient: bool = False  # a revoked PS restarts the cluster from a checkpoint: a risk
    chief_on_ps: bool = True  # run the chief and evaluator on the first PS's VM (no extra VM)
    chief_machine_type: str = "n1-standard-4"  # when chief_on_ps is false
    chief_transient: bool = False  # the coordinator; a revoked chief restarts the run: a risk
    evaluator: bool = True  # run a side-car evaluator on the held-out split
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)  # what a revocation triggers


@dataclass
class SyncPhase:
    """One phase of a synchronisation schedule."""

    protocol: Protocol = MISSING
    fraction: float = MISSING  # share of the BSP-equivalent step budget, (0, 1]
    hparams: dict[str, float] = field(default_factory=dict)  # e.g. {learning_rate: 0.01}


@dataclass
class SyncConfig:
    """How workers synchronise. ``phases`` empty = one phase of ``protocol``.

    A schedule is either ``phases`` or the seeds' form ``switch_order`` + ``fractions`` (+
    ``phase_hparams``): ``switch_order: "10"`` = BSP (1) then ASP (0).
    """

    name: str = MISSING
    protocol: Protocol = Protocol.asp
    phases: list[SyncPhase] = field(default_factory=list)
    switch_order: str = ""  # seeds' form: one digit per phase, 1 = BSP, 0 = ASP
    fractions: list[float] = field(default_factory=list)  # per digit of switch_order
    phase_hparams: list[dict[str, float]] = field(default_factory=list)  # per digit, optional
    policy: SyncPolicyConfig = field(default_factory=SyncPolicyConfig)  # online switching


@dataclass
class ExperimentConfig:
    """The root config: one run (a sweep runs several)."""

    name: str = "default"  # experiment name; names the output folder
    description: str = ""
    tags: list[str] = field(default_factory=list)
    dry_run: bool = False  # validate and print the plan, provision nothing
    progress: bool = True  # a bar on a terminal, else lines per phase and per 10 % / 30 s
    report_every_s: float = 1.0  # chief's progress-report interval
    data_cache: str | None = None  # downloaded datasets; None = $TRANSIENT_DATA_CACHE or XDG cache
    cluster: ClusterConfig = MISSING
    job: JobSpec = MISSING  # the trainer's own spec: one definition (trainer/spec.py)
    sync: SyncConfig = MISSING
    provider: ProviderConfig = MISSING
    pricing: PricingConfig = MISSING
    revocation: RevocationConfig = MISSING
    straggler: StragglerConfig = MISSING
    preflight: bool = True  # remote providers: one local training step first, fail fast
    sim: SimConfig = field(default_factory=SimConfig)  # provider=sim and bands (simulate/)
    planner: PlannerConfig = field(default_factory=PlannerConfig)  # python -m orchestrator.plan
    queue: QueueConfig = field(default_factory=QueueConfig)  # sweeps under a GPU quota


def register_configs() -> None:
    """Store every schema as ``base_*`` so YAML files can name it first in their defaults.

    Also registers ``${pid:}``, which makes the default output folders unique for runs started
    in the same second (conf/config.yaml ``hydra.run.dir``); a sweep's jobs share one process,
    so they share its folder.
    """
    import os

    from orchestrator.version import register_resolvers

    if not OmegaConf.has_resolver("pid"):
        OmegaConf.register_new_resolver("pid", os.getpid)
    register_resolvers()  # ${prog:}, ${docs:} in the help (conf/config.yaml)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="job", name="base_job", node=JobSpec)
    cs.store(group="sync", name="base_sync", node=SyncConfig)
    cs.store(group="provider", name="base_provider", node=ProviderConfig)
    for registered in all_backends():  # provider=<name> composes against its own schema
        cs.store(group="provider", name=f"{registered.name}_schema", node=registered.config)
    cs.store(group="pricing", name="base_pricing", node=PricingConfig)
    register_transient_configs()


def schedule_phases(sync: SyncConfig) -> list[SyncPhase]:
    """The schedule as phases, whichever form the config used (empty = single protocol)."""
    if not sync.switch_order:
        return list(sync.phases)
    hparams = list(sync.phase_hparams) + [{}] * len(sync.switch_order)
    return [SyncPhase(Protocol.bsp if digit == "1" else Protocol.asp, fraction, dict(hp))
            for digit, fraction, hp in zip(sync.switch_order, sync.fractions, hparams,
                                           strict=False)]
