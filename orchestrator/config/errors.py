"""User-facing config errors: one line, the dotted field, what is wrong and what is allowed.

A leaf: it imports nothing of ours, so every module may raise a :class:`ConfigError`. Turning
OmegaConf's errors into one is :mod:`orchestrator.config.load`'s job (it reads the schema).
"""

from __future__ import annotations

import re

CONFIG_ERROR_EXIT_CODE = 2


class ConfigError(Exception):
    """A config the user wrote is wrong; reported as one line and exit code 2, no traceback."""

    def __init__(self, path: str, problem: str, allowed: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.allowed = allowed
        super().__init__(self.line())

    def line(self) -> str:
        suffix = f" ({self.allowed})" if self.allowed else ""
        return f"config error: {self.path}: {self.problem}{suffix}"


def pasteable(path: str | int) -> str:
    """The dotted form a user can paste back as an override: ``a[0].b`` -> ``a.0.b``."""
    return re.sub(r"\[(\w+)\]", r".\1", str(path)).strip(".")
