"""A composed config → validated dataclasses and their plan: the step between Hydra and the
players, outside the plan package's ``__init__`` (which validation imports for the hosts: the
two would otherwise close an import circle)."""

from __future__ import annotations

from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import RunPlan, make_plan


def load_and_plan(cfg: Any) -> tuple[ExperimentConfig, RunPlan]:
    """A composed task config (Hydra's, without its ``hydra`` node) as validated dataclasses
    and its plan; ConfigError for anything wrong with it."""
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.config.load import from_omegaconf, to_experiment
    from orchestrator.config.validation import validate

    try:
        experiment = to_experiment(cfg)
    except OmegaConfBaseException as ex:
        raise from_omegaconf(ex) from ex
    validate(experiment)
    plan = make_plan(experiment)
    experiment.provider = experiment.provider.for_plan(plan.est_train_time_s)  # gce: VMs' life
    return experiment, plan
