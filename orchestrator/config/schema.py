"""Structured-config schemas: the source of truth for every config group.

YAML files in ``conf/<group>/`` and ``experiments/`` choose and fill these dataclasses; Hydra
checks types while composing and :mod:`orchestrator.config.validation` checks meaning afterwards.
Convert a composed config once with :func:`to_experiment` so the rest of the code sees real
dataclasses, never a ``DictConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

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
from provisioning.registry import all_backends, backend, provider_names
from trainer import layout


class Protocol(StrEnum):
    """Parameter synchronisation protocol on the parameter servers."""

    bsp = layout.PROTOCOL_BSP  # bulk synchronous: one global step = one gradient from every worker
    asp = layout.PROTOCOL_ASP  # asynchronous: every worker step is a global step


class Optimizer(StrEnum):
    sgd = "sgd"
    momentum = "momentum"
    adam = "adam"


class LrSchedule(StrEnum):
    constant = "constant"
    cosine = "cosine"
    step = "step"


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
class JobConfig:
    """What is trained and how (mirrors :class:`trainer.spec.JobSpec`)."""

    model: str = "cnn"  # model registry name: resnet | cnn
    hparam_set: str = "cnn_small"  # e.g. resnet_cifar_32; must belong to the model
    problem: str = "digits"  # problem registry: digits | image_cifar10 | image_cifar100 | synthetic
    data_dir: str | None = None  # folder or gs://BUCKET/PREFIX with the files; None = the cache
    train_steps: int = 1000  # global steps (with phases: the budget in BSP-equivalent steps)
    batch_size: int = 64  # per worker and step
    optimizer: Optimizer = Optimizer.momentum
    learning_rate: float = 0.02
    momentum: float = 0.9  # for optimizer=momentum
    weight_decay: float = 0.0  # L2 factor
    lr_schedule: LrSchedule = LrSchedule.constant
    lr_decay_steps: list[int] = field(default_factory=list)  # for lr_schedule=step
    lr_decay_factor: float = 0.1  # multiplier at each lr_decay_steps boundary
    warmup_steps: int = 0  # linear warm-up
    checkpoint_frequency: int = 0  # steps between checkpoints; 0 = only at the end
    keep_checkpoints: int = 3
    eval_frequency: int = 0  # steps between evaluations; 0 = only at the end
    seed: int = 0
    steps_per_closure: int = 0  # steps per worker closure (ASP, BSP); 0 = from the step time


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
    progress: bool = True  # rich progress bars (only when stdout is a terminal)
    report_every_s: float = 1.0  # chief's progress-report interval
    data_cache: str | None = None  # downloaded datasets; None = $TRANSIENT_DATA_CACHE or XDG cache
    cluster: ClusterConfig = MISSING
    job: JobConfig = MISSING
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

    if not OmegaConf.has_resolver("pid"):
        OmegaConf.register_new_resolver("pid", os.getpid)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=ExperimentConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="job", name="base_job", node=JobConfig)
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


def to_experiment(cfg: DictConfig | dict[str, Any]) -> ExperimentConfig:
    """Re-merge a composed config into a fresh schema and return real dataclasses.

    Re-merging catches what Hydra lets through: keys added with ``+`` that the schema does not
    know, and values of the wrong type. Raises :class:`ConfigError` naming the field.
    """
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.config.errors import from_omegaconf

    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    assert isinstance(data, dict)
    data = {k: v for k, v in data.items() if k != "hydra"}
    check_list_items(ExperimentConfig, data)
    schema = OmegaConf.structured(ExperimentConfig)
    provider = data.get("provider")
    if isinstance(provider, dict) and provider.get("name") in provider_names():
        check_provider_name(provider)
        # the backend's own schema (a ProviderConfig subclass) checks its options
        schema.provider = OmegaConf.structured(backend(provider["name"]).config)
    elif isinstance(provider, dict):  # an unknown backend: validation names provider.name
        base = {f.name for f in fields(ProviderConfig)}
        data["provider"] = {k: v for k, v in provider.items() if k in base}
    try:
        merged = OmegaConf.merge(schema, data)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as ex:
        raise from_omegaconf(ex) from None
    assert isinstance(obj, ExperimentConfig)
    return obj


def check_provider_name(provider: dict[str, Any]) -> None:
    """``provider.name=gce`` where ``provider=gce`` was meant: the name picks the schema, but
    the settings came from the group's option, another backend's; saying their first key is
    unknown would blame a key the user never wrote. Raises ConfigError naming provider.name."""
    from orchestrator.config.errors import ConfigError

    name = provider["name"]
    known = {f.name for f in fields(backend(name).config)}
    if set(provider) <= known:
        return
    owners = [b for b in provider_names() if b != name
              and set(provider) <= {f.name for f in fields(backend(b).config)}]
    if owners:
        raise ConfigError("provider.name", f"'{name}' names another backend than the "
                          f"provider's settings, which are provider={owners[0]}'s",
                          f"choose the backend with provider={name}, not provider.name={name}")


def check_list_items(schema: type, data: Any, path: str = "") -> None:
    """Merge every item of a list of dataclasses on its own, so an error names its index.

    OmegaConf checks a list item before attaching it to the list, so its errors carry only the
    item's own key; this walk gives them the dotted path a user can paste back as an override
    (``cluster.worker_groups.1.count``). Raises :class:`ConfigError`.
    """
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.config.errors import ConfigError, from_omegaconf, full_key, pasteable

    if not isinstance(data, dict):
        return
    hints = get_type_hints(schema)
    for key, value in data.items():
        hint = hints.get(key)
        if hint is None:
            continue
        here = f"{path}{key}"
        inner = [a for a in get_args(hint) if a is not type(None)]
        if isinstance(hint, type) and is_dataclass(hint):
            check_list_items(hint, value, here + ".")
        elif inner and is_dataclass(inner[0]) and get_origin(hint) is not list:
            check_list_items(inner[0], value, here + ".")  # X | None
        elif get_origin(hint) in (list, dict) and not is_dataclass(inner[-1]):
            check_plain_items(hint, value, here)
        elif get_origin(hint) is list and inner and is_dataclass(inner[0]):
            if not isinstance(value, list):
                continue  # the whole-config merge reports the wrong type
            for i, item in enumerate(value):
                item_path = f"{here}.{i}"
                if not isinstance(item, dict):
                    raise ConfigError(item_path, f"expected a mapping of {inner[0].__name__} "
                                      f"keys, got '{item}'")
                try:
                    OmegaConf.merge(OmegaConf.structured(inner[0]), item)
                except OmegaConfBaseException as ex:
                    err = from_omegaconf(ex)
                    key_in_item = pasteable(full_key(ex))
                    raise ConfigError(f"{item_path}.{key_in_item}".rstrip("."), err.problem,
                                      err.allowed) from None
                check_list_items(inner[0], item, item_path + ".")


_SCALARS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def check_plain_items(hint: Any, value: Any, path: str) -> None:
    """The items of a list or mapping of plain values (``list[float]``, ``dict[str, float]``,
    ``list[dict[str, float]]``) are of that shape: OmegaConf lets a list through as an item of
    a ``list[float]`` (``sync.fractions=[[0.5], 0.5]``), which later code would trip over.
    Raises :class:`ConfigError` naming the item."""
    from orchestrator.config.errors import ConfigError

    origin, args = get_origin(hint), get_args(hint)
    if origin not in (list, dict) or not args:
        if hint in _SCALARS and isinstance(value, list | dict):
            raise ConfigError(path, f"expected {_SCALARS[hint]}, got a "
                              f"{'list' if isinstance(value, list) else 'mapping'}",
                              "write one value here")
        return
    if not isinstance(value, list | dict):
        return  # the merge into the schema reports the wrong type of the whole
    items = enumerate(value) if isinstance(value, list) else value.items()
    for key, item in items:
        check_plain_items(args[-1], item, f"{path}.{key}")
