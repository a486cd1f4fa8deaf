"""Turn Hydra's composition errors into one-line :class:`ConfigError`s naming the field."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from orchestrator.config.errors import ConfigError
from orchestrator.config.load import UNRESOLVABLE, error_from_message, from_omegaconf


def config_error_from_hydra(ex: BaseException) -> ConfigError | None:
    """The ConfigError for a Hydra/OmegaConf exception, or None if it is not a config error."""
    if isinstance(ex, ConfigError):
        return ex
    if isinstance(ex, yaml.MarkedYAMLError):
        return yaml_syntax_error(ex)
    if isinstance(ex, OmegaConfBaseException):
        return from_omegaconf(ex)
    if isinstance(ex, MissingConfigException):
        return _missing_option(ex)
    if isinstance(ex, UnicodeDecodeError):
        path = _file_being_read(ex)
        if path is not None:  # Hydra's own file source (--config-dir, hydra.searchpath)
            from orchestrator import user_repo

            return user_repo.not_text_error(path, ex)
    m = re.search(r"Invalid defaults list in '([^']+)', defaults must be a list \(got (\w+)\)",
                  str(ex)) if isinstance(ex, ValueError) else None
    if m:  # `defaults:` with nothing under it
        kind = m.group(2)
        empty = "empty (null)" if kind == "NoneType" else \
            ("an " if kind[:1] in "aeiou" else "a ") + kind
        from orchestrator import user_repo

        found = user_repo.config_file(m.group(1))
        return ConfigError(user_repo.shown(found) if found else f"{m.group(1)}.yaml",
                           f"its 'defaults:' is {empty}, not a list",
                           "list entries under it, write 'defaults: []', or remove the key")
    if isinstance(ex, OverrideParseException):
        key = (ex.override or "").split("=")[0].lstrip("+~")
        return ConfigError(key or _quoted_field(str(ex.message)), _first(str(ex.message)),
                           "see python -m orchestrator --help")
    if isinstance(ex, ConfigCompositionException):
        cause = ex.__cause__
        msg = str(ex)
        if isinstance(cause, OmegaConfBaseException):
            # OmegaConf names the key relative to the node the override was building
            override = re.match(r"Error merging override (\S+)", msg)
            within = override.group(1).split("=")[0].lstrip("+~").split("@")[0] \
                if override else ""
            return from_omegaconf(cause, within)
        if isinstance(cause, MissingConfigException):
            return _missing_option(cause)
        full_key = re.search(r"full_key: ?(\S*)", msg)
        if full_key:  # an OmegaConf error inside a YAML file, flattened into Hydra's message
            inner = re.search(r"raised while composing config:\n(.*)", msg)
            object_type = re.search(r"object_type=(\w+)", msg)
            source = re.match(r"In '([^']+)'", msg)
            return error_from_message(full_key.group(1), inner.group(1) if inner else _first(msg),
                            object_type=object_type.group(1) if object_type else None,
                            source=f"{source.group(1)}.yaml" if source else None)
        m = re.search(r"Could not override '([^']+)'\. No match in the defaults list", msg)
        if m:  # `experiment=NAME`: a group the defaults list does not name is added with '+'
            group, value = m.group(1), re.search(r"use \+\S+?=(\S+)", msg)
            return ConfigError(group, f"the '+' is missing: {group} is not in the defaults "
                               "list, so it is added, not overridden",
                               f"write +{group}={value.group(1) if value else 'NAME'}")
        m = re.search(r"Could not override '([^']+)'", msg)
        if m:
            key = m.group(1)
            return ConfigError(key, "unknown key", "check the spelling; "
                               "python -m orchestrator --cfg job shows every key")
        m = re.search(r"Multiple values for (\S+)\. To override a value use '([^']+)'", msg)
        if m:
            return ConfigError(m.group(1), "set twice in a defaults list: a later entry for a "
                               "group that already has a default must say 'override'",
                               f"write '- {m.group(2).replace('override ', 'override /')}'")
        m = re.search(r"Could not append to config. An item is already at '([^']+)'", msg)
        if m:
            return ConfigError(m.group(1), "already set", f"use {m.group(1)}=... without '+'")
        return ConfigError(_quoted_field(msg), _first(msg))
    return None


def _file_being_read(ex: BaseException) -> Path | None:
    """The file an exception was raised reading: the innermost frame of its traceback with an
    open text file ``f`` (Hydra's ``FileConfigSource.load_config`` reads through one), which
    Hydra's message never names."""
    tb, path = ex.__traceback__, None
    while tb is not None:
        f = tb.tb_frame.f_locals.get("f")
        name = getattr(f, "name", None)
        if isinstance(name, str) and name.endswith((".yaml", ".yml")):
            path = Path(name)
        tb = tb.tb_next
    return path


def _missing_option(ex: MissingConfigException) -> ConfigError:
    msg = str(ex)
    options = list(getattr(ex, "options", None) or [])
    options = [o for o in options if not o.startswith("base_")]
    m = re.search(r"Could not find '([^']+)'", msg) or re.search(r"'([^']+)'", msg)
    missing = m.group(1) if m else (getattr(ex, "missing_cfg_file", None) or "?")
    group, _, option = missing.rpartition("/")
    path = group or missing
    allowed = "available: " + ", ".join(options) if options else None
    return ConfigError(path, f"unknown option '{option or missing}'", allowed)


def _quoted_field(msg: str) -> str:
    """The first quoted name in a Hydra message, as a dotted field (``sync/bsp`` -> ``sync``)."""
    m = re.search(r"'([A-Za-z_][\w./@+~-]*)'", msg)
    if not m:
        return "overrides"  # nothing better to name: the command line as a whole
    name = m.group(1).lstrip("+~").split("=")[0]
    return name.split("/")[0] if "/" in name else name


def _first(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text


def exact_item_error(err: ConfigError, overrides: Sequence[str],
                     extra_search_dir: Path | None = None) -> ConfigError:
    """Replace a list item's ``*`` index in ``err`` by the index at fault, and name the key at
    fault inside an item that is a mapping of plain values (``sync.phase_hparams.0`` ->
    ``sync.phase_hparams.0.learning_rate``).

    Hydra merges each YAML file into the schema while composing, and OmegaConf reports an
    error inside a list item without the item's index (of a dataclass item) or key (of a
    mapping item). So compose again with the schemas swapped for empty nodes (nothing is
    type-checked), then check the list items one by one
    (:func:`orchestrator.config.load.to_experiment`). If that does not reproduce the error,
    name the whole list (or keep the item): still a field the user can paste back, never a
    ``*``.
    """
    item = re.search(r"\.\d+$", err.path) is not None
    if "*" not in err.path and not item:
        return err
    from orchestrator.config.load import to_experiment

    try:
        to_experiment(_compose_loose(overrides, extra_search_dir))
    except ConfigError as exact:
        if "*" in err.path and "*" not in exact.path:
            return exact
        if item and exact.path.startswith(err.path + "."):
            return exact
    except Exception:  # the loose compose is best effort; fall back below
        pass
    if "*" not in err.path:
        return err
    return ConfigError(err.path.split(".*", 1)[0], err.problem.rstrip() + " in one of its items",
                       err.allowed)


def blame_interpolated_field(err: ConfigError, overrides: Sequence[str],
                             extra_search_dir: Path | None = None) -> ConfigError:
    """An unresolvable ``${...}`` that Hydra met first inside one of its own settings
    (``hydra.run.dir`` holds ``${name}``): name the user's field whose value fails instead,
    found by composing again and resolving field by field. ``err`` as it is otherwise (the
    user's own ``hydra.run.dir=${...}``)."""
    if not err.path.startswith("hydra.") or not err.problem.startswith(UNRESOLVABLE):
        return err
    from omegaconf import OmegaConf

    from orchestrator.config.load import unresolvable_field

    try:
        found = unresolvable_field(OmegaConf.create(_compose_loose(overrides, extra_search_dir)))
    except Exception:  # best effort: the hydra.* field is still a field the user can check
        return err
    return found or err


def path_too_long(ex: BaseException, overrides: Sequence[str]) -> ConfigError | None:
    """A run or sweep folder whose name is too long for the file system (Hydra makes it before
    anything of ours runs): the field it comes from, ``name`` unless the command line set the
    folder itself. None for any other error."""
    import errno

    from orchestrator.config.validation import NAME_MAX_BYTES

    if not isinstance(ex, OSError) or ex.errno != errno.ENAMETOOLONG:
        return None
    parts = Path(str(ex.filename or "")).parts
    longest = max(parts, key=lambda p: len(p.encode()), default="")
    dirs = [o.split("=", 1)[0] for o in overrides
            if o.split("=", 1)[0] in ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")]
    field = dirs[0] if dirs else "name"
    return ConfigError(field, f"'{longest[:40]}...' is {len(longest.encode())} bytes, too long "
                       f"for a folder name (at most {NAME_MAX_BYTES})", "a shorter name")


def _compose_loose(overrides: Sequence[str], extra_search_dir: Path | None) -> dict:
    """The composed config as plain data, without the schemas (see :func:`exact_item_error`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_DIR
    from provisioning.registry import all_backends

    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    args = [_force(o, groups) for o in overrides]
    if extra_search_dir is not None:
        args.append(f"hydra.searchpath=[file://{extra_search_dir}]")
    cs = ConfigStore.instance()
    cs.store(name="base_config", node={})
    for group in ("cluster", "job", "sync", "provider", "pricing", "revocation", "straggler"):
        cs.store(group=group, name=f"base_{group}", node={})
    for registered in all_backends():  # a provider file's `defaults: [ssh_schema]`
        cs.store(group="provider", name=f"{registered.name}_schema", node={})
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            composed = compose("config", overrides=args)
        data = OmegaConf.to_container(composed, resolve=False)
    finally:
        GlobalHydra.instance().clear()
        register_configs()
    assert isinstance(data, dict)
    return data


def _force(override: str, groups: set[str]) -> str:
    """``key=value`` -> ``++key=value`` so a schema key absent from the YAML can still be set."""
    key, sep, _ = override.partition("=")
    bare = key.lstrip("+~")
    if not sep or key.startswith("~") or bare.split("/")[0].split("@")[0] in groups \
            or bare.startswith("hydra") or "." not in bare:
        return override
    return "++" + override.lstrip("+")


def yaml_syntax_error(ex: yaml.MarkedYAMLError, shown_as: str | Path | None = None) -> ConfigError:
    """One line for a YAML syntax error: the user's file, line and column, what is wrong.

    ``shown_as`` names the file when the parser read a copy of it (``orchestrator.validate``
    copies files from elsewhere into a temporary search path).
    """
    mark = ex.problem_mark or ex.context_mark
    where = str(shown_as) if shown_as is not None else (mark.name if mark else "<yaml>")
    if not where.startswith("<"):
        where = os.path.realpath(where)  # conf/experiment/ is a link to experiments/
        if not os.path.relpath(where).startswith(".."):
            where = os.path.relpath(where)  # the user's own spelling under the current folder
    if mark is not None:
        where += f":{mark.line + 1}:{mark.column + 1}"
    problem = " ".join((ex.problem or ex.context or "invalid YAML").split())
    hint = "YAML syntax"
    if "\\t" in problem or "'\t'" in problem:
        hint = "YAML syntax: indent with spaces, never tabs"
    elif ex.context and ex.context_mark is not None and ex.context_mark is not mark:
        hint = (f"YAML syntax, {ex.context} at line {ex.context_mark.line + 1}, "
                f"column {ex.context_mark.column + 1}")
    return ConfigError(where, problem, hint)


def check_yaml_file(path: Path) -> None:
    """Parse ``path`` as Hydra will (duplicate keys are errors); raises ConfigError naming it."""
    from omegaconf._utils import get_yaml_loader

    from orchestrator import user_repo

    try:
        yaml.load(path.read_text(encoding="utf-8"), Loader=get_yaml_loader())  # OmegaConf's
    except yaml.MarkedYAMLError as ex:
        raise yaml_syntax_error(ex, shown_as=path) from None
    except UnicodeDecodeError as ex:
        raise user_repo.not_text_error(path, ex) from None


def explain(err: ConfigError) -> ConfigError:
    """Rewrite errors whose literal text misleads: keys of an experiment file that lacks its
    ``# @package _global_`` header land under ``experiment.`` and read as an unknown key."""
    if err.path.split(".")[0] == "experiment" and err.problem.startswith("unknown key"):
        return ConfigError("experiment", "the experiment file does not start with "
                           "'# @package _global_', so its keys landed under 'experiment.'",
                           "make '# @package _global_' its first line")
    return err


def check_label_overrides(overrides: Sequence[str], choices: Mapping[str, str | None]) -> None:
    """``sync.name=bsp`` where ``sync=bsp`` was meant: a group's ``name`` is only the label of
    the settings its option brought, so the run would train ASP under the label bsp (and
    ``revocation.name=exponential`` would revoke nothing). An override of ``<group>.name`` to
    another option of that group than the one chosen (`choices`, Hydra's runtime choices) is
    refused; a label of one's own stays free. ``provider.name`` picks the backend's schema and
    has its own check (orchestrator/config/load.py `check_provider_name`). Raises ConfigError
    naming ``<group>.name``."""
    from orchestrator.paths import CONF_DIR

    for override in overrides:
        key, sep, value = override.partition("=")
        group, _, leaf = key.lstrip("+").partition(".")
        value = value.strip("'\"")  # sync.name='bsp'
        if not sep or leaf != "name" or group == "provider" or choices.get(group) == value:
            continue
        if (CONF_DIR / group / f"{value}.yaml").is_file():
            raise ConfigError(f"{group}.name", f"'{value}' only relabels the settings of "
                              f"{group}={choices.get(group)}; it does not choose {group}={value}",
                              f"choose the option with {group}={value}, not {group}.name={value}")


#: The keys of the ``sync`` group that say what trains: kept from an experiment across a change
#: of the group, they would train one schedule under another option's label.
SYNC_SCHEDULE_KEYS = ("protocol", "phases", "switch_order", "fractions", "phase_hparams")


def check_group_change(overrides: Sequence[str], sync: Any) -> None:
    """``-m sync=bsp,asp`` on an experiment that sets a switch schedule: Hydra merges the
    experiment's own ``sync:`` keys over the chosen option, so both points would train the
    experiment's schedule while ``runs.csv`` labels them bsp and asp. `sync` is the composed
    ``sync`` node; a schedule key that differs from the chosen option's file and that the
    command line does not set itself came from the experiment: refused, naming those keys.
    """
    from omegaconf import OmegaConf

    from orchestrator.config.schema import SyncConfig
    from orchestrator.paths import CONF_DIR

    chosen = next((o.partition("=")[2].strip("'\"") for o in overrides
                   if o.partition("=")[0] in ("sync", "override sync")), None)
    experiment = next((o.partition("=")[2] for o in overrides
                       if o.partition("=")[0].lstrip("+") == "experiment"), None)
    path = CONF_DIR / "sync" / f"{chosen}.yaml"
    if chosen is None or experiment is None or not path.is_file() \
            or _experiment_choice(experiment, "sync") == chosen:
        return  # the experiment's own option: its keys refine it
    own = yaml.safe_load(path.read_text()) or {}
    own.pop("defaults", None)
    option = OmegaConf.merge(OmegaConf.structured(SyncConfig), own)
    typed = {o.partition("=")[0].lstrip("+").removeprefix("sync.").partition(".")[0]
             for o in overrides if o.lstrip("+").startswith("sync.")}
    kept = [f"sync.{k}" for k in SYNC_SCHEDULE_KEYS
            if k not in typed and OmegaConf.to_container(OmegaConf.create({"v": sync[k]}))
            != OmegaConf.to_container(OmegaConf.create({"v": option[k]}))]
    if kept:
        raise ConfigError("sync", f"sync={chosen} would keep {', '.join(kept)} of experiment "
                          f"{experiment}, which would train that schedule under the label "
                          f"{chosen}",
                          f"sweep the schedule itself, e.g. sync.fractions=..., or set "
                          f"{', '.join(kept)} on the command line too")


def _experiment_choice(experiment: str, group: str) -> str | None:
    """The option of `group` an experiment's own defaults list picks (``override /sync:
    switch``), from the user's file or the packaged one; None when it picks none."""
    from orchestrator import user_repo
    from orchestrator.paths import EXPERIMENTS_DIR

    path = user_repo.config_file(f"experiment/{experiment}") or EXPERIMENTS_DIR / f"{experiment}.yaml"
    try:
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return None
    for entry in defaults:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if str(key).removeprefix("override").strip().lstrip("/") == group:
                    return str(value)
    return None


def open_mapping_overrides(overrides: Sequence[str]) -> list[str]:
    """``provider.labels={team: ml}`` as documented: ``key=value`` of a field the schema declares
    a mapping of plain values (``dict[str, str]``, ``dict[str, float]``), or of one key in it
    (``provider.labels.team=ml``), becomes ``++key=value``; everything else is kept as it is.

    Hydra applies ``key=value`` with the config in struct mode, which refuses every key new to
    the mapping (an empty one has none), so only ``+key=`` worked. ``++`` lets the mapping take
    new keys and merges as ``key=`` does; the values are still checked against the schema
    (:func:`orchestrator.config.load.to_experiment`), and a backend without the field still
    refuses it as an unknown key.
    """
    out = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        parts = key.split(".")
        if sep and not key.startswith(("+", "~", "-")) and "@" not in key \
                and (_is_plain_mapping(parts) or _is_plain_mapping(parts[:-1])):
            override = "++" + override
        out.append(override)
    return out


def _is_plain_mapping(parts: Sequence[str]) -> bool:
    from orchestrator.config.schema import ExperimentConfig

    hint = _hint_at(ExperimentConfig, list(parts))
    args = get_args(hint)
    return get_origin(hint) is dict and len(args) == 2 and args[1] in (str, int, float, bool)


def _hint_at(hint: Any, parts: list[str]) -> Any:
    """The schema's type hint at the dotted ``parts`` below ``hint``; None where there is none.
    ``provider`` is declared as the base ProviderConfig: each backend's own schema is tried."""
    from provisioning.base import ProviderConfig
    from provisioning.registry import all_backends

    while parts:
        args = [a for a in get_args(hint) if a is not type(None)]
        if get_origin(hint) is list:
            if not parts[0].isdigit():
                return None
            hint, parts = args[0], parts[1:]
        elif get_origin(hint) is dict:
            hint, parts = args[-1], parts[1:]
        elif isinstance(hint, type) and is_dataclass(hint):
            if hint is ProviderConfig:
                found = [_hint_at(b.config, parts) for b in all_backends()]
                return next((h for h in found if h is not None), None)
            fields_ = get_type_hints(hint)
            if parts[0] not in fields_:
                return None
            hint, parts = fields_[parts[0]], parts[1:]
        elif len(args) == 1:  # X | None
            hint = args[0]
        else:
            return None
    args = [a for a in get_args(hint) if a is not type(None)]
    return args[0] if get_origin(hint) is not dict and len(args) == 1 \
        and get_origin(args[0]) is dict else hint


def check_group_overrides(overrides: Sequence[str]) -> None:
    """A config group is chosen by option name; ``cluster=[3]`` or ``job=5`` would otherwise
    crash inside Hydra with a traceback. Raises ConfigError naming the group."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from orchestrator.paths import CONF_DIR

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # Hydra reports unparsable overrides itself
        return
    for override in parsed:
        group = override.key_or_group.split("@")[0].lstrip("/")
        folder = CONF_DIR / group
        if not folder.is_dir() or override.is_sweep_override() or override.is_delete():
            continue
        value = override.value()
        options = sorted(p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("base_"))
        if not isinstance(value, str) or not value:
            raise ConfigError(group, f"'{override.get_value_element_as_str()}' is not an option "
                              "name", "available: " + ", ".join(options))
        schemas = sorted(n.removesuffix(".yaml") for n in ConfigStore.instance().list(group)) \
            if ConfigStore.instance().repo.get(group) is not None else []
        if value in schemas and value not in options:  # sync=glob(*) includes base_sync
            patterns = sorted({"base_*" if n.startswith("base_") else "*_schema" for n in schemas})
            every = patterns[0] if len(patterns) == 1 else f"[{','.join(patterns)}]"
            raise ConfigError(group, f"'{value}' is the group's schema, not an option",
                              "available: " + ", ".join(options) + f"; every option: "
                              f"{group}=glob(*,exclude={every})")
