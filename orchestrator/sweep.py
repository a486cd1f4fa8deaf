"""Sweep-level pieces: expand and validate every sweep point up front, and hold the sweep's
lock. The sweep's index (``runs.csv``) is the run directory's: :mod:`orchestrator.rundir.index`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from orchestrator.rundir import results

# Number of runs in the current multirun (set by SweepValidator; None for a single run).
sweep_size: int | None = None
# Run directories whose run did not complete (this process's); the entry point exits 1 if any.
failed_runs: list[str] = []
# The sweep directory's lock, held by the sweep's orchestrator while it lives: a resume
# (orchestrator/resume.py) refuses a sweep whose orchestrator is alive, between points too.
_sweep_lock: results.RunDirLock | None = None


def sweep_id(sweep_dir: str | Path) -> str:
    """The id that names a sweep's resources (GCE's ``sweep-id`` label): the sweep folder's
    parent and own name, ``<experiment>-<time>-<pid>`` for the default ``hydra.sweep.dir``."""
    path = Path(sweep_dir).resolve()
    return f"{path.parent.name}-{path.name}"


def point_error_exit(ex: BaseException, point: Sequence[str]) -> None:
    """Print a sweep point's config error as one line naming the field and the point, and exit
    2; re-raise ``ex`` when it is not a config error."""
    from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
    from orchestrator.config.hydra_errors import (
        config_error_from_hydra,
        exact_item_error,
        explain,
    )

    err = config_error_from_hydra(ex)
    if err is None:
        raise ex
    err = explain(exact_item_error(err, list(point)))
    print(ConfigError(err.path, err.problem, err.allowed).line()
          + f" [sweep point: {' '.join(point)}]", file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def expand_sweep(overrides: Sequence[str], config_loader: Any = None) -> list[list[str]]:
    """Every combination of a command line's sweep overrides (BasicSweeper's cross product).

    ``config_loader`` lists a group's options for ``glob()`` (Hydra's while it runs; else one
    made here, for a resume's replay and the simulated sweep). A sweep
    that cannot be expanded, or that has no point (``glob(*)`` of a setting that is not a
    group, ``range(3,1)``), raises :class:`ConfigError` naming its key: the sweep would
    otherwise fail with a traceback, or launch nothing and exit 0.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra

    from orchestrator.config.errors import ConfigError

    if config_loader is None and GlobalHydra.instance().is_initialized():
        config_loader = GlobalHydra.instance().config_loader()
    if config_loader is None and any("glob(" in o for o in overrides):
        from hydra import initialize_config_module

        from hydra_plugins.transient_launcher import user_repo
        from orchestrator.config.schema import register_configs
        from orchestrator.paths import CONF_PACKAGE

        register_configs()
        user_repo.register()  # the user's groups are globbed too (not the launcher: a circle)
        with initialize_config_module(version_base="1.3", config_module=CONF_PACKAGE):
            return expand_sweep(overrides, GlobalHydra.instance().config_loader())
    parser = OverridesParser.create(config_loader=config_loader)
    parsed = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        value = text.split("=", 1)[1] if "=" in text else ""
        try:
            override = parser.parse_overrides([text])[0]
            values = list(override.sweep_string_iterator()) \
                if override.is_sweep_override() and override.is_discrete_sweep() else None
        except ValueError as ex:  # range(1,3,0): Hydra's own argument check
            raise ConfigError(key, f"'{value}' is not a sweep: {ex}",
                              "e.g. range(1,9,2), or list the values: 1,3,5,7") from None
        except HydraException as ex:
            if "ConfigLoader is not set" not in str(ex):
                raise
            raise ConfigError(key, f"'{value}' needs the config groups' options",
                              "list the options: a,b,c") from None
        if override.is_sweep_override() and values is None:
            raise ConfigError(key, f"'{value}' is a continuous interval, which only an "
                              "optimizing sweeper samples; this one runs listed points",
                              "list the values (1,2,4) or use range(start,stop,step)")
        if values == []:
            hint = ("glob() chooses among a config group's options, as in sync=glob(*); "
                    "list this setting's values: a,b,c") if "glob(" in value \
                else "list the values: a,b,c"
            raise ConfigError(key, f"'{value}' gives no value: the sweep has no points", hint)
        parsed.append(override)
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(combo) for combo in batches[0]]


class SweepValidator(Callback):
    """Hydra callback: compose and validate every sweep point before the first run starts.

    Without it a bad value in the third point of a sweep would surface only after two runs had
    provisioned servers and trained. Exits 2 with the one-line error naming the field: Hydra
    turns a callback's exceptions into warnings, so SystemExit is the only way to stop here.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # as typed: `name=${x}` is an override's text, not an interpolation of this list
        task = [str(o) for o in OmegaConf.to_container(
            OmegaConf.select(config, "hydra.overrides.task") or OmegaConf.create([]),
            resolve=False)]
        try:
            self._validate(config, task)
        except SystemExit:
            raise
        except Exception as ex:  # anything else would be a warning, and the sweep would run
            stop_sweep(ex, task)

    def _validate(self, config: DictConfig, task: list[str]) -> None:
        from hydra import compose
        from hydra.core.global_hydra import GlobalHydra

        from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
        from orchestrator.config.hydra_errors import check_group_change, check_group_overrides
        from orchestrator.config.load import to_experiment
        from orchestrator.config.validation import validate

        global sweep_size, _sweep_lock
        params = OmegaConf.select(config, "hydra.sweeper.params") or {}
        task = [f"{k}={v}" for k, v in params.items()] + task
        combos = expand_sweep(task, GlobalHydra.instance().config_loader())
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            _sweep_lock = results.RunDirLock(sweep_dir)
        except ConfigError as err:
            print(ConfigError("hydra.sweep.dir", err.problem, err.allowed).line(),
                  file=sys.stderr)
            sys.exit(CONFIG_ERROR_EXIT_CODE)
        sweep_size = len(combos)
        # compose() builds its own search path: the command line's extra config dirs with it
        search = [str(p) for p in OmegaConf.select(config, "hydra.searchpath") or []]
        extra = [f"hydra.searchpath=[{','.join(search)}]"] if search else []
        for combo in combos:  # every point, before the first runs
            try:
                check_group_overrides(combo)  # sync=glob(*) takes the schema base_sync too
                composed = compose(config_name="config", overrides=[*combo, *extra])
                check_group_change(combo, composed.sync)
                validate(to_experiment(composed))
            except Exception as ex:
                point_error_exit(ex, combo)


def stop_sweep(ex: BaseException, task: Sequence[str]) -> None:
    """A sweep that cannot be expanded or whose folder cannot be made: one line and exit 2 for
    a config error (the field named), 1 for anything else; never a traceback, never a run."""
    from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE
    from orchestrator.config.hydra_errors import (
        blame_interpolated_field,
        config_error_from_hydra,
        path_too_long,
    )

    err = config_error_from_hydra(ex) or path_too_long(ex, task)
    if err is None:
        print(f"error: the sweep could not be validated: {type(ex).__name__}: {ex}",
              file=sys.stderr)
        sys.exit(1)
    print(blame_interpolated_field(err, list(task)).line(), file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT_CODE)
