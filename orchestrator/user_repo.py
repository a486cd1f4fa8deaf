"""The user's own repository: their experiments and config groups, found before the packaged ones.

A user keeps experiments in *their* git repository, not in the tool's::

    my-lab/
      experiments/resnet_sweep.yaml   ->  +experiment=resnet_sweep
      conf/provider/lab.yaml          ->  provider=lab   (any group: cluster/, job/, pricing/ ...)
      outputs/ multirun/              ->  results (the folder the command runs from)

The repository is the nearest folder, from the current one up to the git work tree's root,
that has an ``experiments/`` or ``conf/`` folder (``$TRANSIENT_REPO`` names it explicitly).
Hydra reads it through its own plugin mechanism: :mod:`hydra_plugins.transient_launcher.user_repo`
puts a ``userrepo://<root>`` config source on the search path before the packaged config
(``pkg://orchestrator.conf``), so a user's file wins over a packaged one of the same name. The
tool's own checkout is not a user repository (its folders ARE the packaged config).

This module imports nothing heavy: Hydra's plugin scan imports the plugin at every start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from orchestrator.config.errors import ConfigError
from orchestrator.paths import CONF_DIR

#: Names the user repository explicitly (no search from the current folder).
ROOT_ENV = "TRANSIENT_REPO"
EXPERIMENTS = "experiments"  # the user's experiments: <root>/experiments/NAME.yaml
CONF = "conf"  # the user's config groups: <root>/conf/<group>/NAME.yaml
SCHEME = "userrepo"  # Hydra search-path scheme of the user repository's config source
PROVIDER = "transient-orchestrator user repository"  # its search-path provider name

# Experiment files pinned by name for this process (`orchestrator.validate` of a file outside
# any repository): they win over every other file of that name.
_pinned: dict[str, Path] = {}


def find_root(start: Path | None = None) -> Path | None:
    """The user repository for a command run in ``start`` (default: the current folder).

    ``$TRANSIENT_REPO`` if set; else the nearest of ``start`` and its parents that has an
    ``experiments/`` or ``conf/`` folder, not looking above a git work tree's root (a folder
    with ``.git``). None when there is none. This may be the tool's own checkout.
    """
    named = os.environ.get(ROOT_ENV)
    if named:
        return Path(named).expanduser().resolve()
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / EXPERIMENTS).is_dir() or (candidate / CONF).is_dir():
            return candidate
        if (candidate / ".git").exists():
            return None
    return None


def is_tool_checkout(root: Path) -> bool:
    """True when ``root`` is this tool's own source checkout (its conf/ is the packaged one)."""
    with contextlib.suppress(OSError):
        return (root / CONF).resolve() == CONF_DIR.resolve()
    return False


def user_root(start: Path | None = None) -> Path | None:
    """The user repository to put on Hydra's search path: :func:`find_root` unless that is the
    tool's own checkout (whose config already is the packaged one)."""
    root = find_root(start)
    if root is None or is_tool_checkout(root):
        return None
    return root


def experiment_dirs(root: Path) -> list[Path]:
    """Where a repository's experiments live: ``experiments/``, and ``conf/experiment/`` (the
    group's own folder, as in the tool's checkout); the same folder counted once."""
    dirs: list[Path] = []
    for folder in (root / EXPERIMENTS, root / CONF / "experiment"):
        if folder.is_dir() and all(folder.resolve() != d.resolve() for d in dirs):
            dirs.append(folder)
    return dirs


def experiment_files(root: Path) -> list[Path]:
    """Every ``*.yaml`` experiment of a repository, sorted by folder then name."""
    return [f for d in experiment_dirs(root) for f in sorted(d.glob("*.yaml"))]


def experiment_candidates(root: Path | None, name: str) -> list[Path]:
    """The files that define experiment ``name`` (a path below the experiment group, without
    ``.yaml``): a pinned file alone, else every repository folder's file of that name."""
    if name in _pinned:
        return [_pinned[name]]
    if root is None:
        return []
    return [d / f"{name}.yaml" for d in experiment_dirs(root) if (d / f"{name}.yaml").is_file()]


def ambiguity_error(name: str, files: list[Path]) -> ConfigError:
    """Two user files define one experiment: the user must keep one."""
    return ConfigError("experiment", f"'{name}' is ambiguous: defined by "
                       + " and by ".join(str(f) for f in files), "keep one of them")


def shown(path: Path) -> str:
    """A file as a message names it: relative to the current folder when below it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def config_file(config_path: str) -> Path | None:
    """The user's file (or the file pinned) that Hydra's ``experiment/NAME`` or
    ``GROUP/NAME`` stands for; None when it is a packaged one."""
    group, _, name = config_path.partition("/")
    if group == "experiment":
        found = experiment_candidates(user_root(), name)
        return found[0] if found else None
    root = user_root()
    path = root / CONF / f"{config_path}.yaml" if root is not None else None
    return path if path is not None and path.is_file() else None


def not_text_error(path: Path, ex: UnicodeDecodeError) -> ConfigError:
    """A config file that is not UTF-8 text (binary content, or another encoding): the file,
    and a byte that is not."""
    return ConfigError(shown(path), f"is not UTF-8 text (it holds the byte 0x"
                       f"{ex.object[ex.start]:02x})", "a YAML file saved as UTF-8")


@contextlib.contextmanager
def pinned(files: Mapping[str, Path]) -> Iterator[None]:
    """Within the block, ``+experiment=NAME`` reads the given file for each NAME."""
    before = dict(_pinned)
    _pinned.update({name: path.resolve() for name, path in files.items()})
    try:
        yield
    finally:
        _pinned.clear()
        _pinned.update(before)


def pinned_names() -> set[str]:
    return set(_pinned)


def where_looked(group: str, start: Path | None = None) -> str:
    """Where ``group=NAME`` was looked for, in search order, for a "not found" message."""
    root = user_root(start)
    packaged = "the packaged examples" if group == "experiment" else "the packaged options"
    if root is None:
        found = find_root(start)
        if found is not None:  # the tool's own checkout: its folders are the packaged config
            folder = found / (EXPERIMENTS if group == "experiment" else f"{CONF}/{group}")
            return f"looked in {folder}/"
        here = Path.cwd() if start is None else start
        return (f"looked in {packaged} only: no {EXPERIMENTS}/ or {CONF}/ folder in {here} or "
                f"its parents (your repository's root; or set ${ROOT_ENV})")
    places = ([str(d) + "/" for d in experiment_dirs(root)] or [f"{root / EXPERIMENTS}/"]) \
        if group == "experiment" else [f"{root / CONF / group}/"]
    return f"looked in {', '.join(places)} and {packaged}"


def explain_missing(err: ConfigError, start: Path | None = None) -> ConfigError:
    """Say where an unknown group option was looked for (and spot a ``.yml`` file Hydra skips)."""
    if not err.problem.startswith("unknown option") or "." in err.path:
        return err
    group = err.path
    name = err.problem.split("'")[1] if err.problem.count("'") >= 2 else ""
    hint = where_looked(group, start)
    root = user_root(start)
    if root is not None and name:
        folders = experiment_dirs(root) if group == "experiment" else [root / CONF / group]
        for folder in folders:
            if (folder / f"{name}.yml").is_file():
                hint += f"; found {folder / name}.yml: rename it to {name}.yaml"
    allowed = f"{hint}; {err.allowed}" if err.allowed else hint
    return ConfigError(err.path, err.problem, allowed)
