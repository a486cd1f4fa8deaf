"""The tool's version and the words its user ran it by, for ``--version``, usage lines and help.

Every command says the version of *this* tool (not Hydra's), and names itself as the user
typed it: ``transient-validate`` when they ran the installed script, ``python -m
orchestrator.validate`` when they ran the module. Help points at the documentation shipped in
the package (``orchestrator/docs`` is the checkout's ``docs/``, packaged like ``conf/``), which
an installed user has on disk; the project publishes no web address (pyproject has no
``[project.urls]``).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

# the version is read where the trainer, which a host runs without this package, reads it too
from trainer.layout import DISTRIBUTION, tool_version

__all__ = ["DISTRIBUTION", "add_version_argument", "docs_path", "prog_name", "tool_version",
           "version_line"]

_PACKAGE = Path(__file__).resolve().parent


def _scripts() -> dict[str, str]:
    """Module → installed console script (``orchestrator.validate`` → ``transient-validate``),
    from the distribution's entry points: the one place they are declared is pyproject.toml."""
    try:
        eps = metadata.distribution(DISTRIBUTION).entry_points
    except metadata.PackageNotFoundError:
        return {}
    return {ep.module.removesuffix(".__main__"): ep.name
            for ep in eps if ep.group == "console_scripts"}


def ran_as_script() -> bool:
    """True when the process is an installed console script (argv[0] is not a .py file, as it
    is for ``python -m``)."""
    return bool(sys.argv) and not sys.argv[0].endswith(".py") and sys.argv[0] not in ("", "-c")


def prog_name(module: str) -> str:
    """How the user runs `module`: its installed script's name when they ran one, else
    ``python -m module``."""
    if ran_as_script():
        script = _scripts().get(module)
        if script is not None:
            return script
    return f"python -m {module}"


def version_line(module: str) -> str:
    """What ``--version`` prints: ``transient-validate 0.1.0``."""
    return f"{prog_name(module)} {tool_version()}"


def add_version_argument(parser: argparse.ArgumentParser, module: str) -> None:
    """``--version`` on an argparse command, printing this tool's version."""
    parser.add_argument("--version", action="version", version=version_line(module),
                        help="print the tool's version and exit")


def docs_path(name: str = "") -> str:
    """Where the documentation page `name` (``configuration.md``) is on this machine: in the
    installed package, or the checkout's docs/ (the same folder, linked)."""
    return str(_PACKAGE / "docs" / name) if name else str(_PACKAGE / "docs")


def register_resolvers() -> None:
    """``${prog:MODULE}`` and ``${docs:PAGE}`` for the help text in conf/config.yaml."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("prog"):
        OmegaConf.register_new_resolver("prog", prog_name)
    if not OmegaConf.has_resolver("docs"):
        OmegaConf.register_new_resolver("docs", docs_path)
