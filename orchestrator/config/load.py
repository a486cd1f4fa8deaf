"""Loading a composed config: a Hydra/OmegaConf DictConfig into validated-type dataclasses
(:class:`orchestrator.config.schema.ExperimentConfig`), and every OmegaConf error into one
:class:`orchestrator.config.errors.ConfigError` naming the field as the user types it.

The schema modules hold data only and the error module is a leaf; this module reads both, so
the config room has no import circle.
"""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, FloatNode, IntegerNode, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)

from orchestrator.config.errors import ConfigError, pasteable
from orchestrator.config.schema import ExperimentConfig
from provisioning.base import ProviderConfig
from provisioning.gce.billing import live_pricing
from provisioning.registry import backend, provider_names

#: Keys that were settings once, and what decides them now.
REMOVED_KEYS = {
    "sim.market": "the simulated market follows pricing.transient_market (preemptible in "
                  "pricing=papers_2019, spot in pricing=gce), as a real run's would",
}



def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


# Dataclasses that live in lists: OmegaConf reports their errors without the list's path.
_LIST_ITEM_PATHS = {
    "WorkerGroup": "cluster.worker_groups.*",
    "SyncPhase": "sync.phases.*",
    "RevocationEventConfig": "revocation.events.*",
    "StragglerInjection": "straggler.injections.*",
    "SshHostConfig": "provider.hosts.*",  # a lab inventory's machine (provider=ssh)
}


def full_key(ex: OmegaConfBaseException) -> str:
    """The key OmegaConf's error names, as text (a list index comes as an int, 0 included)."""
    key = getattr(ex, "full_key", None)
    return "" if key is None else str(key)


def anchored(key: str, within: str) -> str:
    """The full dotted path of ``key``, a key OmegaConf reported relative to the node it was
    assigning when it failed, inside the override whose key is ``within``.

    OmegaConf names the key relative to the container being built: ``0`` for the first item of
    ``sync.phase_hparams=[0.1]``, ``h100`` for ``+pricing.gpus.h100.x=3`` (the node it could not
    create). The override's key holds the rest: where ``key`` is a run of its segments, the path
    ends there; otherwise ``key`` lies below it.
    """
    key, within = pasteable(key), pasteable(within)
    if not within:
        return key
    if not key:
        return within
    parts, sub = within.split("."), key.split(".")
    if key.startswith(within + ".") or key == within:
        return key
    for end in range(len(parts), 0, -1):
        if parts[max(0, end - len(sub)):end] == sub:
            return ".".join(parts[:end])
    return f"{within}.{key}"


def from_omegaconf(ex: OmegaConfBaseException, within: str = "") -> ConfigError:
    """Translate an OmegaConf error (raised while merging into the schema) to a ConfigError.

    An error inside a list item carries only the item's key (OmegaConf checks the item before
    it is attached to the list); :func:`item_path_from_data` then finds the index. ``within``:
    the key of the override being merged, which the error's key is relative to
    (:func:`anchored`).
    """
    object_type = getattr(getattr(ex, "object_type", None), "__name__", None)
    # a key inside a list item is relative to the item: error_from_message() names the list
    path = pasteable(full_key(ex)) if object_type in _LIST_ITEM_PATHS \
        else anchored(full_key(ex), within)
    msg = _first_line(getattr(ex, "msg", None) or str(ex))
    if isinstance(ex, InterpolationResolutionError | GrammarParseError):
        return interpolation_error(ex)
    if isinstance(ex, MissingMandatoryValue):
        return ConfigError(path, "required value is missing", "set it in the YAML or on the CLI")
    return error_from_message(path, msg, key_error=isinstance(ex, ConfigKeyError),
                              object_type=object_type)


def error_from_message(path: str, msg: str, key_error: bool = False,
             object_type: str | None = None, source: str | None = None) -> ConfigError:
    """The ConfigError for an OmegaConf message about the field at ``path`` (in the YAML file
    ``source``, when it came from one).

    A key inside a list item is reported with the list's path and ``*`` for the index until the
    caller (which has the data) replaces it with the index at fault (:func:`resolve_item`).
    """
    path = pasteable(path)
    if "." not in path and object_type in _LIST_ITEM_PATHS:
        path = f"{_LIST_ITEM_PATHS[object_type]}.{path}"
    m = re.search(r"Merge error: (\w+) is not a subclass of (\w+)\. value: (.*)", msg)
    if m:  # a whole section given as a scalar (`sync: bsp`): OmegaConf names no key
        path = path or _field_of_type(object_type, m.group(2)) or ""
        if m.group(1) == "str" and _is_group(path):
            where = f" in {source}" if source else ""
            return ConfigError(path, f"set to '{m.group(3)}' as a plain key{where}, but {path} "
                               "is a config group: its option is chosen in a defaults list",
                               f"write 'defaults: [override /{path}: {m.group(3)}]' in the "
                               f"file, or {path}={m.group(3)} on the command line")
        return ConfigError(path, f"expected a mapping ({m.group(2)}), got {_a(m.group(1))}",
                           "write it as {key: value}")
    m = re.search(r"Invalid type assigned: (\w+) is not a subclass of (\w+)", msg)
    if m and m.group(1) == "dict" and "." in path and not _field_is_list(path.rsplit(".", 1)[0]):
        # `+pricing.gpus.h100.x=3`: OmegaConf cannot build a new entry of a mapping of
        # structured values one key at a time (it creates the entry empty first)
        parent, name = path.rsplit(".", 1)
        return ConfigError(path, f"no such entry in {parent}, and a new {m.group(2)} cannot be "
                           "added from the command line",
                           f"add it whole in an experiment file: {parent}: {{{name}: "
                           f"{{{_keys(path)}}}}}")
    if m and m.group(1) == "dict":  # hydra made an empty item for an index past the end
        index = path.rsplit(".", 1)[-1]
        fewer = "the list is empty" if index == "0" else \
            f"the list has fewer than {int(index) + 1 if index.isdigit() else 0} items"
        return ConfigError(path, f"no such item: {fewer}" if index.isdigit() else "no such item",
                           f"replace the whole list: '{path.rsplit('.', 1)[0]}=[{{...}}, ...]'")
    if m:
        return ConfigError(path, f"expected a mapping ({m.group(2)}), got {_a(m.group(1))}")
    m = re.search(r"Key '([^']+)' (?:not in|is not in struct)", msg)
    if key_error or m:
        key = m.group(1) if m else path.rsplit(".", 1)[-1]
        if path in REMOVED_KEYS:
            return ConfigError(path, "no longer a setting", REMOVED_KEYS[path])
        return ConfigError(path, f"unknown key '{key}'", _valid_keys_hint(path, object_type))
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
    m = re.search(r"Cannot assign (\w+) to (Dict|List)\[", msg) or \
        re.search(r"'(ListConfig|DictConfig)' is incompatible with type hint '(?:typing\.)?(Dict|List)", msg)
    if m:  # an item of a list of mappings (or lists) given as something else
        got = {"ListConfig": "list", "DictConfig": "mapping"}.get(m.group(1), m.group(1))
        if m.group(2) == "Dict":
            return ConfigError(path, f"expected a mapping, got {_a(got)}",
                               "write it as {key: value}")
        return ConfigError(path, f"expected a list, got {_a(got)}", "write it as [a, b, ...]")
    m = re.search(r"'(ListConfig|DictConfig)' is incompatible with type hint '<class '(\w+)'>'",
                  msg)
    if m:  # a list or mapping where one value belongs (an item of a mapping of numbers)
        got = {"ListConfig": "list", "DictConfig": "mapping"}[m.group(1)]
        kind = {"float": "Float", "int": "Integer", "bool": "Boolean"}.get(m.group(2), m.group(2))
        return ConfigError(path, f"expected {_type_hint(kind)}, got {_a(got)}",
                           "write one value here")
    m = re.search(r"Invalid value assigned: (\w+) is not a ListConfig", msg)
    if m:
        return ConfigError(path, f"expected a list, got {_a(m.group(1))}",
                           "write it as [a, b, ...]")
    m = re.search(r"Cannot convert '(\w+)' to string", msg)
    if m:  # a list or mapping given for a text field
        got = {"dict": "mapping"}.get(m.group(1), m.group(1))
        return ConfigError(path, f"expected one value, got {_a(got)}", "write one value here")
    m = re.search(r"is not a valid input for <enum '(\w+)'>", msg)
    if m:  # a list or mapping given for a field with a fixed set of values
        values = _enum_values(m.group(1))
        return ConfigError(path, "expected one value", f"one of: {values}" if values else None)
    if re.search(r"Cannot merge (Dict|List)Config with (Dict|List)Config", msg):
        if _field_is_list(path):
            return ConfigError(path, "expected a list, got a mapping", "write it as [a, b, ...]")
        return ConfigError(path, "expected a mapping, got a list", "write it as {key: value}")
    if re.search(r"field '[^']*' is not Optional", msg):
        return ConfigError(path, "must not be null", "give it a value")
    if "Missing mandatory value" in msg:
        return ConfigError(path, "required value is missing", "set it in the YAML or on the CLI")
    return ConfigError(path, msg)


def _a(word: str) -> str:
    """``an int``, ``a float``: the type name with its article."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _type_hint(kind: str) -> str:
    return {
        "Integer": "a whole number",
        "Float": "a number",
        "Boolean": "true or false",
    }.get(kind, kind.lower())


def _schema_fields() -> list[tuple[str, object]]:
    """(dotted path, type hint) of every field of the schema; list and mapping items as ``*``."""
    from dataclasses import fields, is_dataclass
    from typing import get_args, get_type_hints


    out: list[tuple[str, object]] = []

    def walk(node: type, prefix: str) -> None:
        hints = get_type_hints(node)
        for f in fields(node):
            hint = hints[f.name]
            out.append((prefix + f.name, hint))
            inner: object = hint
            suffix = ""
            while inner is not None and not (isinstance(inner, type) and is_dataclass(inner)):
                args = [a for a in get_args(inner) if a is not type(None)]
                if getattr(inner, "__origin__", None) in (list, dict):
                    suffix += ".*"
                inner = args[-1] if args else None
            if isinstance(inner, type) and is_dataclass(inner):
                walk(inner, f"{prefix}{f.name}{suffix}.")

    walk(ExperimentConfig, "")
    return out


def _field_of_type(object_type: str | None, class_name: str) -> str | None:
    """The field holding a ``class_name`` inside the dataclass named ``object_type`` (OmegaConf
    names the two when it cannot merge a scalar into a section, but not the key)."""
    known = _schema_fields()
    names = {path: getattr(hint, "__name__", None) for path, hint in known}
    names[""] = "ExperimentConfig"
    fits = [path for path, hint in known if getattr(hint, "__name__", None) == class_name]
    if not fits:  # a subclass the field's type stands for (provider: each backend's schema)
        from provisioning.registry import all_backends

        named = [b.config for b in all_backends() if b.config.__name__ == class_name]
        fits = [path for path, hint in known if named and isinstance(hint, type)
                and issubclass(named[0], hint)]
    # OmegaConf names the root as the object for a nested section too (cluster.recovery: 3)
    inside = [p for p in fits if names.get(p.rsplit(".", 1)[0] if "." in p else "") == object_type]
    return (inside or fits or [None])[0]


def _enum_values(name: str) -> str | None:
    """The values of the schema's enum named ``name``, comma-separated."""
    import enum

    for _, hint in _schema_fields():
        inner = [hint, *getattr(hint, "__args__", ())]
        for kind in inner:
            if isinstance(kind, type) and issubclass(kind, enum.Enum) and kind.__name__ == name:
                return ", ".join(str(v.value) for v in kind)
    return None


def _is_group(path: str) -> bool:
    """Whether ``path`` is a config group (a folder of options under conf/)."""
    from orchestrator.paths import CONF_DIR

    return bool(path) and "." not in path and (CONF_DIR / path).is_dir()


def _keys(path: str) -> str:
    """``key: ...`` for each field of the dataclass at ``path`` (a new mapping entry)."""
    hint = (_valid_keys_hint(path + ".x") or "").removeprefix("valid keys: ")
    return ", ".join(f"{k}: ..." for k in hint.split(", ") if k) or "..."


def _field_is_list(path: str) -> bool:
    """Whether the schema declares the field at ``path`` a list."""
    from dataclasses import is_dataclass
    from typing import get_args, get_origin, get_type_hints


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


def _backend_schema(name: str | None) -> type | None:
    """A backend's schema, or a dataclass among its fields (``SshHostConfig``), by class name."""
    from provisioning.registry import all_backends

    for registered in all_backends() if name else ():
        hints = get_type_hints(registered.config).values()
        for kind in (registered.config, *(k for h in hints for k in (h, *get_args(h)))):
            if isinstance(kind, type) and is_dataclass(kind) and kind.__name__ == name:
                return kind
    return None


def _valid_keys_hint(path: str, object_type: str | None = None) -> str | None:
    """List the schema's keys at the parent of ``path`` so a typo shows its fix.

    ``object_type``: the class OmegaConf names in its error. Where it is a backend's own
    schema below the field's declared type (``provider`` is declared as the base ProviderConfig,
    a provider file composes against SshProviderConfig), or a dataclass inside one that the
    declared types do not reach (``provider.hosts.1``: SshHostConfig), its keys are the ones to
    list.
    """
    from dataclasses import fields, is_dataclass
    from typing import get_args, get_origin, get_type_hints


    node: object = ExperimentConfig
    item_keys = 0  # path parts that are list indices or mapping keys, not fields
    for part in path.split(".")[:-1]:
        if item_keys:
            item_keys -= 1
            continue  # an item: node is already the item's dataclass
        if part.isdigit() or part == "*":
            continue
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        hint = get_type_hints(node).get(part)
        # unwrap list[X], dict[str, X] and X | None down to the dataclass, if any
        while hint is not None and not (isinstance(hint, type) and is_dataclass(hint)):
            item_keys += get_origin(hint) in (list, dict)
            inner = [a for a in get_args(hint) if a is not type(None)]
            hint = inner[-1] if inner else None
        node = hint
    named = _backend_schema(object_type)
    if named is not None and (node is None
                              or (isinstance(node, type) and issubclass(named, node))):
        node = named
    if isinstance(node, type) and is_dataclass(node):
        return "valid keys: " + ", ".join(f.name for f in fields(node))
    return None


def to_experiment(cfg: DictConfig | dict[str, Any]) -> ExperimentConfig:
    """Re-merge a composed config into a fresh schema and return real dataclasses.

    Re-merging catches what Hydra lets through: keys added with ``+`` that the schema does not
    know, and values of the wrong type. Raises :class:`ConfigError` naming the field.
    """


    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except (InterpolationResolutionError, GrammarParseError):
            raise unresolvable_field(cfg) or ConfigError("overrides", "an interpolation "
                                                        "cannot be resolved") from None
    else:
        data = cfg
    assert isinstance(data, dict)
    data = {k: v for k, v in data.items() if k != "hydra"}
    check_list_items(ExperimentConfig, data)
    schema = OmegaConf.structured(ExperimentConfig)
    provider = data.get("provider")
    if isinstance(provider, dict) and provider.get("name") in provider_names():
        check_provider_name(provider)
        # the backend's own schema (a ProviderConfig subclass) checks its options
        schema.provider = OmegaConf.structured(backend(provider["name"]).config)
    elif isinstance(provider, dict):  # an unknown backend: validation names provider.name
        base = {f.name for f in fields(ProviderConfig)}
        data["provider"] = {k: v for k, v in provider.items() if k in base}
    try:
        merged = OmegaConf.merge(schema, data)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as ex:
        raise from_omegaconf(ex) from None
    assert isinstance(obj, ExperimentConfig)
    if str(obj.pricing.live).lower() not in ("auto", "true", "false"):
        raise ConfigError("pricing.live", f"is {obj.pricing.live!r}; use auto, true or false")
    obj.pricing = live_pricing(obj.pricing)  # the one place composed prices are finalised
    return obj


#: How an unresolvable ``${...}`` starts its problem (:func:`interpolation_error`).
UNRESOLVABLE = "cannot resolve its ${...}"


def unresolvable_field(cfg: DictConfig) -> ConfigError | None:
    """The first field (outside ``hydra``) whose ``${...}`` cannot be resolved, as one
    ConfigError naming it; None when every field resolves.

    Resolving the whole config at once (``to_container``) names no field; each field is
    resolved on its own here, so the error names the one the user wrote
    (``description=${nonexistent}`` -> ``description``), also when Hydra first tripped over it
    inside ``hydra.run.dir`` (``name=${...}``).
    """

    def walk(node: Any) -> ConfigError | None:
        keys = range(len(node)) if isinstance(node, ListConfig) else \
            [k for k in node if not (node is cfg and k == "hydra")]
        for key in keys:
            try:
                value = node[key]
            except (InterpolationResolutionError, GrammarParseError) as ex:
                return interpolation_error(ex)
            except OmegaConfBaseException:
                continue  # a missing value: the schema's merge names it
            if isinstance(value, DictConfig | ListConfig):
                found = walk(value)
                if found is not None:
                    return found
        return None

    return walk(cfg)


def interpolation_error(ex: OmegaConfBaseException) -> ConfigError:
    """One line for a field whose ``${...}`` cannot be resolved, with what to write instead."""
    msg = _first_line(getattr(ex, "msg", None) or str(ex))
    msg = re.sub(r"^\w+Error raised while resolving interpolation: ", "", msg).strip("\"'")
    if "Environment variable" in msg:
        hint = "set the variable, or give a default: ${oc.env:NAME,default}"
    elif "Recursive" in msg:
        hint = "the value refers back to itself through other ${...}"
    elif isinstance(ex, UnsupportedInterpolationType):
        hint = "${key} names another key; resolvers: ${oc.env:NAME}, ${oc.select:key,default}"
    else:
        hint = "${key} names another key of the config, e.g. ${name}"
    return ConfigError(pasteable(full_key(ex)) or "overrides",
                       f"{UNRESOLVABLE}: {msg[:1].lower()}{msg[1:]}", hint)


def check_provider_name(provider: dict[str, Any]) -> None:
    """``provider.name=gce`` where ``provider=gce`` was meant: the name picks the schema, but
    the settings came from the group's option, another backend's; saying their first key is
    unknown would blame a key the user never wrote. Raises ConfigError naming provider.name."""

    name = provider["name"]
    known = {f.name for f in fields(backend(name).config)}
    if set(provider) <= known:
        return
    owners = [b for b in provider_names() if b != name
              and set(provider) <= {f.name for f in fields(backend(b).config)}]
    if owners:
        raise ConfigError("provider.name", f"'{name}' names another backend than the "
                          f"provider's settings, which are provider={owners[0]}'s",
                          f"choose the backend with provider={name}, not provider.name={name}")


def check_list_items(schema: type, data: Any, path: str = "") -> None:
    """Merge every item of a list of dataclasses on its own, so an error names its index.

    OmegaConf checks a list item before attaching it to the list, so its errors carry only the
    item's own key; this walk gives them the dotted path a user can paste back as an override
    (``cluster.worker_groups.1.count``). Raises :class:`ConfigError`.
    """


    if not isinstance(data, dict):
        return
    hints = get_type_hints(schema)
    for key, value in data.items():
        hint = hints.get(key)
        if hint is None:
            continue
        here = f"{path}{key}"
        if hint is ProviderConfig and isinstance(value, dict) \
                and value.get("name") in provider_names():
            hint = backend(value["name"]).config  # its lists (an SSH inventory's hosts)
        inner = [a for a in get_args(hint) if a is not type(None)]
        if isinstance(hint, type) and is_dataclass(hint):
            check_list_items(hint, value, here + ".")
        elif inner and is_dataclass(inner[0]) and get_origin(hint) is not list:
            check_list_items(inner[0], value, here + ".")  # X | None
        elif get_origin(hint) in (list, dict) and not is_dataclass(inner[-1]):
            check_plain_items(hint, value, here)
        elif get_origin(hint) is list and inner and is_dataclass(inner[0]):
            if not isinstance(value, list):
                continue  # the whole-config merge reports the wrong type
            for i, item in enumerate(value):
                item_path = f"{here}.{i}"
                if not isinstance(item, dict):
                    raise ConfigError(item_path, f"expected a mapping of {inner[0].__name__} "
                                      f"keys, got '{item}'")
                try:
                    OmegaConf.merge(OmegaConf.structured(inner[0]), item)
                except OmegaConfBaseException as ex:
                    err = from_omegaconf(ex)
                    key_in_item = pasteable(full_key(ex))
                    raise ConfigError(f"{item_path}.{key_in_item}".rstrip("."), err.problem,
                                      err.allowed) from None
                check_list_items(inner[0], item, item_path + ".")


_SCALARS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}
# how the merge checks a plain number: run here on an item of a list or mapping, whose error
# OmegaConf reports with the item's index only (`sync.phase_hparams.0`, not `.0.learning_rate`)
_NUMBER_NODES = {int: IntegerNode, float: FloatNode}


def check_plain_items(hint: Any, value: Any, path: str) -> None:
    """The items of a list or mapping of plain values (``list[float]``, ``dict[str, float]``,
    ``list[dict[str, float]]``) are of that shape: OmegaConf lets a list through as an item of
    a ``list[float]`` (``sync.fractions=[[0.5], 0.5]``), which later code would trip over.
    Raises :class:`ConfigError` naming the item."""

    origin, args = get_origin(hint), get_args(hint)
    if origin not in (list, dict) or not args:
        if hint in _SCALARS and isinstance(value, list | dict):
            raise ConfigError(path, f"expected {_SCALARS[hint]}, got a "
                              f"{'list' if isinstance(value, list) else 'mapping'}",
                              "write one value here")
        if hint in _NUMBER_NODES and value is not None:
            try:
                _NUMBER_NODES[hint](value)
            except OmegaConfBaseException:
                kind = "integer" if hint is int else "number"
                raise ConfigError(path, f"'{value}' is not a valid {kind}",
                                  _SCALARS[hint]) from None
        return
    if not isinstance(value, list | dict):
        return  # the merge into the schema reports the wrong type of the whole
    items = enumerate(value) if isinstance(value, list) else value.items()
    for key, item in items:
        check_plain_items(args[-1], item, f"{path}.{key}")
