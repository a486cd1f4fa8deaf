"""Turn Hydra's composition errors into one-line :class:`ConfigError`s naming the field."""

from __future__ import annotations

import re

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from orchestrator.config.errors import ConfigError, describe, from_omegaconf


def config_error_from_hydra(ex: BaseException) -> ConfigError | None:
    """The ConfigError for a Hydra/OmegaConf exception, or None if it is not a config error."""
    if isinstance(ex, ConfigError):
        return ex
    if isinstance(ex, OmegaConfBaseException):
        return from_omegaconf(ex)
    if isinstance(ex, MissingConfigException):
        return _missing_option(ex)
    if isinstance(ex, OverrideParseException):
        return ConfigError(ex.override or "<override>", _first(str(ex.message)),
                           "see python -m orchestrator --help")
    if isinstance(ex, ConfigCompositionException):
        cause = ex.__cause__
        if isinstance(cause, OmegaConfBaseException):
            return from_omegaconf(cause)
        if isinstance(cause, MissingConfigException):
            return _missing_option(cause)
        msg = str(ex)
        full_key = re.search(r"full_key: (\S+)", msg)
        if full_key:  # an OmegaConf error inside a YAML file, flattened into Hydra's message
            inner = re.search(r"raised while composing config:\n(.*)", msg)
            object_type = re.search(r"object_type=(\w+)", msg)
            return describe(full_key.group(1), inner.group(1) if inner else _first(msg),
                            object_type=object_type.group(1) if object_type else None)
        m = re.search(r"Could not override '([^']+)'", msg)
        if m:
            key = m.group(1)
            return ConfigError(key, "unknown key", "check the spelling; "
                               "python -m orchestrator --cfg job shows every key")
        m = re.search(r"Could not append to config. An item is already at '([^']+)'", msg)
        if m:
            return ConfigError(m.group(1), "already set", f"use {m.group(1)}=... without '+'")
        return ConfigError("<config>", _first(msg))
    return None


def _missing_option(ex: MissingConfigException) -> ConfigError:
    msg = str(ex)
    options = list(getattr(ex, "options", None) or [])
    options = [o for o in options if not o.startswith("base_")]
    m = re.search(r"Could not find '([^']+)'", msg) or re.search(r"'([^']+)'", msg)
    missing = m.group(1) if m else (getattr(ex, "missing_cfg_file", None) or "?")
    group, _, option = missing.rpartition("/")
    path = group or "<config>"
    allowed = "available: " + ", ".join(options) if options else None
    return ConfigError(path, f"unknown option '{option or missing}'", allowed)


def _first(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text
