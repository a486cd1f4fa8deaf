"""A corpus of bad inputs: each one is rejected with one line naming a field the user can paste
back as an override (or the file, line and column of a YAML syntax error), before anything runs.

Generated where the schema allows it (every numeric field × out of range, NaN, ±infinity and a
wrong type, from :data:`orchestrator.config.ranges.RANGES`), hand-written otherwise (overrides
and experiment files). Most cases run in-process; a handful go through the real command line to
check exit code 2 and that no traceback is printed.
"""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.config.hydra_errors import check_label_overrides
from orchestrator.config.load import to_experiment
from orchestrator.config.ranges import RANGES, Range
from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.validation import validate
from orchestrator.plan import make_plan
from orchestrator.validate import compose_experiment, validate_files
from provisioning.registry import all_backends

REPO = Path(__file__).resolve().parents[2]
# A pasteable override path: dotted names and list indices, no brackets, no '*', no '<...>'.
PASTEABLE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")
BASE_OVERRIDES = ["straggler=one_worker", "revocation=schedule", "sync=switch"]


def assert_one_line(line: str, field: str) -> None:
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith(f"config error: {field}: "), line


# --- generated from the schema -----------------------------------------------------------------


def _numeric_patterns(schema: type, prefix: str = "") -> list[tuple[str, type]]:
    """Every int/float field of the schema as a RANGES-style pattern, with its number type."""
    out: list[tuple[str, type]] = []
    for f in fields(schema):
        hint = get_type_hints(schema)[f.name]
        path = f"{prefix}{f.name}"
        out.extend(_patterns_for(hint, path))
    return out


def _patterns_for(hint: Any, path: str) -> list[tuple[str, type]]:
    args = [a for a in get_args(hint) if a is not type(None)]
    if hint in (int, float):
        return [(path, hint)]
    if isinstance(hint, type) and is_dataclass(hint):
        return _numeric_patterns(hint, path + ".")
    if get_origin(hint) is list:
        return _patterns_for(args[0], path + ".*")
    if get_origin(hint) is dict:
        return _patterns_for(args[1], path + ".*")
    if args and get_origin(hint) is not None:  # X | None
        return _patterns_for(args[0], path)
    return []


NUMERIC = dict(_numeric_patterns(ExperimentConfig))
#: Each backend's own numeric fields (provider=<name> composes against its schema), beyond the
#: common ones in NUMERIC: backend -> pattern -> type.
BACKEND_NUMERIC = {b.name: {p: t for p, t in _numeric_patterns(b.config, "provider.")
                            if p not in NUMERIC} for b in all_backends()}


def backend_of(pattern: str) -> str:
    """The provider whose config has the field (local for the common ones)."""
    return next((name for name, own in BACKEND_NUMERIC.items() if pattern in own), "local")


def kind_of(pattern: str) -> type:
    """int or float: the schema type of a RANGES pattern (hparam maps are float per name)."""
    known = {**NUMERIC, **BACKEND_NUMERIC[backend_of(pattern)]}
    return known.get(pattern) or known[pattern.rsplit(".", 1)[0] + ".*"]


def test_every_numeric_schema_field_has_a_range() -> None:
    """A numeric field added to the schema, or to a backend's config, without a range fails
    here, naming it."""
    missing = []
    for pattern in [*NUMERIC, *(p for own in BACKEND_NUMERIC.values() for p in own)]:
        if pattern.endswith(".*.*") or pattern.endswith("hparams.*"):  # hparam maps: per name
            head = pattern.rsplit(".*", 1)[0]
            if not any(p.startswith(head + ".") for p in RANGES):
                missing.append(pattern)
        elif pattern not in RANGES:
            missing.append(pattern)
    assert not missing, f"numeric fields without a range in RANGES: {missing}"


# Where a pattern's '*' needs data to exist: (data to set first, the concrete path).
PHASES = [{"protocol": "bsp", "fraction": 1.0, "hparams": {"learning_rate": 0.1, "momentum": 0.5}}]
CONCRETE: dict[str, tuple[dict[str, Any], str]] = {
    "job.lr_decay_steps.*": ({"job.lr_decay_steps": [100]}, "job.lr_decay_steps.0"),
    "sync.phases.*.fraction": ({"sync.phases": PHASES, "sync.switch_order": "",
                                "sync.fractions": [], "sync.phase_hparams": []},
                               "sync.phases.0.fraction"),
    "sync.phases.*.hparams.learning_rate": ({"sync.phases": PHASES, "sync.switch_order": "",
                                             "sync.fractions": [], "sync.phase_hparams": []},
                                            "sync.phases.0.hparams.learning_rate"),
    "sync.phases.*.hparams.momentum": ({"sync.phases": PHASES, "sync.switch_order": "",
                                        "sync.fractions": [], "sync.phase_hparams": []},
                                       "sync.phases.0.hparams.momentum"),
    "sync.fractions.*": ({}, "sync.fractions.1"),
    "sync.phase_hparams.*.learning_rate": ({"sync.phase_hparams": [{}, {"learning_rate": 0.1}]},
                                           "sync.phase_hparams.1.learning_rate"),
    "sync.phase_hparams.*.momentum": ({"sync.phase_hparams": [{}, {"momentum": 0.5}]},
                                      "sync.phase_hparams.1.momentum"),
    "revocation.events.*.at_step": ({}, "revocation.events.1.at_step"),
    "straggler.injections.*.workers.*": ({}, "straggler.injections.0.workers.0"),
    "planner.bsp_fractions.*": ({"planner.bsp_fractions": [0.5, 0.25]}, "planner.bsp_fractions.1"),
    "planner.parameter_servers.*": ({"planner.parameter_servers": [1, 2]},
                                    "planner.parameter_servers.1"),
    **{f"pricing.{kind}.*.regions.*.{price}": ({}, f"pricing.{kind}.{name}.regions.europe-west4."
                                                   f"{price}")
       for kind, name in (("gpus", "t4"), ("machine_types", "n1-standard-4"))
       for price in ("on_demand_usd_per_h", "preemptible_usd_per_h")},
}


def concrete(pattern: str) -> tuple[dict[str, Any], str]:
    if pattern in CONCRETE:
        return CONCRETE[pattern]
    path = pattern.replace("pricing.gpus.*", "pricing.gpus.k80")
    path = path.replace("pricing.machine_types.*", "pricing.machine_types.n1-standard-4")
    return {}, path.replace("*", "0")


def _set(node: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        node = _get(node, part)
    if isinstance(node, list):
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        setattr(node, last, value)


def _get(node: Any, part: str) -> Any:
    if isinstance(node, list):
        return node[int(part)]
    if isinstance(node, dict):
        return node[part]
    return getattr(node, part)


def ssh_inventory(key: Path, *extras: str) -> str:
    """`provider.hosts=[...]`: one machine per extra (its further keys, e.g. ", spare: true"),
    each with the key file `key` and a Python of its own."""
    hosts = ", ".join(f"{{name: m{i}, address: '10.9.0.{i + 1}', key_path: '{key}', "
                      f"python: python3{extra}}}" for i, extra in enumerate(extras))
    return f"provider.hosts=[{hosts}]"


@pytest.fixture(scope="module")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    key.write_text("")  # only its existence is checked before connecting
    return key


@pytest.fixture(scope="module")
def base_data(ssh_key: Path) -> dict[str, dict[str, Any]]:
    """Per backend, digits_local with every numeric field of that backend's schema present:
    local with a straggler, a revocation schedule and a phase schedule; gce; ssh with an
    inventory of three machines. Each valid as it is."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_DIR

    register_configs()
    overrides = {"local": BASE_OVERRIDES, "gce": ["provider=gce"],
                 "ssh": ["provider=ssh", "provider.trust_on_first_use=true",
                         ssh_inventory(ssh_key, "", "", "")]}
    bases = {}
    for backend, extra in overrides.items():
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            composed = compose("config", overrides=["+experiment=digits_local", *extra])
        data = OmegaConf.to_container(composed, resolve=True)
        assert isinstance(data, dict)
        data.pop("hydra", None)
        validate(to_experiment(data))
        bases[backend] = data
    return bases


def _bad_values(allowed: Range, kind: type) -> list[tuple[str, Any]]:
    """(label, value) outside ``allowed`` or not a number at all."""
    below = allowed.low if allowed.low_open else allowed.low - 1
    values = [("below", kind(below))]
    if allowed.high is not None:
        values.append(("above", kind(allowed.high if allowed.high_open else allowed.high + 1)))
    values += [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("text", "abc")]
    return values


RANGE_CASES = [
    (pattern, label, value)
    for pattern, allowed in RANGES.items()
    for label, value in _bad_values(allowed, kind_of(pattern))
]


def _prepared(base_data: dict[str, dict[str, Any]], pattern: str) -> dict[str, Any]:
    data = copy.deepcopy(base_data[backend_of(pattern)])
    for key, value in concrete(pattern)[0].items():
        _set(data, key, copy.deepcopy(value))
    return data


@pytest.fixture(scope="module")
def typed_configs(base_data: dict[str, dict[str, Any]]) -> dict[str, ExperimentConfig]:
    """Each prepared config, typed once (the merge into the schema is the slow part)."""
    typed: dict[str, ExperimentConfig] = {}

    def key(pattern: str) -> str:
        return backend_of(pattern) + repr(concrete(pattern)[0])

    for pattern in RANGES:
        if key(pattern) not in typed:
            typed[key(pattern)] = to_experiment(_prepared(base_data, pattern))
    return {pattern: typed[key(pattern)] for pattern in RANGES}


def test_prepared_configs_are_valid(typed_configs: dict[str, ExperimentConfig]) -> None:
    """So that in the cases below the bad value, and only it, is the cause."""
    for cfg in {id(c): c for c in typed_configs.values()}.values():
        validate(cfg)


@pytest.mark.parametrize(("pattern", "label", "value"), RANGE_CASES,
                         ids=[f"{p}={lab}" for p, lab, _ in RANGE_CASES])
def test_numeric_field_out_of_range_or_not_a_number(
        base_data: dict[str, dict[str, Any]], typed_configs: dict[str, ExperimentConfig],
        pattern: str, label: str, value: Any) -> None:
    path = concrete(pattern)[1]
    is_number = isinstance(value, float) and kind_of(pattern) is float
    if label in ("below", "above") or is_number:
        # what OmegaConf accepts reaches the semantic check: set it in the typed config
        cfg = copy.deepcopy(typed_configs[pattern])
        _set(cfg, path, value)
        with pytest.raises(ConfigError) as info:
            validate(cfg)
        words = "must be a finite number" if label.endswith("inf") or label == "nan" else \
            "must be "
    else:  # a type error: only the merge into the schema (the user's path) sees it
        data = _prepared(base_data, pattern)
        _set(data, path, value)
        with pytest.raises(ConfigError) as info:
            to_experiment(data)
        words = "not a valid"
    line = info.value.line()
    assert_one_line(line, path)  # inside a list's mappings too (sync.phase_hparams.1.momentum)
    assert words in line, line
    assert PASTEABLE.match(info.value.path), info.value.path


# --- hand-written overrides (composed in-process, as the command line composes them) -----------

BAD_OVERRIDES: list[tuple[str, list[str], str, str]] = [
    # (experiment, overrides, field named, words in the message)
    ("digits_local", ["cluster.worker_groups.0.count=abc"], "cluster.worker_groups.0.count",
     "not a valid integer"),
    ("digits_local", ["cluster.worker_groups=[{count: 1},{count: x}]"],
     "cluster.worker_groups.1.count", "not a valid integer"),
    ("digits_local", ["cluster.worker_groups=[{count: 1},{cnt: 2}]"],
     "cluster.worker_groups.1.cnt", "unknown key 'cnt'"),
    ("digits_local", ["+cluster.worker_groups.0.gpus=k80"], "cluster.worker_groups.0.gpus",
     "unknown key"),
    ("digits_local", ["cluster.worker_groups=[{count: 1},{count: -1}]"],
     "cluster.worker_groups.1.count", "must be ≥ 1"),
    ("mixed_gpu_cifar10", ["cluster.worker_groups.2.gpu=h100"], "cluster.worker_groups.2.gpu",
     "unknown GPU"),
    ("mixed_gpu_cifar10", ["cluster.worker_groups.1.zone=mars-1a"],
     "cluster.worker_groups.1.zone", "does not offer"),
    ("mixed_gpu_cifar10", ["cluster.worker_groups.2.count=0"], "cluster.worker_groups.2.count",
     "must be ≥ 1"),
    ("digits_local", ["cluster.worker_groups.5.count=2"], "cluster.worker_groups.5",
     "no such item"),
    ("digits_local", ["cluster.worker_groups=[3]"], "cluster.worker_groups.0",
     "expected a mapping"),
    ("digits_local", ["sync.phases=[{protocol: asp, fraction: 0.5},{protocol: bsq, fraction: 0.5}]"],
     "sync.phases.1.protocol", "invalid value 'bsq'"),
    ("digits_local", ["sync.phases=[{protocol: asp, fraction: 0.5},{protocol: bsp, fraction: x}]"],
     "sync.phases.1.fraction", "not a valid number"),
    ("digits_local", ["sync.phases=[{protocol: asp, fraction: 1.0, hparams: {lr: 0.1}}]"],
     "sync.phases.0.hparams", "unknown hparam"),
    ("digits_local", ["sync.phases=[{protocol: asp, fraction: 1.0, hparams: {momentum: 1.0}}]"],
     "sync.phases.0.hparams.momentum", "must be in [0, 1)"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{},{momentum: 3}]"],
     "sync.phase_hparams.1", "decimal number"),
    ("digits_local", ["sync=switch", "sync.fractions=[0.5,nan]"], "sync.fractions.1", "finite"),
    ("digits_local", ["sync=switch", "sync.switch_order=12"], "sync.switch_order", "invalid"),
    ("digits_local", ["job.lr_decay_steps=[1,x]"], "job.lr_decay_steps.1", "not a valid integer"),
    ("digits_local", ["job.lr_decay_steps=[5,3]"], "job.lr_decay_steps.1", "greater than"),
    ("cifar10_res32", ["job.lr_decay_steps=[]"], "job.lr_decay_steps", "required for"),
    ("digits_local", ["job.learning_rate=nan"], "job.learning_rate", "finite"),
    ("digits_local", ["job.learning_rate=inf"], "job.learning_rate", "finite"),
    ("digits_local", ["job.learning_rate=-inf"], "job.learning_rate", "finite"),
    ("digits_local", ["job.learning_rate=true"], "job.learning_rate", "not a valid number"),
    ("digits_local", ["job.train_steps=1e3"], "job.train_steps", "not a valid integer"),
    ("digits_local", ["job.seed=-1"], "job.seed", "must be in [0, 4294967295]"),
    ("digits_local", ["cluster.workers=1.5"], "cluster.workers", "not a valid integer"),
    ("digits_local", ["job.learning_rate=[1]"], "job.learning_rate", "not a valid number"),
    ("digits_local", ["pricing.machine_types.n1-standard-4.on_demand_usd_per_h=-0.1"],
     "pricing.machine_types.n1-standard-4.on_demand_usd_per_h", "must be ≥ 0"),
    ("cifar10_res32", ["pricing.gpus.k80.preemptible_usd_per_h=-1"],
     "pricing.gpus.k80.preemptible_usd_per_h", "must be ≥ 0"),
    ("digits_local", ["straggler=one_worker", "cluster.workers=1"],
     "straggler.injections.0.workers.0", "no worker 1"),
    ("digits_local", ["straggler=one_worker", "straggler.injections.0.workers=[0,5]"],
     "straggler.injections.0.workers.1", "no worker 5"),
    ("digits_local", ["straggler=one_worker", "straggler.injections.0.workers=[0,-1]"],
     "straggler.injections.0.workers.1", "must be ≥ 0"),
    ("digits_local", ["straggler=one_worker", "straggler.injections.0.workers=[x]"],
     "straggler.injections.0.workers.0", "not a valid integer"),
    ("digits_local", ["straggler=one_worker", "+straggler.injections.0.speed=2"],
     "straggler.injections.0.speed", "unknown key"),
    ("digits_local", ["revocation=schedule", "revocation.events.0.target=worker-9"],
     "revocation.events.0.target", "unknown host"),
    ("digits_local", ["revocation=schedule", "revocation.events.1.at_step=-3"],
     "revocation.events.1.at_step", "must be ≥ 0"),
    ("digits_local", ["revocation=schedule", "+revocation.events.1.when=3"],
     "revocation.events.1.when", "unknown key"),
    ("digits_local", ["revocation=exponential", "revocation.rate_per_hour=0"],
     "revocation.rate_per_hour", "must be > 0"),
    ("digits_local", ["cluster=[3]"], "cluster", "not an option name"),
    ("digits_local", ["job=5"], "job", "not an option name"),
    ("digits_local", ["sync=ssp"], "sync", "unknown option 'ssp'"),
    ("digits_local", ["+job.lerning_rate=0.1"], "job.lerning_rate", "unknown key"),
    ("digits_local", ["job.trian_steps=5"], "job.trian_steps", "unknown key"),
    ("digits_local", ["cluster.recovery.on_revocation=restart"], "cluster.recovery.on_revocation",
     "invalid value"),
    ("digits_local", ["cluster.recovery.max_restarts=nan"], "cluster.recovery.max_restarts",
     "not a valid integer"),
    ("digits_local", ["straggler.detection.k=1"], "straggler.detection.k", "must be > 1"),
    ("digits_local", ["provider.ready_timeout_s=inf"], "provider.ready_timeout_s", "finite"),
    ("digits_local", ["report_every_s=nan"], "report_every_s", "finite"),
    ("mixed_gpu_cifar10", ["cluster.workers=4"], "cluster.workers", "homogeneous"),
    ("digits_local", ["job.lr_decay_steps=5"], "job.lr_decay_steps", "expected a list"),
    ("digits_local", ["cluster.worker_groups={}"], "cluster.worker_groups", "expected a list"),
    ("digits_local", ["cluster.recovery=[1]"], "cluster.recovery", "expected a mapping"),
    ("digits_local", ["cluster.worker_groups.0.count=null"], "cluster.worker_groups.0.count",
     "must not be null"),
    ("digits_local", ["sync.phases=[{protocol: bsp}]"], "sync.phases.0.fraction",
     "required value is missing"),
    ("digits_local", ["name="], "name", "cannot name the output folder"),
    ("digits_local", ["name=a/b"], "name", "cannot name the output folder"),
    ("digits_local", ["job.train_steps="], "job.train_steps", "not a valid integer"),
    ("digits_local", ["job.train_steps=[1"], "job.train_steps", "no viable alternative"),
    ("digits_local", ["~job.nothing"], "job.nothing", "does not exist"),
    # an OmegaConf key relative to the node an override was building, anchored in the override
    ("digits_local", ["sync=switch", "sync.phase_hparams=[0.1, 0.2]"], "sync.phase_hparams.0",
     "expected a mapping, got a float"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{}, 0.2]"], "sync.phase_hparams.1",
     "expected a mapping, got a float"),
    ("digits_local", ["sync=switch", "sync.phase_hparams.0=0.1"], "sync.phase_hparams.0",
     "expected a mapping"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[[0.1]]"], "sync.phase_hparams.0",
     "expected a mapping, got a list"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{}, {momentum: [1]}]"],
     "sync.phase_hparams.1.momentum", "expected a number, got a list"),
    ("digits_local", ["+pricing.gpus.h100.on_demand_usd_per_h=3",
                      "cluster.worker_groups.0.gpu=h100"], "pricing.gpus.h100",
     "cannot be added from the command line"),
    ("digits_local", ["+pricing.machine_types.n2-standard-8.on_demand_usd_per_h=1"],
     "pricing.machine_types.n2-standard-8", "add it whole in an experiment file"),
    # a list of plain values holding a list (OmegaConf lets it through)
    ("digits_local", ["sync=switch", "sync.fractions=[[0.5], 0.5]"], "sync.fractions.0",
     "expected a number, got a list"),
    ("digits_local", ["job.lr_decay_steps=[1, [2]]"], "job.lr_decay_steps.1",
     "expected a whole number, got a list"),
    # a list where one value belongs, and an item added to an empty list
    ("digits_local", ["cluster.worker_groups.0.gpu=[k80]"], "cluster.worker_groups.0.gpu",
     "expected one value, got a list"),
    ("digits_local", ["cluster.recovery.on_revocation=[replace]"],
     "cluster.recovery.on_revocation", "one of: shrink, replace"),
    ("digits_local", ["+sync.phases.0.protocol=bsp"], "sync.phases.0", "the list is empty"),
    ("digits_local", ["tags=[[1]]"], "tags.0", "expected a string, got a list"),
    # the backend chosen by value instead of by the config group
    ("digits_local", ["provider.name=gce"], "provider.name", "with provider=gce"),
    ("digits_local", ["provider.name=ssh"], "provider.name", "provider=local's"),
    ("digits_local", ["provider=ssh", "provider.name=local"], "provider.name", "provider=ssh's"),
    ("digits_local", ["provider.data_source=bucket"], "provider.data_source",
     "unknown data source 'bucket'"),
    # a bad value inside an item that is a mapping of plain values: its key, not only the item
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{learning_rate: fast}]"],
     "sync.phase_hparams.0.learning_rate", "'fast' is not a valid number"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{}, {momentum: abc}]"],
     "sync.phase_hparams.1.momentum", "'abc' is not a valid number"),
    # an unresolvable ${...}: the field whose value it is, not the whole config
    ("digits_local", ["description=${nonexistent}"], "description",
     "interpolation key 'nonexistent' not found"),
    ("digits_local", ["cluster.parameter_servers=${oc.env:TRANSIENT_TEST_UNSET}"],
     "cluster.parameter_servers", "environment variable 'TRANSIENT_TEST_UNSET' not found"),
    ("digits_local", ["description=${cluster.name}", "cluster.name=${description}"],
     "description", "recursive interpolation"),
    ("digits_local", ["name=${nonexistent}"], "name", "interpolation key 'nonexistent'"),
    # the planner's questions, answerable or refused
    ("digits_local", ["planner.zones=all"], "planner.zones", "invalid value 'all'"),
    ("digits_local", ["planner.objective=deadline"], "planner.objective",
     "planner.deadline_h, which is not set"),
    ("digits_local", ["planner.gpus=[k80,h100]"], "planner.gpus.1", "unknown GPU 'h100'"),
    ("digits_local", ["name=" + "n" * 300], "name", "300 bytes, too long"),
    ("digits_local", ["sync=base_sync"], "sync", "the group's schema, not an option"),
    # a mapping the backend does not have (provider=local): unknown, even in the documented form
    ("digits_local", ["provider.labels={team: ml}"], "provider.labels", "unknown key 'labels'"),
]


@pytest.mark.parametrize(("experiment", "overrides", "field", "words"), BAD_OVERRIDES,
                         ids=[" ".join(o) for _, o, _, _ in BAD_OVERRIDES])
def test_bad_override(experiment: str, overrides: list[str], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan(compose_experiment(experiment, overrides))  # the dry run's checks
    assert_one_line(info.value.line(), field)
    assert words in info.value.line(), info.value.line()
    assert PASTEABLE.match(info.value.path), info.value.path


# --- hand-written experiment files ---------------------------------------------------------------

HEADER = "# @package _global_\n"
BAD_FILES: dict[str, tuple[str | bytes, str, str]] = {
    # id -> (file text, field or file:line:col named, words in the message)
    "tab": (HEADER + "job:\n\ttrain_steps: 5\n", "{file}:3:1", "'\\t'"),
    "tab-after-key": (HEADER + "job:\n  train_steps:\t5\n  batch_size: 8\n\tseed: 1\n",
                      "{file}:3:15", "YAML syntax"),
    "unclosed-bracket": (HEADER + "cluster:\n  worker_groups: [{count: 2}\n", "{file}:4:1",
                         "line 3, column 18"),
    "unclosed-brace": (HEADER + "job: {train_steps: 5\nname: x\n", "{file}:3:5",
                       "YAML syntax"),
    "unclosed-quote": (HEADER + "name: 'abc\n", "{file}:3:1", "YAML syntax"),
    "duplicate-key": (HEADER + "job:\n  train_steps: 5\n  train_steps: 6\n", "{file}:4:3",
                      "duplicate key train_steps"),
    "duplicate-top-key": (HEADER + "name: a\njob:\n  seed: 1\nname: b\n", "{file}:5:1",
                          "duplicate key name"),
    "bad-indent": (HEADER + "job:\n  train_steps: 5\n batch_size: 8\n", "{file}:4:2",
                   "YAML syntax"),
    "no-package-header": ("job:\n  train_steps: 5\n", "experiment", "# @package _global_"),
    "defaults-without-override": (HEADER + "defaults:\n  - /sync: bsp\n", "sync",
                                  "override /sync: bsp"),
    "unknown-option-in-defaults": (HEADER + "defaults:\n  - override /sync: ssp\n", "sync",
                                   "unknown option 'ssp'"),
    "item-unknown-key": (HEADER + "cluster:\n  worker_groups:\n    - {count: 2}\n"
                         "    - {count: 1, gpus: k80}\n", "cluster.worker_groups.1.gpus",
                         "unknown key 'gpus'"),
    "item-wrong-type": (HEADER + "cluster:\n  worker_groups:\n    - {count: 2}\n"
                        "    - {count: abc}\n", "cluster.worker_groups.1.count",
                        "not a valid integer"),
    "item-out-of-range": (HEADER + "cluster:\n  worker_groups:\n    - {count: 2}\n"
                          "    - {count: 0}\n", "cluster.worker_groups.1.count", "must be ≥ 1"),
    "phase-bad-protocol": (HEADER + "sync:\n  phases:\n    - {protocol: bsp, fraction: 0.5}\n"
                           "    - {protocol: ssp, fraction: 0.5}\n", "sync.phases.1.protocol",
                           "invalid value 'ssp'"),
    "phase-nan-lr": (HEADER + "sync:\n  phases:\n    - {protocol: bsp, fraction: 1.0, "
                     "hparams: {learning_rate: .nan}}\n", "sync.phases.0.hparams.learning_rate",
                     "finite"),
    "inf-learning-rate": (HEADER + "job:\n  learning_rate: .inf\n", "job.learning_rate",
                          "finite"),
    "negative-price": (HEADER + "pricing:\n  machine_types:\n    n1-standard-4:\n"
                       "      preemptible_usd_per_h: -0.01\n",
                       "pricing.machine_types.n1-standard-4.preemptible_usd_per_h",
                       "must be ≥ 0"),
    "straggler-missing-worker": (HEADER + "defaults:\n  - override /straggler: one_worker\n"
                                 "straggler:\n  injections:\n    - {workers: [0, 7], "
                                 "delay_s: 0.1, start_s: 1.0}\n",
                                 "straggler.injections.0.workers.1", "no worker 7"),
    "unknown-top-key": (HEADER + "foo: 1\n", "foo", "unknown key 'foo'"),
    "wrong-type-workers": (HEADER + "cluster:\n  workers: four\n", "cluster.workers",
                           "not a valid integer"),
    # a config group set as a plain key where the defaults list was meant
    "group-as-plain-key": (HEADER + "sync: bsp\n", "sync", "override /sync: bsp"),
    "group-as-plain-key-2": (HEADER + "job:\n  train_steps: 5\nstraggler: one_worker\n",
                             "straggler", "defaults: [override /straggler: one_worker]"),
    "provider-as-plain-key": (HEADER + "provider: gce\n", "provider",
                              "override /provider: gce"),
    "phase-hparam-not-a-number": (HEADER + "defaults:\n  - override /sync: switch\nsync:\n"
                                  "  phase_hparams:\n    - {}\n    - {momentum: high}\n",
                                  "sync.phase_hparams.1.momentum", "'high' is not a valid number"),
    "section-as-number": (HEADER + "cluster:\n  recovery: 3\n", "cluster.recovery",
                          "expected a mapping"),
    "binary": (HEADER.encode() + b"\x00\xff\xfe\x01", "{file}", "is not UTF-8 text"),
    "empty-defaults": (HEADER + "defaults:\nname: x\n", "{file}", "'defaults:' is empty"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_experiment_file(tmp_path: Path, case: str) -> None:
    text, field, words = BAD_FILES[case]
    path = tmp_path / f"{case.replace('-', '_')}.yaml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    line = validate_files([path])[path.resolve()] or ""
    assert_one_line(line, field.format(file=path.resolve()))
    assert words in line, line


def test_validate_reports_every_bad_file(tmp_path: Path) -> None:
    paths = []
    for case in ("tab", "duplicate-key", "item-unknown-key", "no-package-header"):
        paths.append(tmp_path / f"{case.replace('-', '_')}.yaml")
        paths[-1].write_text(BAD_FILES[case][0])
    good = REPO / "experiments" / "digits_local.yaml"
    results = validate_files([*paths, good])
    assert results[good.resolve()] is None
    assert all(results[p.resolve()] for p in paths), results


# --- through the real command line ---------------------------------------------------------------


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**_env(), "PYTHONPATH": str(REPO)})


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}


CLI_CASES = [
    (["cluster.worker_groups=[{count: 1},{cnt: 2}]"], "cluster.worker_groups.1.cnt"),
    (["job.learning_rate=nan"], "job.learning_rate"),
    (["cluster=[3]"], "cluster"),
    (["straggler=one_worker", "cluster.workers=1"], "straggler.injections.0.workers.0"),
    (["sync=switch", "sync.phase_hparams=[0.1, 0.2]"], "sync.phase_hparams.0"),
    (["provider.name=gce"], "provider.name"),
    (["+pricing.gpus.h100.on_demand_usd_per_h=3", "cluster.worker_groups.0.gpu=h100"],
     "pricing.gpus.h100"),
    # a group's label set where its option was meant (the run would train ASP labelled bsp)
    (["sync.name=bsp"], "sync.name"),
    (["revocation.name=exponential"], "revocation.name"),
    (["sync=switch", "sync.phase_hparams=[{learning_rate: fast}]"],
     "sync.phase_hparams.0.learning_rate"),
    # Hydra makes the run folder (and resolves ${name} in it) before anything of ours runs
    (["name=" + "n" * 300], "name"),
    (["name=${nonexistent}"], "name"),
    # sweeps: refused before any point runs (glob(*) of sync takes the schema base_sync too)
    (["-m", "cluster.workers=range(1,3,0)"], "cluster.workers"),
    (["-m", "cluster.workers=glob(*)"], "cluster.workers"),
    (["-m", "sync=glob(*)"], "sync"),
]


@pytest.mark.parametrize(("overrides", "field"), CLI_CASES, ids=[c[1] for c in CLI_CASES])
def test_cli_exits_2_with_one_line(overrides: list[str], field: str) -> None:
    proc = _cli("-m", "orchestrator", "+experiment=digits_local", *overrides, "dry_run=true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert_one_line(proc.stderr.strip(), field)


def test_cli_experiment_without_its_plus_says_the_plus_is_missing() -> None:
    """`experiment=NAME`: the file has its header; what is missing is the '+'."""
    proc = _cli("-m", "orchestrator", "experiment=digits_local", "dry_run=true")
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr.strip(), "experiment")
    assert "the '+' is missing" in proc.stderr and "+experiment=digits_local" in proc.stderr
    assert "@package" not in proc.stderr


SWEEPS_WITHOUT_POINTS = [
    ("cluster.workers=range(1,3,0)", "range() arg 3 must not be zero"),
    ("cluster.workers=range(3,1)", "the sweep has no points"),
    ("cluster.workers=interval(1,64)", "continuous interval"),
    ("cluster.workers=glob(*)", "the sweep has no points"),
]


@pytest.mark.parametrize(("override", "words"), SWEEPS_WITHOUT_POINTS,
                         ids=[o for o, _ in SWEEPS_WITHOUT_POINTS])
def test_a_sweep_that_gives_no_points_names_its_key(override: str, words: str) -> None:
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_PACKAGE
    from orchestrator.sweep import expand_sweep

    register_configs()
    with initialize_config_module(version_base="1.3", config_module=CONF_PACKAGE):
        loader = GlobalHydra.instance().config_loader()
        assert len(expand_sweep(["sync=glob(*,exclude=base_*)"], loader)) == 4  # a group's
        with pytest.raises(ConfigError) as info:
            expand_sweep(["+experiment=digits_local", override], loader)
    assert_one_line(info.value.line(), "cluster.workers")
    assert words in info.value.line(), info.value.line()


def test_a_mapping_field_takes_the_documented_override(ssh_key: Path) -> None:
    """`provider.labels={team: ml}` and `provider.placement={ps-0: lab2}` as
    docs/configuration.md writes them (Hydra's struct mode refused every new key of an empty
    mapping, so only `+key=` worked); the values are still the schema's type."""
    cfg = compose_experiment("cifar10_res32", ["provider.labels={team: ml, tier: 3}"])
    assert cfg.provider.labels == {"team": "ml", "tier": "3"}
    cfg = compose_experiment("cifar10_res32", ["provider.labels.team=ml"])
    assert cfg.provider.labels == {"team": "ml"}
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider.labels={team: [ml]}"])
    assert_one_line(info.value.line(), "provider.labels.team")
    cfg = compose_experiment("ssh_digits", [*documented_inventory(ssh_key),
                                            "provider.placement={ps-0: lab2}"])
    assert cfg.provider.placement == {"ps-0": "lab2"}
    assert placed_on(cfg)["ps-0"] == "lab2"


@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_cli_binary_experiment_on_hydras_own_file_source_is_one_line(tmp_path: Path,
                                                                    how: str) -> None:
    """A binary experiment file read by Hydra's own file source (``--config-dir``,
    ``hydra.searchpath``), not the user repository's: the file, not a UnicodeDecodeError."""
    folder = tmp_path / "cd" / "experiment"
    folder.mkdir(parents=True)
    (folder / "bin.yaml").write_bytes(HEADER.encode() + b"\x00\xff\xfe\x01")
    where = (["--config-dir", str(tmp_path / "cd")] if how == "--config-dir"
             else [f"hydra.searchpath=[file://{tmp_path / 'cd'}]"])
    proc = _cli("-m", "orchestrator", *where, "+experiment=bin", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr.strip(), "cd/experiment/bin.yaml")
    assert "is not UTF-8 text (it holds the byte 0xff)" in proc.stderr, proc.stderr


def test_cli_resume_of_a_config_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "config.yaml").write_bytes(b"name: x\n\xff\xfe\x00")
    (run / ".hydra" / "hydra.yaml").write_text("hydra:\n  overrides:\n    hydra: []\n"
                                               "    task: [+experiment=digits_local]\n")
    (run / ".hydra" / "overrides.yaml").write_text("- +experiment=digits_local\n")
    proc = _cli("-m", "orchestrator", "--resume", str(run), "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"resume: {run / 'config.yaml'} cannot be read as the YAML mapping a run records "
        "(missing, not UTF-8, or damaged)"], proc.stderr


def test_a_group_label_naming_another_option_is_refused_and_any_other_label_kept() -> None:
    choices = {"sync": "asp", "cluster": "local_cpu", "provider": "local"}
    with pytest.raises(ConfigError) as info:
        check_label_overrides(["+experiment=digits_local", "cluster.name='gce_t4'"], choices)
    assert_one_line(info.value.line(), "cluster.name")
    assert "choose the option with cluster=gce_t4" in info.value.line()
    check_label_overrides(["sync.name=asp", "sync.name=my_label", "job.name=x",
                           "sync.phase_hparams=[]", "provider.name=gce"], choices)


@pytest.mark.parametrize("case", ["tab", "duplicate-key", "unclosed-bracket"])
def test_cli_yaml_syntax_error_names_the_file(tmp_path: Path, case: str) -> None:
    (tmp_path / "experiment").mkdir()
    path = tmp_path / "experiment" / "mine.yaml"
    path.write_text(BAD_FILES[case][0])
    proc = _cli("-m", "orchestrator", "+experiment=mine", f"hydra.searchpath=[file://{tmp_path}]",
                "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    position = BAD_FILES[case][1].format(file="experiment/mine.yaml")
    assert_one_line(proc.stderr.strip(), position)


def test_cli_validate_lists_every_bad_file(tmp_path: Path) -> None:
    names = ["tab", "duplicate-key", "no-package-header", "item-wrong-type"]
    for case in names:
        (tmp_path / f"{case}.yaml").write_text(BAD_FILES[case][0])
    proc = _cli("-m", "orchestrator.validate", *(str(tmp_path / f"{c}.yaml") for c in names),
                str(REPO / "experiments" / "digits_local.yaml"))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    fails = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL ")]
    assert sorted(ln.split(":")[0][5:] for ln in fails) == sorted(f"{c}.yaml" for c in names)
    assert "ok   digits_local.yaml" in proc.stdout


# --- the SSH inventory ----------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second"), [("10.9.0.1", "10.9.0.1"), ("Host-A", "host-a"),
                                               ("127.0.0.1", "localhost")])
def test_two_inventory_hosts_at_one_address_are_a_config_error(tmp_path: Path, first: str,
                                                               second: str) -> None:
    """Both machines' roles would get the same address:port (each machine counts its ports
    from provider.first_port): named before anything connects, not a run spent on the clash."""
    key, known = tmp_path / "key", tmp_path / "known_hosts"
    key.write_text("")
    known.write_text("")

    def inventory(*addresses: str) -> list[str]:
        hosts = ", ".join(f"{{name: m{i}, address: '{a}', key_path: '{key}', python: python3}}"
                          for i, a in enumerate(addresses))
        return ["provider=ssh", f"provider.hosts=[{hosts}]", f"provider.known_hosts={known}"]

    with pytest.raises(ConfigError) as info:
        compose_experiment("ssh_digits", inventory(first, "10.9.0.7", second))
    assert_one_line(info.value.line(), "provider.hosts.2.address")
    assert "also provider.hosts.0.address" in info.value.line()
    compose_experiment("ssh_digits", inventory(first, "10.9.0.7", "10.9.0.8"))  # distinct: fine


# --- values that can only be wrong: refused in one line before anything is created -------------

GCE_ZONES = ("us-central1-a, us-central1-b, us-central1-c, us-central1-f, us-east1-b, "
             "us-east1-c, us-east1-d, us-west1-a, us-west1-b, us-west1-c, europe-west1-b, "
             "europe-west1-d, europe-west4-a, europe-west4-b, europe-west4-c, asia-east1-a, "
             "asia-east1-b, asia-east1-c, asia-northeast1-a")
STORAGE_HINT = "(expected gs://BUCKET/PREFIX, e.g. gs://my-bucket/transient)"
ONLY_WRONG: list[tuple[list[str], str]] = [
    # (overrides of cifar10_res32, whose provider is gce; the exact line)
    (["provider.lease_s=-5"], "provider.lease_s: must be ≥ 0 (got -5)"),
    (["provider.retries=0"], "provider.retries: must be ≥ 1 (got 0)"),
    (["provider.max_parallel=-2"], "provider.max_parallel: must be ≥ 1 (got -2)"),
    (["provider.poll_interval_s=0"], "provider.poll_interval_s: must be > 0 (got 0)"),
    (["provider.unreachable_grace_s=-1"], "provider.unreachable_grace_s: must be > 0 (got -1)"),
    (["provider.operation_timeout_s=0"], "provider.operation_timeout_s: must be > 0 (got 0)"),
    (["provider.trainer_port=70000"],
     "provider.trainer_port: must be in [1024, 65000) (got 70000)"),
    (["provider.zones=[]"], "provider.zones: is empty: list the zones VMs may fall back to, "
     "in order (e.g. [us-central1-a])"),
    (["provider.zones=[us-west1-b,us-west9-z]"],
     f"provider.zones.1: unknown zone 'us-west9-z' in catalog 'gce' (one of: {GCE_ZONES})"),
    (["pricing.gpus.t4.zones=[]", "cluster.worker_groups.0.zone=null"],
     "pricing.gpus.t4.zones: is empty: no zone offers GPU 't4' (the zones where "
     "cluster.worker_groups.0 may run)"),
    (["cluster.ps_zone=mars-1a"],
     f"cluster.ps_zone: unknown zone 'mars-1a' (one of: {GCE_ZONES}, local)"),
    (["provider.storage=s3://bucket/runs"],
     f"provider.storage: 's3://bucket/runs' is not a Cloud Storage URL {STORAGE_HINT}"),
    (["provider.storage=gs:///runs"],
     f"provider.storage: 'gs:///runs': '' is not a bucket name {STORAGE_HINT}"),
    (["provider.storage=gs://My_Bucket/runs"],
     f"provider.storage: 'gs://My_Bucket/runs': 'My_Bucket' is not a bucket name {STORAGE_HINT}"),
    (["provider=local", "provider.stop_grace_s=0"], "provider.stop_grace_s: must be > 0 (got 0)"),
]


@pytest.mark.parametrize(("overrides", "line"), ONLY_WRONG, ids=[o[-1] for o, _ in ONLY_WRONG])
def test_a_value_that_can_only_be_wrong_is_one_exact_line(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan(compose_experiment("cifar10_res32", overrides))  # the dry run's checks
    assert info.value.line() == f"config error: {line}"


def test_a_gs_bucket_with_or_without_prefix_is_accepted() -> None:
    for url in ("gs://my-bucket", "gs://my-bucket/runs/a", "gs://runs.example.com/x"):
        make_plan(compose_experiment("cifar10_res32", [f"provider.storage={url}"]))


SSH = ["provider=ssh", "provider.trust_on_first_use=true"]
SSH_WRONG: list[tuple[tuple[str, ...], list[str], str]] = [
    # (the inventory's machines, more overrides of ssh_digits, the exact line)
    (("", "", ", spare: true"), [],
     "provider.hosts: 2 machines are not spare (1 spare), the plan places 3 (ps-0, worker-0, "
     "worker-1): list more machines, or set spare: false on some"),
    (("", ", labels: {gpu: V100}", ", labels: {gpu: T4}", ", labels: {gpu: v100}"),
     ["cluster.worker_groups.0.gpu=t4", "cluster.workers=3"],
     "provider.hosts: no free non-spare machine labelled gpu: t4 (or unlabelled) for "
     "worker-2: label a machine with its GPU, or add one"),
    (("", ", labels: {gpu: H200}", ""), [],
     "provider.hosts.1.labels.gpu: 'H200' names no GPU of catalog 'gce' (one of: k80, p100, "
     "v100, t4, a100, l4, in any case, e.g. T4 or nvidia-tesla-t4)"),
    (("", "", ""), ["provider.hosts.1.port=70000"],
     "provider.hosts.1.port: must be in [1, 65535] (got 70000)"),
    (("", "", ""), ["provider.hosts.2.port=0"],
     "provider.hosts.2.port: must be in [1, 65535] (got 0)"),
    (("", "", ""), ["provider.first_port=80"],
     "provider.first_port: must be in [1024, 65000) (got 80)"),
    (("", "", ""), ["provider.heartbeat_interval_s=0"],
     "provider.heartbeat_interval_s: must be > 0 (got 0)"),
    (("", "", ""), ["provider.max_parallel_handshakes=0"],
     "provider.max_parallel_handshakes: must be ≥ 1 (got 0)"),
]


@pytest.mark.parametrize(("machines", "overrides", "line"), SSH_WRONG,
                         ids=[line.split(":")[0] + str(i)
                              for i, (_, _, line) in enumerate(SSH_WRONG)])
def test_an_ssh_inventory_that_can_only_be_wrong_is_one_exact_line(
        ssh_key: Path, machines: tuple[str, ...], overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_plan(compose_experiment("ssh_digits", [*SSH, ssh_inventory(ssh_key, *machines),
                                                    *overrides]))
    assert info.value.line() == f"config error: {line}"


def documented_inventory(key: Path) -> list[str]:
    """conf/provider/ssh.yaml as documented (lab1 {gpu: T4}, lab2, lab3, lab4 a spare), with
    key files that exist."""
    return [*SSH, *(f"provider.hosts.{i}.key_path={key}" for i in range(4))]


def placed_on(cfg: ExperimentConfig) -> dict[str, str]:
    """Plan host -> inventory machine, as SshProvider.acquire places them (before connecting;
    the provider is new and connects to nothing here)."""
    from provisioning.registry import get_provider

    placed = get_provider("ssh", cfg.provider)._place(make_plan(cfg).host_specs())
    return {name: machine.name for name, machine in placed.items()}


@pytest.mark.parametrize("workers", [1, 2])
def test_the_documented_gpu_t4_label_places_t4_workers(ssh_key: Path, workers: int) -> None:
    """`labels: {gpu: T4}` names the catalog's `t4` (case and GCE's `nvidia-tesla-t4` do not
    matter): a T4 worker goes to that machine first (no longer to an unlabelled one while the
    PS takes the T4 machine), the PS to an unlabelled one, and the spare is left alone."""
    cfg = compose_experiment("ssh_digits", [*documented_inventory(ssh_key),
                                            "cluster.worker_groups.0.gpu=t4",
                                            f"cluster.workers={workers}"])
    assert cfg.provider.hosts[0].labels == {"gpu": "T4"}
    machines = placed_on(cfg)
    assert machines["worker-0"] == "lab1", machines
    assert "lab1" not in [machines[n] for n in machines if n != "worker-0"], machines
    assert "lab4" not in machines.values()  # the spare
    assert len(set(machines.values())) == 1 + workers


def test_a_gpu_label_in_gce_spelling_matches_the_catalog_gpu(ssh_key: Path) -> None:
    cfg = compose_experiment("ssh_digits", [
        *documented_inventory(ssh_key), "provider.hosts.0.labels.gpu=nvidia-tesla-t4",
        "+provider.hosts.1.labels.gpu='NVIDIA Tesla T4'", "cluster.worker_groups.0.gpu=t4"])
    placed = placed_on(cfg)
    assert {placed["worker-0"], placed["worker-1"]} == {"lab1", "lab2"}, placed
    assert placed["ps-0"] == "lab3"


def test_committed_experiments_and_the_documented_inventory_are_not_refused(
        ssh_key: Path) -> None:
    """The limits refuse nothing we ship: every experiment validates with its own provider,
    and ssh_digits with the documented inventory."""
    results = validate_files(sorted((REPO / "experiments").glob("*.yaml")))
    assert not {p.name: e for p, e in results.items() if e}, results
    make_plan(compose_experiment("ssh_digits", documented_inventory(ssh_key)))


CLI_ONLY_WRONG = [
    (["provider=gce", "provider.lease_s=-5"], "provider.lease_s: must be ≥ 0 (got -5)"),
    (["provider=gce", "provider.zones=[]"], "provider.zones: is empty: list the zones VMs "
     "may fall back to, in order (e.g. [us-central1-a])"),
    (["provider=gce", "provider.storage=bucket/runs"], "provider.storage: 'bucket/runs' is not "
     f"a Cloud Storage URL {STORAGE_HINT}"),
]


@pytest.mark.parametrize(("overrides", "line"), CLI_ONLY_WRONG, ids=[o[-1] for o, _ in
                                                                       CLI_ONLY_WRONG])
def test_cli_refuses_a_value_that_can_only_be_wrong_in_one_line(overrides: list[str],
                                                                line: str) -> None:
    """Through the real command in a dry run: exit 2, only that line, nothing planned."""
    proc = _cli("-m", "orchestrator", "+experiment=digits_local", *overrides, "dry_run=true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert proc.stderr.strip() == f"config error: {line}"


def test_cli_refuses_an_ssh_inventory_too_small_for_the_plan(ssh_key: Path) -> None:
    proc = _cli("-m", "orchestrator", "+experiment=ssh_digits", *documented_inventory(ssh_key),
                "provider.hosts.2.spare=true", "dry_run=true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "config error: provider.hosts: 2 machines are not spare (2 spare), the plan places 3 "
        "(ps-0, worker-0, worker-1): list more machines, or set spare: false on some")


def test_a_sync_group_sweep_over_an_experiment_with_a_schedule_is_refused_before_any_point(
        tmp_path: Path) -> None:
    """`-m sync=bsp,asp` on a switch experiment would train BSP→ASP twice, labelled bsp and asp:
    refused in one line naming the schedule keys that would survive, before anything runs."""
    proc = _cli("-m", "orchestrator", "+experiment=syncswitch_cifar10_res32", "-m",
                "sync=bsp,asp", "provider=sim", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert_one_line(line, "sync")
    assert "sync.switch_order, sync.fractions" in line and "label bsp" in line
    assert not list((tmp_path / "sweep").glob("*/summary.json"))


def test_a_sync_group_change_is_free_where_the_experiment_sets_no_schedule_or_the_user_does(
) -> None:
    from hydra import compose, initialize_config_module

    from orchestrator.config.hydra_errors import check_group_change
    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_PACKAGE

    register_configs()
    free = [["+experiment=digits_local", "sync=bsp"],
            ["+experiment=syncswitch_cifar10_res32", "sync=asp", "sync.switch_order=",
             "sync.fractions=[]", "sync.phase_hparams=[]"],
            ["+experiment=syncswitch_cifar10_res32", "sync=switch"]]
    with initialize_config_module(version_base="1.3", config_module=CONF_PACKAGE):
        for overrides in free:
            check_group_change(overrides, compose(config_name="config", overrides=overrides).sync)
        refused = ["+experiment=syncswitch_cifar10_res32", "sync=asp", "sync.fractions=[1.0]"]
        with pytest.raises(ConfigError) as info:
            check_group_change(refused, compose(config_name="config", overrides=refused).sync)
    assert "sync.switch_order, sync.phase_hparams" in info.value.line()
