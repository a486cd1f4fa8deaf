"""``provider=sim``: simulate a planned run and write it as a run directory of the real schema.

The player the entry point picks for a backend that declares itself ``simulated``. Writes the
same files a real run writes (``config.yaml``, ``plan.json``, ``events.jsonl``, ``metrics.csv``,
``summary.json``; the sweep's ``runs.csv`` is appended by the entry point as for any run), so
``python -m analysis`` reads simulated and measured runs alike. Event times are unix seconds
from the moment the simulation was written, as if the run had started then.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import RunPlan
from orchestrator.rundir import results
from orchestrator.rundir.record import RunState, make_run_id, summarize
from orchestrator.simulate.engine import SimResult, simulate
from orchestrator.simulate.models import NoModelError


def write_run(result: SimResult, run_dir: Path, resolved_config: dict[str, Any],
              plan: RunPlan) -> None:
    """The run directory of a simulated run."""
    rec = results.RunRecorder(run_dir)
    try:
        rec.write_config(resolved_config)
        rec.write_json(results.PLAN_FILE, plan.to_dict())
        epoch = time.time()
        for event in result.events:
            fields = {k: v for k, v in event.items() if k not in ("t", "kind", "role")}
            rec.event(event["kind"], role=event["role"], time_s=epoch + event["t"], **fields)
        for row in result.metrics:
            rec.metric(row["wall_time_s"], row["global_step"], row["steps_per_sec"])
        summary = result.summary
        if summary["status"] == results.STATUS_COMPLETED:
            rec.metric(summary["wall_time_s"], summary["global_steps"], summary["steps_per_sec"],
                       eval_accuracy=summary["final_accuracy"])
        if summary["error"]:
            rec.write_error(summary["error"] + "\n")
        rec.write_summary(summary)
    finally:
        rec.close()


def execute_sim(cfg: ExperimentConfig, plan: RunPlan, run_dir: Path,
                resolved_config: dict[str, Any], title: str = "",
                sweep_id: str | None = None) -> dict[str, Any]:
    """Simulate and record one run; returns its summary (status failed with the reason when
    the fitted models cannot predict this setup). The signature of the real player
    (:func:`orchestrator.runtime.run.execute_run`); ``title`` and ``sweep_id`` are unused: nothing is
    shown while it runs, and nothing is provisioned that a sweep would label."""
    try:
        result = simulate(cfg, plan)
        result.summary["run_id"] = make_run_id(cfg.name)
    except NoModelError as ex:
        summary = summarize(RunState(), plan.to_dict(), run_id=make_run_id(cfg.name),
                            status=results.STATUS_FAILED, wall_s=0.0, cost_usd=0.0,
                            error=f"cannot simulate: {ex}")
        result = SimResult(summary.to_dict())
    write_run(result, run_dir, resolved_config, plan)
    return result.summary
