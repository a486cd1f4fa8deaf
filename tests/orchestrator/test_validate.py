"""Every class of config error is rejected before anything starts, with the field named."""

from __future__ import annotations

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.validate import compose_experiment, validate_files

BAD_OVERRIDES = [
    # (override, field named in the error, words the message must contain)
    ("+job.unknown=1", "job.unknown", "unknown key"),
    ("job.trian_steps=5", "job.trian_steps", "unknown key"),
    ("+cluster.foo=bar", "cluster.foo", "unknown key"),
    ("job.train_steps=abc", "job.train_steps", "not a valid integer"),
    ("job.batch_size=2.5", "job.batch_size", "not a valid integer"),
    ("job.learning_rate=fast", "job.learning_rate", "not a valid number"),
    ("cluster.worker_groups.0.gpu=h100", "cluster.worker_groups.0.gpu", "unknown GPU 'h100'"),
    ("cluster.worker_groups.0.zone=us-east1-b", "cluster.worker_groups.0.zone",
     "does not offer GPU 't4'"),
    ("cluster.worker_groups.0.zone=mars-1a", "cluster.worker_groups.0.zone", "does not offer"),
    ("cluster.workers=0", "cluster.workers", "must be ≥ 1"),
    ("cluster.workers=-3", "cluster.workers", "must be ≥ 1"),
    ("cluster.parameter_servers=0", "cluster.parameter_servers", "must be ≥ 1"),
    ("job.train_steps=0", "job.train_steps", "must be ≥ 1"),
    ("job.batch_size=-1", "job.batch_size", "must be ≥ 1"),
    ("job.checkpoint_frequency=-5", "job.checkpoint_frequency", "must be ≥ 0"),
    ("sync.protocol=bsq", "sync.protocol", "invalid value 'bsq'"),
    ("sync=ssp", "sync", "unknown option 'ssp'"),
    ("job.model=vgg", "job.model", "unknown model 'vgg'"),
    ("job.hparam_set=resnet_cifar_33", "job.hparam_set", "is not a set of model"),
    ("job.problem=imagenet", "job.problem", "unknown problem"),
    ("job.optimizer=rmsprop", "job.optimizer", "invalid value 'rmsprop'"),
    ("provider.name=azure", "provider.name", "unknown provider 'azure'"),
    ("provider=azure", "provider", "unknown option 'azure'"),
    ("cluster.worker_groups.0.machine_type=n9-huge", "cluster.worker_groups.0.machine_type",
     "unknown machine type"),
    ("job.momentum=1.5", "job.momentum", "must be in [0, 1)"),
]


@pytest.mark.parametrize(("override", "field", "words"), BAD_OVERRIDES,
                         ids=[o for o, _, _ in BAD_OVERRIDES])
def test_bad_override_is_rejected_naming_the_field(override: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", [override])
    line = info.value.line()
    assert line.startswith(f"config error: {field}: "), line
    assert words in line
    assert "\n" not in line


def test_unknown_key_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("digits_local", ["+job.lerning_rate=0.1"])
    assert "valid keys:" in info.value.line() and "learning_rate" in info.value.line()


def test_unknown_provider_key_lists_the_backends_keys() -> None:
    """provider is declared as the base schema; a typo in an ssh provider, or in one of its
    hosts, names the field and lists SSH's keys."""
    with pytest.raises(ConfigError) as info:
        compose_experiment("ssh_digits", ["provider=ssh", "+provider.known_hostz=x"])
    line = info.value.line()
    assert line.startswith("config error: provider.known_hostz: unknown key"), line
    assert "known_hosts" in line and "trust_on_first_use" in line
    with pytest.raises(ConfigError) as info:
        compose_experiment("ssh_digits", ["provider=ssh", "+provider.hosts.0.adress=x"])
    line = info.value.line()
    assert line.startswith("config error: provider.hosts.0.adress: unknown key"), line
    assert "valid keys: name, address" in line


def test_unknown_experiment_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("no_such_experiment")
    assert info.value.path == "experiment"
    assert "digits_local" in info.value.line()


def test_workers_shorthand_rejected_on_a_mixed_cluster() -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("mixed_gpu_cifar10", ["cluster.workers=4"])
    assert info.value.path == "cluster.workers"
    assert "homogeneous" in info.value.problem


def test_phase_fractions_must_add_up() -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("digits_local", [
            "sync.phases=[{protocol: bsp, fraction: 0.5}, {protocol: asp, fraction: 0.4}]"])
    assert info.value.path == "sync.phases"


def test_validate_files_reports_each_bad_file(tmp_path, repo_root) -> None:
    bad = tmp_path / "bad_steps.yaml"
    bad.write_text("# @package _global_\njob:\n  train_steps: 0\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text("# @package _global_\njob:\n  trainsteps: 10\n")
    good = repo_root / "experiments" / "digits_local.yaml"
    results = validate_files([bad, typo, good])
    assert results[good.resolve()] is None
    assert "job.train_steps: must be ≥ 1" in (results[bad.resolve()] or "")
    assert "job.trainsteps" in (results[typo.resolve()] or "")


BAD_FILES = {
    # file body (after the package header) -> (field named, words in the message)
    "cluster:\n  workers: four\n": ("cluster.workers", "not a valid integer"),
    "sync:\n  protocol: ssp\n": ("sync.protocol", "invalid value 'ssp'"),
    "foo: 1\n": ("foo", "unknown key 'foo'"),
    "cluster:\n  worker_groups:\n    - {count: 2, gpus: k80}\n":
        ("cluster.worker_groups.0.gpus", "unknown key 'gpus'"),
    "cluster:\n  worker_groups:\n    - {count: -2}\n":
        ("cluster.worker_groups.0.count", "must be ≥ 1"),
    "defaults:\n  - override /sync: ssp\n": ("sync", "unknown option 'ssp'"),
}


@pytest.mark.parametrize("body", list(BAD_FILES), ids=[v[0] for v in BAD_FILES.values()])
def test_bad_experiment_files_name_the_field(tmp_path, body: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("# @package _global_\n" + body)
    field, words = BAD_FILES[body]
    line = validate_files([path])[path.resolve()] or ""
    assert line.startswith(f"config error: {field}: ") and words in line, line


def test_a_ci_runner_validates_an_ssh_experiment_without_its_key_files(tmp_path) -> None:
    """`transient-validate` in a user's CI: the SSH key and known_hosts live only on the
    machine that runs the experiment, so they are not required there and the check says which
    it skipped; `--check-machine-files` (that machine) and a real run still require them."""
    from orchestrator.validate import main

    exp = tmp_path / "lab.yaml"
    exp.write_text(
        "# @package _global_\ndefaults:\n  - override /cluster: local_cpu\n"
        "  - override /job: digits_cnn\n  - override /provider: ssh\n"
        "provider:\n  known_hosts: /nonexistent/known_hosts\n  hosts:\n"
        + "".join(f"    - {{name: m{i}, address: 10.9.0.{i + 1}, key_path: /nonexistent/key{i}, "
                  "python: python3}\n" for i in range(4)))
    unchecked: dict = {}
    results = validate_files([exp], machine_files=False, unchecked=unchecked)
    assert results[exp.resolve()] is None, results
    assert unchecked[exp.resolve()] == [*(f"provider.hosts.{i}.key_path" for i in range(4)),
                                        "provider.known_hosts"]
    strict = validate_files([exp])[exp.resolve()] or ""
    assert strict.startswith("config error: provider.hosts.0.key_path: no such key file"), strict
    assert main([str(exp)]) == 0
    assert main(["--check-machine-files", str(exp)]) == 1


def test_the_listing_shows_each_experiments_description_and_tags(capsys) -> None:
    """`description` and `tags` are for people: the validate listing is where they are read."""
    from orchestrator.paths import EXPERIMENTS_DIR
    from orchestrator.validate import main

    assert main([str(EXPERIMENTS_DIR / "digits_local.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ok   digits_local.yaml  — Small CNN on 8x8 digits" in out and "[local, digits, asp]" in out
