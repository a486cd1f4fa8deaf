"""``python -m orchestrator.validate [FILES]``: compose and validate experiment YAMLs.

Usage::

    python -m orchestrator.validate                 # every YAML under experiments/
    python -m orchestrator.validate my_exp.yaml     # given files (composed as +experiment=...)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.validation import validate
from orchestrator.paths import CONF_DIR, EXPERIMENTS_DIR


def compose_experiment(name: str, overrides: Sequence[str] = (),
                       extra_search_dir: Path | None = None) -> ExperimentConfig:
    """Compose ``+experiment=name`` with the defaults, then schema-check and validate it."""
    from hydra import compose, initialize_config_dir
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.config.errors import from_omegaconf
    from orchestrator.config.hydra_errors import (
        check_group_overrides,
        config_error_from_hydra,
        exact_item_error,
        explain,
    )
    from orchestrator.config.schema import register_configs, to_experiment

    register_configs()
    check_group_overrides(overrides)
    args = [f"+experiment={name}", *overrides]
    if extra_search_dir is not None:
        args.append(f"hydra.searchpath=[file://{extra_search_dir}]")
    try:
        try:
            with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
                composed = compose("config", overrides=args)
            cfg = to_experiment(composed)
        except OmegaConfBaseException as ex:
            raise from_omegaconf(ex) from None
        except ConfigError:
            raise
        except Exception as ex:
            err = config_error_from_hydra(ex)
            if err is None:
                raise
            raise err from None
    except ConfigError as err:
        raise explain(exact_item_error(err, args[:len(args) - (extra_search_dir is not None)],
                                       extra_search_dir)) from None
    validate(cfg)
    return cfg


def validate_files(paths: Sequence[Path]) -> dict[Path, str | None]:
    """Validate each experiment file as a dry run would (compose, validate, plan).

    Returns file -> error line (None when valid); every file is checked, whatever the others do.
    """
    from orchestrator.config.hydra_errors import check_yaml_file
    from orchestrator.plan import make_plan

    results: dict[Path, str | None] = {}
    for path in paths:
        path = path.resolve()
        try:
            check_yaml_file(path)
            if path.parent == EXPERIMENTS_DIR.resolve():
                cfg = compose_experiment(path.stem)
            else:  # a file elsewhere: expose it as the experiment group of a temporary root
                with tempfile.TemporaryDirectory() as tmp:
                    group = Path(tmp) / "experiment"
                    group.mkdir()
                    shutil.copy(path, group / path.name)
                    cfg = compose_experiment(path.stem, extra_search_dir=Path(tmp))
            make_plan(cfg)
            results[path] = None
        except ConfigError as err:
            results[path] = err.line()
        except Exception as ex:  # report it as this file's failure, check the rest
            text = str(ex).strip().splitlines()
            results[path] = f"error: {type(ex).__name__}: {text[0] if text else ''}"
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.validate",
        description="Compose and validate experiment YAMLs with the defaults; "
        "exit 1 listing each bad file with its error.",
    )
    parser.add_argument("paths", nargs="*", type=Path,
                        help="experiment files (default: every experiments/*.yaml)")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(EXPERIMENTS_DIR.glob("*.yaml"))
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print(f"no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    results = validate_files(paths)
    bad = {p: e for p, e in results.items() if e}
    for path, err in results.items():
        print(f"{'FAIL' if err else 'ok  '} {path.name}" + (f": {err}" if err else ""))
    print(f"{len(results) - len(bad)} valid, {len(bad)} invalid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
