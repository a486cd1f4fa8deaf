"""Every committed experiment composes, validates and dry-runs (plans and renders its plan).

Parametrised by a glob over ``experiments/``, so an experiment is covered the day it is
committed; ``make ci`` also dry-runs each one through the real command line.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.display import render_plan
from orchestrator.paths import EXPERIMENTS_DIR
from orchestrator.plan import make_plan
from orchestrator.validate import compose_experiment

EXPERIMENTS = sorted(EXPERIMENTS_DIR.glob("*.yaml"))


def test_there_are_experiments() -> None:
    assert len(EXPERIMENTS) >= 7


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_dry_runs(path: Path) -> None:
    assert path.read_text().startswith("# @package _global_\n"), "first line must be the header"
    cfg = compose_experiment(path.stem)
    plan = make_plan(cfg)
    assert plan.hosts and plan.total_steps > 0
    out = io.StringIO()
    render_plan(plan, Console(file=out, width=160), title=f"Plan: {cfg.name} (dry run)")
    assert cfg.name in out.getvalue()


def _composed_job(args: list[str], env: dict[str, str] | None = None) -> str:
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args, "--cfg", "job"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("order", ["after", "before"])
def test_the_debug_preset_shortens_the_experiment_wherever_it_is_typed(order: str) -> None:
    """Hydra's template convention: ``+debug=default`` merges after the experiment (which sets
    600 steps) also when typed before it."""
    args = ["+experiment=syncswitch_digits", "+debug=default"]
    out = _composed_job(args if order == "after" else args[::-1])
    assert "  train_steps: 40\n" in out and "report_every_s: 0.2" in out


def test_the_optional_local_group_is_read_from_the_users_repository(tmp_path: Path) -> None:
    """``conf/local/default.yaml`` (git-ignored) holds one machine's settings; without it the
    config composes as before."""
    (tmp_path / "conf" / "local").mkdir(parents=True)
    (tmp_path / "conf" / "local" / "default.yaml").write_text(
        "# @package _global_\ndata_cache: /srv/datasets\n")
    assert "data_cache: /srv/datasets" in _composed_job(
        ["+experiment=digits_local"], {"TRANSIENT_REPO": str(tmp_path)})
    assert "data_cache: null" in _composed_job(["+experiment=digits_local"])
