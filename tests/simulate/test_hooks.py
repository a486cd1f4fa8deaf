"""The hooks into the shared spine: the dry run's band line, the prediction in summary.json."""

from __future__ import annotations

import time

from rich.console import Console

from orchestrator.display import render_plan
from orchestrator.plan import make_plan
from orchestrator.simulate.band import predict_band
from orchestrator.simulate.validate import compose


def test_dry_run_shows_a_band_or_says_why_not() -> None:
    cfg = compose(["+experiment=transient_k80_8", "sim.repeats=5", "dry_run=true"])
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    band = plan.prediction
    assert band is not None and band["runs"] == 5
    assert band["wall_time_s"]["p10"] <= band["wall_time_s"]["p50"] <= band["wall_time_s"]["p90"]
    console = Console(record=True, width=200)
    render_plan(plan, console)
    assert "simulated (p10–p90 of 5)" in console.export_text()

    cpu = compose(["dry_run=true"])  # digits on CPU workers: no paper measured them
    cpu_plan = make_plan(cpu)
    cpu_plan.prediction = predict_band(cpu, cpu_plan)
    console = Console(record=True, width=200)
    render_plan(cpu_plan, console)
    assert "simulated: n/a (no speed model" in console.export_text()


def test_summary_of_a_real_run_carries_the_prediction() -> None:
    from orchestrator.run import make_summary

    cfg = compose(["+experiment=cifar10_res32", "sim.repeats=3"])
    plan = make_plan(cfg)
    plan.prediction = predict_band(cfg, plan)
    summary = make_summary(cfg, plan, "run-1", "failed", time.time(), None, "stopped")
    assert summary["predicted"] == plan.prediction and summary["predicted"]["runs"] == 3
