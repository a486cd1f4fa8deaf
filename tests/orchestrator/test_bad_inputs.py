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


def kind_of(pattern: str) -> type:
    """int or float: the schema type of a RANGES pattern (hparam maps are float per name)."""
    return NUMERIC.get(pattern) or NUMERIC[pattern.rsplit(".", 1)[0] + ".*"]


def test_every_numeric_schema_field_has_a_range() -> None:
    """A numeric field added to the schema without a range fails here, naming it."""
    missing = []
    for pattern in NUMERIC:
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


@pytest.fixture(scope="module")
def base_data() -> dict[str, Any]:
    """digits_local with a straggler, a revocation schedule and a phase schedule: every
    numeric field of the schema is present in it. Valid as it is."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from orchestrator.config.schema import register_configs
    from orchestrator.paths import CONF_DIR

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        composed = compose("config", overrides=["+experiment=digits_local", *BASE_OVERRIDES])
    data = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    validate(to_experiment(data))
    return data


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


def _prepared(base_data: dict[str, Any], pattern: str) -> dict[str, Any]:
    data = copy.deepcopy(base_data)
    for key, value in concrete(pattern)[0].items():
        _set(data, key, copy.deepcopy(value))
    return data


@pytest.fixture(scope="module")
def typed_configs(base_data: dict[str, Any]) -> dict[str, ExperimentConfig]:
    """Each prepared config, typed once (the merge into the schema is the slow part)."""
    typed: dict[str, ExperimentConfig] = {}
    for pattern in RANGES:
        key = repr(concrete(pattern)[0])
        if key not in typed:
            typed[key] = to_experiment(_prepared(base_data, pattern))
    return {pattern: typed[repr(concrete(pattern)[0])] for pattern in RANGES}


def test_prepared_configs_are_valid(typed_configs: dict[str, ExperimentConfig]) -> None:
    """So that in the cases below the bad value, and only it, is the cause."""
    for cfg in {id(c): c for c in typed_configs.values()}.values():
        validate(cfg)


@pytest.mark.parametrize(("pattern", "label", "value"), RANGE_CASES,
                         ids=[f"{p}={lab}" for p, lab, _ in RANGE_CASES])
def test_numeric_field_out_of_range_or_not_a_number(
        base_data: dict[str, Any], typed_configs: dict[str, ExperimentConfig], pattern: str,
        label: str, value: Any) -> None:
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
    # a bad value inside an item that is a mapping of plain values: its key, not only the item
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{learning_rate: fast}]"],
     "sync.phase_hparams.0.learning_rate", "'fast' is not a valid number"),
    ("digits_local", ["sync=switch", "sync.phase_hparams=[{}, {momentum: abc}]"],
     "sync.phase_hparams.1.momentum", "'abc' is not a valid number"),
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
BAD_FILES: dict[str, tuple[str, str, str]] = {
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
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_experiment_file(tmp_path: Path, case: str) -> None:
    text, field, words = BAD_FILES[case]
    path = tmp_path / f"{case.replace('-', '_')}.yaml"
    path.write_text(text)
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
]


@pytest.mark.parametrize(("overrides", "field"), CLI_CASES, ids=[c[1] for c in CLI_CASES])
def test_cli_exits_2_with_one_line(overrides: list[str], field: str) -> None:
    proc = _cli("-m", "orchestrator", "+experiment=digits_local", *overrides, "dry_run=true")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert_one_line(proc.stderr.strip(), field)


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
