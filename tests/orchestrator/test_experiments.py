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
