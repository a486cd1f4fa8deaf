"""The user's repository is first-class: its experiments and config groups are found before the
packaged ones, from any folder inside it, and validate/init work on it (issue 24).

In-process through the same composition the command line uses (Hydra's search path with our
plugin), plus one real command line for the one-line error. The installed wheel is proved from
outside the checkout by test_installed.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import init, user_repo
from orchestrator import validate as validate_cli
from orchestrator.config.errors import ConfigError
from orchestrator.validate import compose_experiment, validate_files

HEADER = "# @package _global_\n"
MINE = HEADER + """defaults:
  - override /provider: lab
name: mine
cluster:
  workers: 1
job:
  train_steps: 77
"""
# a user provider of the local backend: composes and plans without any machine or key
LAB = """defaults:
  - local_schema
  - _self_
name: local
ready_timeout_s: 33.0
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user repository (a git work tree) with one experiment and one provider; cwd = its root."""
    root = tmp_path / "lab-experiments"
    (root / ".git").mkdir(parents=True)
    (root / "experiments").mkdir()
    (root / "experiments" / "mine.yaml").write_text(MINE)
    (root / "conf" / "provider").mkdir(parents=True)
    (root / "conf" / "provider" / "lab.yaml").write_text(LAB)
    monkeypatch.delenv(user_repo.ROOT_ENV, raising=False)
    monkeypatch.chdir(root)
    return root


def test_user_experiment_and_provider_found_from_a_subfolder(repo: Path, monkeypatch) -> None:
    (repo / "notebooks" / "deep").mkdir(parents=True)
    monkeypatch.chdir(repo / "notebooks" / "deep")
    cfg = compose_experiment("mine")
    assert cfg.name == "mine" and cfg.job.train_steps == 77
    assert cfg.provider.ready_timeout_s == 33.0  # the user's conf/provider/lab.yaml


def test_packaged_experiments_and_groups_still_found(repo: Path) -> None:
    cfg = compose_experiment("digits_local", ["provider=lab"])
    assert cfg.name == "digits_local" and cfg.provider.ready_timeout_s == 33.0


def test_a_user_file_comes_before_a_packaged_one_of_the_same_name(repo: Path) -> None:
    (repo / "experiments" / "digits_local.yaml").write_text(
        MINE.replace("name: mine", "name: my_digits"))
    assert compose_experiment("digits_local").name == "my_digits"


def test_an_experiment_defined_twice_in_the_repository_is_ambiguous(repo: Path) -> None:
    (repo / "conf" / "experiment").mkdir()
    (repo / "conf" / "experiment" / "mine.yaml").write_text(MINE)
    with pytest.raises(ConfigError) as info:
        compose_experiment("mine")
    line = info.value.line()
    assert line.startswith("config error: experiment: 'mine' is ambiguous")
    assert str(repo / "experiments" / "mine.yaml") in line
    assert str(repo / "conf" / "experiment" / "mine.yaml") in line


def test_a_missing_experiment_says_where_it_looked(repo: Path) -> None:
    (repo / "experiments" / "typo.yml").write_text(MINE)
    with pytest.raises(ConfigError) as info:
        compose_experiment("typo")
    line = info.value.line()
    assert info.value.path == "experiment" and "\n" not in line
    assert f"looked in {repo / 'experiments'}/ and the packaged examples" in line
    assert "rename it to typo.yaml" in line
    assert "mine" in line and "digits_local" in line  # what is available, theirs and ours


@pytest.mark.parametrize(("content", "words"), [
    (HEADER.encode() + b"name: x\n\xff\xfe\x00", "is not UTF-8 text (it holds the byte 0xff)"),
    ((HEADER + "defaults:\nname: x\n").encode(), "its 'defaults:' is empty (null), not a list"),
], ids=["binary", "empty-defaults"])
def test_an_unreadable_user_experiment_is_named_by_its_file(repo: Path, content: bytes,
                                                             words: str) -> None:
    """A binary file, or `defaults:` with nothing under it, read through the user's
    repository: one line naming the file as the user finds it, not a traceback."""
    (repo / "experiments" / "broken.yaml").write_bytes(content)
    with pytest.raises(ConfigError) as info:
        compose_experiment("broken")
    assert info.value.line().startswith(f"config error: experiments/broken.yaml: {words}")


def test_a_missing_group_option_says_where_it_looked(repo: Path) -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("mine", ["provider=labb"])
    assert info.value.path == "provider"
    assert f"looked in {repo / 'conf' / 'provider'}/ and the packaged options" in info.value.line()


def test_a_typo_in_a_user_lab_inventory_names_the_field_and_its_backends_keys(repo: Path) -> None:
    (repo / "conf" / "provider" / "typo.yaml").write_text(
        "defaults:\n  - ssh_schema\n  - _self_\nname: ssh\nknown_hostz: /tmp/kh\n")
    with pytest.raises(ConfigError) as info:
        compose_experiment("mine", ["provider=typo"])
    line = info.value.line()
    assert line.startswith("config error: provider.known_hostz: unknown key"), line
    assert "known_hosts" in line and "trust_on_first_use" in line  # SSH's, not the base's
    (repo / "conf" / "provider" / "typo.yaml").write_text(
        "defaults:\n  - ssh_schema\n  - _self_\nname: ssh\nhosts:\n"
        "  - {name: a, address: 192.0.2.1}\n  - {name: b, adress: 192.0.2.2}\n")
    with pytest.raises(ConfigError) as info:
        compose_experiment("mine", ["provider=typo"])
    line = info.value.line()  # the host at fault, as an override would name it
    assert line.startswith("config error: provider.hosts.1.adress: unknown key"), line
    assert "valid keys: name, address" in line


def test_outside_any_repository_only_the_packaged_config(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "elsewhere" / ".git").mkdir(parents=True)
    (tmp_path / "experiments").mkdir()  # above the git root: not this repository's
    monkeypatch.delenv(user_repo.ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert user_repo.find_root() is None
    assert compose_experiment("digits_local").name == "digits_local"
    with pytest.raises(ConfigError) as info:
        compose_experiment("mine")
    assert "looked in the packaged examples only" in info.value.line()


def test_the_environment_names_the_repository(repo: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(user_repo.ROOT_ENV, str(repo))
    assert compose_experiment("mine").name == "mine"


def test_the_tool_checkout_is_not_a_user_repository(repo_root: Path) -> None:
    assert user_repo.find_root(repo_root) == repo_root
    assert user_repo.user_root(repo_root) is None  # its folders are the packaged config


def test_validate_checks_the_repository_experiments(repo: Path, capsys) -> None:
    assert validate_cli.main([]) == 0
    assert "ok   mine.yaml" in capsys.readouterr().out
    (repo / "experiments" / "bad.yaml").write_text(HEADER + "cluster:\n  workers: 0\n")
    assert validate_cli.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL bad.yaml: config error: cluster.workers: must be ≥ 1" in out
    assert "1 valid, 1 invalid" in out


def test_validate_finding_nothing_fails_saying_where(tmp_path: Path, monkeypatch,
                                                      capsys) -> None:
    monkeypatch.delenv(user_repo.ROOT_ENV, raising=False)
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    assert validate_cli.main([]) == 2
    assert f"no experiments/ folder in {tmp_path}" in capsys.readouterr().err
    (tmp_path / "experiments").mkdir()
    assert validate_cli.main([]) == 2
    assert f"looked in {tmp_path / 'experiments'}/*.yaml" in capsys.readouterr().err


def test_validate_a_file_outside_the_repository_reads_that_file(repo: Path,
                                                                 tmp_path: Path) -> None:
    # named like a packaged example, and using the repository's own provider
    other = tmp_path / "digits_local.yaml"
    other.write_text(MINE.replace("workers: 1", "workers: 0"))
    assert "cluster.workers: must be ≥ 1" in (validate_files([other])[other.resolve()] or "")
    assert compose_experiment("digits_local").cluster.workers == 2  # nothing left pinned


def test_init_writes_a_valid_repository_and_overwrites_nothing(tmp_path: Path, monkeypatch,
                                                                capsys) -> None:
    monkeypatch.delenv(user_repo.ROOT_ENV, raising=False)
    target = tmp_path / "new-repo"
    assert init.main([str(target)]) == 0
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [".github/workflows/validate-experiments.yml", ".gitignore",
                     "conf/provider/cloud.yaml", "conf/provider/lab.yaml",
                     "experiments/my_experiment.yaml"]
    lab = (target / "conf" / "provider" / "lab.yaml").read_text()
    assert "name: ssh" in lab and "hosts:" in lab
    (target / ".gitignore").write_text("mine\n")
    capsys.readouterr()
    assert init.main([str(target)]) == 0
    out = capsys.readouterr().out
    assert "wrote" not in out and out.count("kept") == 5
    assert "add outputs/, multirun/, conf/local/ to .gitignore" in out
    assert (target / ".gitignore").read_text() == "mine\n"
    monkeypatch.chdir(target)
    assert validate_cli.main([]) == 0
    cfg = compose_experiment("my_experiment", ["provider=cloud", "provider.project=p"])
    assert cfg.provider.name == "gce"


def test_cli_missing_experiment_is_one_line(repo: Path) -> None:
    """The real command outside the checkout (here: the editable install's path hook)."""
    env = {k: v for k, v in os.environ.items() if k != user_repo.ROOT_ENV}
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "+experiment=nope",
                           "dry_run=true"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""
    assert proc.stderr.startswith("config error: experiment: unknown option 'nope' (looked in "
                                  f"{repo / 'experiments'}/ and the packaged examples")
    assert "mine" in proc.stderr and "digits_local" in proc.stderr  # both trees were read
