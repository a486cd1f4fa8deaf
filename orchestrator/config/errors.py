"""User-facing config errors: one line, the dotted field, what is wrong and what is allowed."""

from __future__ import annotations

import re

from omegaconf.errors import (
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

CONFIG_ERROR_EXIT_CODE = 2
#: Keys that were settings once, and what decides them now.
REMOVED_KEYS = {
    "sim.market": "the simulated market follows pricing.transient_market (preemptible in "
                  "pricing=papers_2019, spot in pricing=gce), as a real run's would",
}


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


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# Dataclasses that live in lists: OmegaConf reports their errors without the list's path.
_LIST_ITEM_PATHS = {
    "WorkerGroup": "cluster.worker_groups.*",
    "SyncPhase": "sync.phases.*",
    "RevocationEventConfig": "revocation.events.*",
    "StragglerInjection": "straggler.injections.*",
}


def pasteable(path: str) -> str:
    """The dotted form a user can paste back as an override: ``a[0].b`` -> ``a.0.b``."""
    return re.sub(r"\[(\w+)\]", r".\1", path).strip(".")


def from_omegaconf(ex: OmegaConfBaseException) -> ConfigError:
    """Translate an OmegaConf error (raised while merging into the schema) to a ConfigError.

    An error inside a list item carries only the item's key (OmegaConf checks the item before
    it is attached to the list); :func:`item_path_from_data` then finds the index.
    """
    path = pasteable(getattr(ex, "full_key", None) or "")
    msg = _first_line(getattr(ex, "msg", None) or str(ex))
    if isinstance(ex, MissingMandatoryValue):
        return ConfigError(path, "required value is missing", "set it in the YAML or on the CLI")
    object_type = getattr(getattr(ex, "object_type", None), "__name__", None)
    return describe(path, msg, key_error=isinstance(ex, ConfigKeyError), object_type=object_type)


def describe(path: str, msg: str, key_error: bool = False,
             object_type: str | None = None) -> ConfigError:
    """The ConfigError for an OmegaConf message about the field at ``path``.

    A key inside a list item is reported with the list's path and ``*`` for the index until the
    caller (which has the data) replaces it with the index at fault (:func:`resolve_item`).
    """
    path = pasteable(path)
    if "." not in path and object_type in _LIST_ITEM_PATHS:
        path = f"{_LIST_ITEM_PATHS[object_type]}.{path}"
    m = re.search(r"Invalid type assigned: (\w+) is not a subclass of (\w+)", msg)
    if m and m.group(1) == "dict":  # hydra made an empty item for an index past the end
        index = path.rsplit(".", 1)[-1]
        return ConfigError(path, f"no such item: the list has fewer than {int(index) + 1} items"
                           if index.isdigit() else "no such item",
                           f"replace the whole list: '{path.rsplit('.', 1)[0]}=[{{...}}, ...]'")
    if m:
        return ConfigError(path, f"expected a mapping ({m.group(2)}), got a {m.group(1)}")
    m = re.search(r"Key '([^']+)' (?:not in|is not in struct)", msg)
    if key_error or m:
        key = m.group(1) if m else path.rsplit(".", 1)[-1]
        if path in REMOVED_KEYS:
            return ConfigError(path, "no longer a setting", REMOVED_KEYS[path])
        return ConfigError(path, f"unknown key '{key}'", _valid_keys_hint(path))
    m = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", msg)
    if m:
        return ConfigError(path, f"invalid value '{m.group(1)}'", f"one of: {m.group(2)}")
    m = re.search(r"Value '([^']*)' of type '([^']+)' could not be converted to (\w+)", msg)
    if m:
        word = {"Float": "number"}.get(m.group(3), m.group(3).lower())
        return ConfigError(path, f"'{m.group(1)}' is not a valid {word}", _type_hint(m.group(3)))
    m = re.search(r"Incompatible value '([^']*)' for field of type '([^']+)'", msg)
    if m:
        return ConfigError(path, f"wrong type for '{m.group(1)}'", f"expected {m.group(2)}")
    m = re.search(r"Value (.+) \((\w+)\) is incompatible with type hint '(\w+)'", msg)
    if m:  # OmegaConf's check of a mapping inside a list: it does not convert ints to floats
        value, kind, hint = m.group(1).strip("'"), m.group(2), m.group(3)
        if kind == "int" and hint == "float":
            return ConfigError(path, f"'{value}' must be written as a decimal number here",
                               f"write {value}.0")
        return ConfigError(path, f"'{value}' is not a valid {hint}",
                           _type_hint({"float": "Float", "int": "Integer"}.get(hint, hint)))
    m = re.search(r"Invalid value assigned: (\w+) is not a ListConfig", msg)
    if m:
        return ConfigError(path, f"expected a list, got a {m.group(1)}", "write it as [a, b, ...]")
    if re.search(r"Cannot merge (Dict|List)Config with (Dict|List)Config", msg):
        if _field_is_list(path):
            return ConfigError(path, "expected a list, got a mapping", "write it as [a, b, ...]")
        return ConfigError(path, "expected a mapping, got a list", "write it as {key: value}")
    if re.search(r"field '[^']*' is not Optional", msg):
        return ConfigError(path, "must not be null", "give it a value")
    if "Missing mandatory value" in msg:
        return ConfigError(path, "required value is missing", "set it in the YAML or on the CLI")
    return ConfigError(path, msg)


def _type_hint(kind: str) -> str:
    return {
        "Integer": "a whole number",
        "Float": "a number",
        "Boolean": "true or false",
    }.get(kind, kind.lower())


def _field_is_list(path: str) -> bool:
    """Whether the schema declares the field at ``path`` a list."""
    from dataclasses import is_dataclass
    from typing import get_args, get_origin, get_type_hints

    from orchestrator.config.schema import ExperimentConfig

    parent: object = ExperimentConfig
    hint: object = None
    for part in path.split("."):
        if part.isdigit():
            continue
        if not (isinstance(parent, type) and is_dataclass(parent)):
            return False
        hint = get_type_hints(parent).get(part)
        parent = hint
        while parent is not None and not (isinstance(parent, type) and is_dataclass(parent)):
            inner = [a for a in get_args(parent) if a is not type(None)]
            parent = inner[0] if inner else None
    return get_origin(hint) is list


def _valid_keys_hint(path: str) -> str | None:
    """List the schema's keys at the parent of ``path`` so a typo shows its fix."""
    from dataclasses import fields, is_dataclass
    from typing import get_args, get_type_hints

    from orchestrator.config.schema import ExperimentConfig

    node: object = ExperimentConfig
    for part in path.split(".")[:-1]:
        if part.isdigit() or part == "*":
            continue  # a list item: node is already the item's dataclass
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        hint = get_type_hints(node).get(part)
        # unwrap list[X] and X | None down to the dataclass, if any
        while hint is not None and not (isinstance(hint, type) and is_dataclass(hint)):
            inner = [a for a in get_args(hint) if a is not type(None)]
            hint = inner[0] if inner else None
        node = hint
    if isinstance(node, type) and is_dataclass(node):
        return "valid keys: " + ", ".join(f.name for f in fields(node))
    return None
