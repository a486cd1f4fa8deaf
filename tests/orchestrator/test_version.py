"""``--version`` on every command, and usage/help in the words the user ran the tool by
(orchestrator/version.py): the installed scripts of this venv, and the ``python -m`` forms."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainer.layout import HOST_DIST

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SCRIPTS = list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def _run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_installed_script_prints_its_own_version(script: str) -> None:
    if not (BIN / script).exists():
        pytest.fail(f"{script} is not installed in {BIN}: pip install -e . first")
    done = _run(str(BIN / script), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{script} {VERSION}"  # not Hydra's "Hydra 1.3.x"


#: Every command a user runs as ``python -m`` (README.md, docs/*.md), with the words it is run by.
MODULE_COMMANDS = [
    "orchestrator", "orchestrator.validate", "orchestrator.init", "orchestrator.release",
    "orchestrator.plan", "orchestrator.gc", "orchestrator.image", "orchestrator.controller",
    "orchestrator.simulate.calibrate", "orchestrator.simulate.fit",
    "orchestrator.simulate.reliability", "orchestrator.simulate.sweep",
    "orchestrator.simulate.validate", "provisioning.gce.storage", "trainer", "trainer.data",
    "analysis", *(f"analysis {command}" for command in (
        "speed-model", "scaling", "checkpoint-model", "lifetimes", "cost", "syncswitch",
        "report")),
]


@pytest.mark.parametrize("command", MODULE_COMMANDS)
def test_every_module_command_prints_its_own_version(command: str) -> None:
    """``--version`` answers before any TensorFlow import or Hydra composition: the trainer's
    and the analysis commands' too (those would take seconds, and fail on a missing GPU
    library or config)."""
    done = _run(sys.executable, "-m", *command.split(), "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"python -m {command} {VERSION}"
    assert "tensorflow" not in done.stderr.lower()


def test_the_trainer_on_a_host_says_the_hosts_wheels_version(tmp_path: Path) -> None:
    """A host has the hosts' wheel (trainer only, no orchestrator): its --version is that
    wheel's. The host is stood in for by an interpreter without site-packages (-S) whose path
    holds a copy of `trainer` and the wheel's metadata, as pip installs them."""
    shutil.copytree(REPO / "trainer", tmp_path / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = tmp_path / f"{HOST_DIST.replace('-', '_')}-9.8.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {HOST_DIST}\nVersion: 9.8.7\n")
    done = _run(sys.executable, "-S", "-m", "trainer", "--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "python -m trainer 9.8.7"


def test_help_speaks_the_installed_users_words(tmp_path: Path) -> None:
    """Run from an empty folder, as an installed user would: the usage names the scripts they
    have, and the reference pages are files on their disk."""
    done = _run(str(BIN / "transient-orchestrator"), "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "  transient-orchestrator [+experiment=NAME]" in out
    assert "  transient-validate [FILES]" in out and "  transient-init [DIR]" in out
    assert "python -m orchestrator " not in out and "docs/configuration.md" not in out
    shipped = Path(out.split("shipped with the tool in ", 1)[1].split(":", 1)[0])
    assert (shipped / "configuration.md").is_file() and (shipped / "running.md").is_file()
    usage = _run(str(BIN / "transient-validate"), "--help", cwd=tmp_path).stdout
    assert usage.startswith("usage: transient-validate ")


def test_the_module_form_keeps_its_own_usage() -> None:
    out = _run(sys.executable, "-m", "orchestrator", "--help").stdout
    assert "  python -m orchestrator [+experiment=NAME]" in out
    assert "  python -m orchestrator.validate [FILES]" in out
    usage = _run(sys.executable, "-m", "orchestrator.init", "--help").stdout
    assert usage.startswith("usage: python -m orchestrator.init ")
