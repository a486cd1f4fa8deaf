"""Composing a config as the command line does, outside a running Hydra app: one function.

The packaged config tree (``pkg://orchestrator.conf``) with the user's repository in front of
it (:mod:`orchestrator.user_repo`), the schemas registered, the documented mapping forms
(``provider.labels={team: ml}``) rewritten as the entry point rewrites them. The simulator's
composer, the validate command, the resume's checks and the planner all compose here; only the
running app (``python -m orchestrator``, its launcher's sweep check) composes with Hydra's own,
already initialised instance.
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig


def compose_config(overrides: Sequence[str], search: Sequence[str] = ()) -> DictConfig:
    """Hydra's composition of ``overrides`` (plus ``search``: recorded ``hydra.searchpath=``
    overrides) as a DictConfig, Hydra left as found. Hydra's and OmegaConf's exceptions pass
    through (:func:`orchestrator.config.hydra_errors.config_error_from_hydra` words them)."""
    from hydra import compose, initialize_config_module

    from hydra_plugins.transient_launcher import user_repo
    from orchestrator.config.hydra_errors import open_mapping_overrides
    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_PACKAGE

    register_configs()
    user_repo.register()  # the user's experiments and groups, as the CLI finds them
    with initialize_config_module(version_base="1.3", config_module=CONF_PACKAGE):
        return compose("config", overrides=[*open_mapping_overrides(overrides), *search])
