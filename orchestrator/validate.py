"""``python -m orchestrator.validate [FILES]`` (or ``transient-validate``): compose and validate
experiment YAMLs as a dry run would, for a user's CI.

Usage, from the root of the repository that holds the experiments::

    python -m orchestrator.validate                 # every experiments/*.yaml of this repository
    python -m orchestrator.validate my_exp.yaml     # given files (composed as +experiment=...)

Files only the machine that runs an experiment holds (SSH keys, known_hosts) are not required
(a CI runner has none): each valid file lists what was not checked; ``--check-machine-files``
requires them, as a run does.

Exit codes: 0 every experiment is valid; 1 at least one is not (each bad file is listed with
its one-line error); 2 nothing was validated: no experiment found (the message says where it
looked), a named file does not exist, or bad arguments. A check that finds nothing fails, so a
CI job that runs in the wrong folder cannot pass.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra_plugins.transient_launcher.register import register_plugins
from orchestrator import user_repo
from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.validation import validate
from orchestrator.version import add_version_argument, prog_name

#: Exit codes (module docstring).
EXIT_VALID, EXIT_INVALID, EXIT_NOTHING = 0, 1, 2


def compose_experiment(name: str, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Compose ``+experiment=name`` with the defaults, then schema-check and validate it.

    The experiment and any group option are found as the command line finds them: the user's
    repository first (:mod:`orchestrator.user_repo`), then the packaged config.
    """
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.config.compose import compose_config
    from orchestrator.config.hydra_errors import (
        check_group_overrides,
        config_error_from_hydra,
        exact_item_error,
        explain,
    )
    from orchestrator.config.load import from_omegaconf, to_experiment

    register_plugins()  # the launcher too: an experiment may choose hydra/launcher=parallel
    check_group_overrides(overrides)
    args = [f"+experiment={name}", *overrides]
    try:
        try:
            cfg = to_experiment(compose_config(args))
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
        raise user_repo.explain_missing(explain(exact_item_error(err, args))) from None
    validate(cfg)
    return cfg


def validate_files(paths: Sequence[Path], machine_files: bool = True,
                   unchecked: dict[Path, list[str]] | None = None) -> dict[Path, str | None]:
    """Validate each experiment file as a dry run would (compose, validate, plan).

    A file in the repository's experiment folders is composed by its name, as the command line
    would find it; any other file is pinned to its name for the check. Returns file -> error
    line (None when valid); every file is checked, whatever the others do. `machine_files`
    False: files only the machine that runs the experiment holds (SSH keys, known_hosts; a CI
    runner has none) are not required, and `unchecked` gets, per file, the fields skipped.
    """
    import contextlib

    from provisioning.base import without_machine_files

    root = user_repo.find_root()
    repo_dirs = {d.resolve() for d in user_repo.experiment_dirs(root)} if root else set()
    results: dict[Path, str | None] = {}
    for path in paths:
        path = path.resolve()
        with contextlib.ExitStack() as stack:
            skipped = None if machine_files else stack.enter_context(without_machine_files())
            results[path] = _validate_file(path, repo_dirs)
        if skipped and unchecked is not None:
            unchecked[path] = sorted(set(skipped))
    return results


def _validate_file(path: Path, repo_dirs: set[Path]) -> str | None:
    """One file of `validate_files`: its error line, None when valid."""
    from orchestrator.config.hydra_errors import check_yaml_file
    from orchestrator.plan import make_plan

    try:
        check_yaml_file(path)
        if path.parent in repo_dirs:
            cfg = compose_experiment(path.stem)
        else:
            with user_repo.pinned({path.stem: path}):
                cfg = compose_experiment(path.stem)
        make_plan(cfg)
        return None
    except ConfigError as err:
        return err.line()
    except Exception as ex:  # report it as this file's failure, check the rest
        text = str(ex).strip().splitlines()
        return f"error: {type(ex).__name__}: {text[0] if text else ''}"


def _described(path: Path) -> str:
    """`` — description [tags]`` as the experiment file says them (the listing's one use of
    the two keys that are there for people), or nothing."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ""
    if not isinstance(data, dict):
        return ""
    text = str(data.get("description") or "").strip()
    tags = data.get("tags") if isinstance(data.get("tags"), list) else []
    shown = " ".join(p for p in (text, f"[{', '.join(map(str, tags))}]" if tags else "") if p)
    return f"  — {shown}" if shown else ""


def _repository_experiments() -> tuple[list[Path], str | None]:
    """The experiments of the repository this runs in, or none and where it looked."""
    root = user_repo.find_root()
    if root is None:
        return [], (f"no experiments to validate: no {user_repo.EXPERIMENTS}/ folder in "
                    f"{Path.cwd()} or its parents; run this from your repository's root, "
                    f"set ${user_repo.ROOT_ENV}, or name the files")
    files = user_repo.experiment_files(root)
    if not files:
        looked = ", ".join(f"{d}/*.yaml" for d in user_repo.experiment_dirs(root)) \
            or f"{root / user_repo.EXPERIMENTS}/ (no such folder)"
        return [], f"no experiments to validate: looked in {looked}"
    return files, None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog_name("orchestrator.validate"),
        description="Compose and validate experiment YAMLs with the defaults (the repository's "
        "own config groups first), as a dry run would. Exit codes: 0 all valid, 1 some invalid "
        "(each listed with its error), 2 nothing validated (no experiment found, no such file).",
    )
    parser.add_argument("paths", nargs="*", type=Path,
                        help="experiment files (default: every experiments/*.yaml of the "
                        "repository this runs in)")
    parser.add_argument("--check-machine-files", action="store_true",
                        help="also require the files only the machine that runs an experiment "
                        "holds (SSH keys, known_hosts): on that machine, not in CI")
    add_version_argument(parser, "orchestrator.validate")
    args = parser.parse_args(argv)
    paths = list(args.paths)
    if not paths:
        paths, nothing = _repository_experiments()
        if nothing:
            print(nothing, file=sys.stderr)
            return EXIT_NOTHING
    missing = [p for p in paths if not p.is_file()]
    if missing:
        print(f"no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return EXIT_NOTHING
    unchecked: dict[Path, list[str]] = {}
    results = validate_files(paths, machine_files=args.check_machine_files, unchecked=unchecked)
    bad = {p: e for p, e in results.items() if e}
    for path, err in results.items():
        print(f"{'FAIL' if err else 'ok  '} {path.name}"
              + (f": {err}" if err else _described(path)))
        if unchecked.get(path):
            print(f"     not checked here: {', '.join(unchecked[path])} (files of the machine "
                  "that runs it; --check-machine-files there)")
    print(f"{len(results) - len(bad)} valid, {len(bad)} invalid")
    return EXIT_INVALID if bad else EXIT_VALID


def run() -> None:
    """Console entry point ``transient-validate``."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
