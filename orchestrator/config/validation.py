"""Semantic validation of a composed experiment: the checks Hydra's type schema cannot make.

Hydra and the dataclass schema check shapes and types; this module checks meaning: names that
must exist in a registry or the catalog, zones that must offer a GPU, counts that must be
positive. Every check raises :class:`ConfigError` naming the field, before anything starts.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.ranges import check_ranges
from orchestrator.config.schema import ExperimentConfig, Protocol, schedule_phases
from provisioning.catalog import retirement
from trainer.spec import PHASE_HPARAMS

PHASE_FRACTION_TOLERANCE = 1e-6
LOCAL_ZONE = "local"
#: The longest file name Linux and macOS file systems take: ``name`` names the output folder.
NAME_MAX_BYTES = 255


def _registries() -> tuple[dict[str, list[str]], list[str], set[str]]:
    """Model -> hparam sets, problem names, and problems that read files from data_dir."""
    from trainer import models, problems

    model_sets = {m: list(models.hparam_sets(m)) for m in models.list_models()}
    names = list(problems.list_problems())
    file_backed = {p for p in names if problems.get_problem(p).requires_data_dir}
    return model_sets, names, file_backed


def _providers() -> list[str]:
    from provisioning.registry import provider_names

    return list(provider_names())


def validate_cluster(cfg: ExperimentConfig) -> None:
    c, catalog = cfg.cluster, cfg.pricing
    if not c.worker_groups:
        raise ConfigError("cluster.worker_groups", "needs at least one worker group")
    if c.workers is not None and len(c.worker_groups) > 1:
        raise ConfigError(
            "cluster.workers",
            "the shorthand only applies to a homogeneous cluster",
            "set cluster.workers=null and cluster.worker_groups.N.count",
        )
    known_zones = [*catalog.all_zones(), LOCAL_ZONE]
    for i, group in enumerate(c.worker_groups):
        path = f"cluster.worker_groups.{i}"
        if group.machine_type not in catalog.machine_types:
            raise ConfigError(
                f"{path}.machine_type",
                f"unknown machine type '{group.machine_type}' in catalog '{catalog.name}'",
                "one of: " + ", ".join(catalog.machine_types),
            )
        if group.gpu is not None:
            retired = retirement(cfg.provider.name, group.gpu)
            if retired is not None:
                raise ConfigError(
                    f"{path}.gpu",
                    f"{group.gpu.upper()} was retired on {cfg.provider.name.upper()} on "
                    f"{retired.date} ({retired.source})",
                    f"use {retired.replacement} (e.g. {path}.gpu={retired.replacement}); "
                    f"{group.gpu} clusters stay valid for dry runs and analysis with "
                    "provider=local",
                )
            if group.gpu not in catalog.gpus:
                raise ConfigError(
                    f"{path}.gpu",
                    f"unknown GPU '{group.gpu}' in catalog '{catalog.name}'",
                    "one of: " + ", ".join(catalog.gpus) + ", or null for CPU",
                )
            offered = catalog.zones_for(group.gpu)
            if not offered:  # the planner would have no zone to put the group in
                raise ConfigError(f"pricing.gpus.{group.gpu}.zones", "is empty: no zone offers "
                                  f"GPU '{group.gpu}' (the zones where {path} may run)")
            if group.zone is not None and group.zone not in offered:
                raise ConfigError(
                    f"{path}.zone",
                    f"zone '{group.zone}' does not offer GPU '{group.gpu}'",
                    "zones with it: " + ", ".join(offered),
                )
        elif group.zone is not None and group.zone not in known_zones:
            raise ConfigError(f"{path}.zone", f"unknown zone '{group.zone}'",
                              "one of: " + ", ".join(known_zones))
    for key in ("ps_machine_type", "chief_machine_type"):
        value = getattr(c, key)
        if value not in catalog.machine_types:
            raise ConfigError(f"cluster.{key}", f"unknown machine type '{value}'",
                              "one of: " + ", ".join(catalog.machine_types))
    if c.ps_zone is not None and c.ps_zone not in known_zones:
        raise ConfigError("cluster.ps_zone", f"unknown zone '{c.ps_zone}'",
                          "one of: " + ", ".join(known_zones))


def validate_job(cfg: ExperimentConfig) -> None:
    j = cfg.job
    model_sets, problem_names, _ = _registries()
    if j.model not in model_sets:
        raise ConfigError("job.model", f"unknown model '{j.model}'",
                          "one of: " + ", ".join(model_sets))
    if j.hparam_set not in model_sets[j.model]:
        raise ConfigError("job.hparam_set", f"'{j.hparam_set}' is not a set of model '{j.model}'",
                          "one of: " + ", ".join(model_sets[j.model]))
    if j.problem not in problem_names:
        raise ConfigError("job.problem", f"unknown problem '{j.problem}'",
                          "one of: " + ", ".join(problem_names))
    steps = j.lr_decay_steps
    if j.lr_schedule == "step" and not steps:  # the trainer's spec refuses it after provisioning
        raise ConfigError("job.lr_decay_steps", "required for lr_schedule=step (got [])",
                          "the steps where the rate decays, e.g. [32000, 48000]")
    for i, (a, b) in enumerate(itertools.pairwise(steps)):
        if b <= a:
            raise ConfigError(f"job.lr_decay_steps.{i + 1}", f"must be greater than the step "
                              f"before it (got {steps})", "steps in increasing order")


def validate_sync(cfg: ExperimentConfig) -> None:
    sync = cfg.sync
    if sync.switch_order:
        if sync.phases:
            raise ConfigError("sync.switch_order", "set either phases or switch_order",
                              "clear one of them")
        if set(sync.switch_order) - {"0", "1"}:
            raise ConfigError("sync.switch_order", f"invalid '{sync.switch_order}'",
                              "digits 1 = BSP, 0 = ASP, e.g. '10'")
        if len(sync.fractions) != len(sync.switch_order):
            raise ConfigError("sync.fractions", f"needs one fraction per phase of "
                              f"'{sync.switch_order}' (got {len(sync.fractions)})")
        if len(sync.phase_hparams) > len(sync.switch_order):
            raise ConfigError("sync.phase_hparams", "more entries than phases")
    where = "sync.fractions" if sync.switch_order else "sync.phases"
    phases = schedule_phases(sync)
    if not phases:
        return
    total = 0.0
    for i, phase in enumerate(phases):
        unknown = set(phase.hparams) - set(PHASE_HPARAMS)
        if unknown:
            path = f"sync.phase_hparams.{i}" if sync.switch_order else f"sync.phases.{i}.hparams"
            raise ConfigError(path, f"unknown hparam {sorted(unknown)}",
                              "allowed: " + ", ".join(PHASE_HPARAMS))
        total += phase.fraction
    if abs(total - 1.0) > PHASE_FRACTION_TOLERANCE:
        raise ConfigError(where, f"fractions must add up to 1 (got {total:g})")
    assert all(isinstance(p.protocol, Protocol) for p in phases)


def validate_provider(cfg: ExperimentConfig) -> None:
    names = _providers()
    if cfg.provider.name not in names:
        raise ConfigError("provider.name", f"unknown provider '{cfg.provider.name}'",
                          "one of: " + ", ".join(names))
    from provisioning.registry import backend

    if str(cfg.revocation.model) != "none" and not backend(cfg.provider.name).provider.can_revoke:
        raise ConfigError("revocation.model", f"provider '{cfg.provider.name}' cannot revoke "
                          "hosts on demand", "use revocation=none, or a provider that can "
                          "(local)")
    from provisioning.base import DATA_SOURCES

    if cfg.provider.data_source not in DATA_SOURCES:
        raise ConfigError("provider.data_source", f"unknown data source "
                          f"'{cfg.provider.data_source}'", "one of: " + ", ".join(DATA_SOURCES))
    for path, problem in cfg.provider.check()[:1]:  # the backend's own checks (ssh: key files)
        raise ConfigError(path, problem)


def validate_market(cfg: ExperimentConfig) -> None:
    """The pricing's transient market is the one the backend's VMs are sold in (after the
    cluster's checks: a GPU the cloud no longer offers is the more useful line)."""
    from provisioning.registry import backend

    # validation runs before any plan exists: asked by name
    market = backend(cfg.provider.name).provider.transient_market(cfg.pricing)
    if market is not None and market != cfg.pricing.transient_market:
        raise ConfigError("pricing.transient_market",
                          f"provider={cfg.provider.name} creates {market} VMs, but pricing "
                          f"'{cfg.pricing.name}' sells {cfg.pricing.transient_market} ones, so "
                          "prices and predicted revocations would be another market's",
                          f"a pricing whose transient_market is {market}")


def validate_provider_plan(cfg: ExperimentConfig) -> None:
    """The backend's checks that need the plan's hosts or the catalog (gce: zones that exist;
    ssh: an inventory that holds the plan, GPU labels the catalog knows), after the cluster's."""
    from orchestrator.plan.hosts import host_specs, plan_hosts

    for path, problem in cfg.provider.check_plan(host_specs(plan_hosts(cfg)), cfg.pricing)[:1]:
        raise ConfigError(path, problem)


def worker_count(cfg: ExperimentConfig) -> int:
    """Workers at the start: the homogeneous shorthand wins over the groups' counts."""
    c = cfg.cluster
    return c.workers if c.workers is not None else sum(g.count for g in c.worker_groups)


def validate_straggler_workers(cfg: ExperimentConfig) -> None:
    """Injections may only slow workers that exist (as revocation events may only name hosts
    that exist: :func:`orchestrator.transient.revocation.ScheduledRevocations.plan`)."""
    if not cfg.straggler.enabled:
        return
    n = worker_count(cfg)
    for i, inj in enumerate(cfg.straggler.injections):
        for j, worker in enumerate(inj.workers):
            if worker >= n:
                raise ConfigError(f"straggler.injections.{i}.workers.{j}",
                                  f"no worker {worker} in this cluster",
                                  f"worker indices 0..{n - 1}")


def validate_planner(cfg: ExperimentConfig) -> None:
    """``python -m orchestrator.plan``'s questions must be answerable: its GPUs are the
    catalog's, and a deadline objective has a deadline to rank by."""
    from orchestrator.config.simulate import Objective

    p, catalog = cfg.planner, cfg.pricing
    for i, gpu in enumerate(p.gpus):
        if gpu not in catalog.gpus:
            raise ConfigError(f"planner.gpus.{i}", f"unknown GPU '{gpu}' in catalog "
                              f"'{catalog.name}'", "one of: " + ", ".join(catalog.gpus))
    if p.objective == Objective.deadline and p.deadline_h is None:
        raise ConfigError("planner.objective", "'deadline' ranks by the chance of finishing "
                          "before planner.deadline_h, which is not set",
                          "set a deadline: deadline_h=HOURS; or rank by cost or time")


def validate(cfg: ExperimentConfig) -> None:
    """Check every field's meaning; raises ConfigError on the first problem found."""
    from orchestrator.config import transient as st

    check_ranges(cfg)
    if not cfg.name or cfg.name != Path(cfg.name).name or cfg.name in (".", ".."):
        raise ConfigError("name", f"'{cfg.name}' cannot name the output folder",
                          "a non-empty name without '/'")
    if len(cfg.name.encode()) > NAME_MAX_BYTES:
        raise ConfigError("name", f"is {len(cfg.name.encode())} bytes, too long to name the "
                          f"output folder (at most {NAME_MAX_BYTES})", "a shorter name")
    validate_provider(cfg)
    validate_cluster(cfg)
    validate_market(cfg)
    validate_provider_plan(cfg)
    validate_job(cfg)
    validate_sync(cfg)
    st.validate_recovery(cfg.cluster.recovery)
    st.validate_sync_policy(cfg.sync.policy)
    st.validate_revocation(cfg.revocation)
    st.validate_straggler(cfg.straggler)
    validate_straggler_workers(cfg)
    validate_planner(cfg)


def validate_data_dir(cfg: ExperimentConfig) -> None:
    """At run start: a given job.data_dir must hold the problem's files; unset, the problem
    needs a dataset the run can fetch into the cache (orchestrator/runtime/data.py)."""
    from provisioning.base import BadFieldError, url_scheme
    from provisioning.registry import dataset_reader
    from trainer import data, datasets

    _, _, file_backed = _registries()
    problem, given = cfg.job.problem, cfg.job.data_dir
    if problem not in file_backed:
        return
    if not given:
        if datasets.dataset_for_problem(problem) is None:
            raise ConfigError("job.data_dir", f"problem '{problem}' reads files and has no "
                              "download", "set job.data_dir to the folder with its files")
        return
    unset = f"or leave job.data_dir unset to download them into {data.cache_root(cfg.data_cache)}"
    if url_scheme(given):  # a backend's dataset URL, downloaded at run start (data.py)
        try:
            dataset_reader(given, cfg.provider.name).fetch_dataset(
                given, data.cache_root(cfg.data_cache), download=False)
        except BadFieldError as error:
            raise ConfigError(error.field, error.problem,
                              f"a location with the {problem} files, {unset}") from None
        return
    if not Path(given).expanduser().is_dir():
        raise ConfigError("job.data_dir", f"folder '{given}' does not exist",
                          f"put the {problem} files there, {unset}")
    if not datasets.holds_files(problem, given):
        raise ConfigError("job.data_dir", f"folder '{given}' does not hold the {problem} files",
                          f"see python -m trainer.data list, {unset}")


def validate_run_start(cfg: ExperimentConfig) -> None:
    """At run start (never in a dry run): access to the cloud the run will use, so a run
    without credentials fails at once with one line saying what to do (before any download)."""
    from provisioning.registry import provider_class

    # the backend's code on the provider config, asked when a run starts: by name
    problem = provider_class(cfg.provider.name).check_credentials(cfg.provider)
    if problem is not None:
        raise ConfigError(*problem)
