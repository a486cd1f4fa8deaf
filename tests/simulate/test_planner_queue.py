"""The planner's known answer, the quota queue's policies, sweeps and the CLI path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.simulate.planner import parse_args, plan_experiment
from orchestrator.simulate.queue import QueuedRun, compare, schedule
from orchestrator.simulate.sweep import run_sweep

REPO = Path(__file__).resolve().parents[2]


def test_planner_finds_the_papers_cheapest_k80_cluster_within_an_hour(tmp_path: Path) -> None:
    """ICAC'19 (2019 prices): 4 transient K80 workers need 3,765 s (> 1 h), 8 need 1,841 s for
    $1.11, 8 on-demand cost $3.01 and 16 workers saturate the PS. So the cheapest K80 cluster
    that finishes 64k ResNet-32 steps within 1 h is 8 transient workers."""
    ranked, out = plan_experiment(parse_args([
        "+experiment=icac19_k80", "pricing=papers_2019", "deadline_h=1",
        "planner.gpus=[k80]", "planner.min_p_deadline=0.9", "planner.zones=first",
        "planner.repeats=20", "planner.max_repeats=40", "objective=cost"]), tmp_path)
    best = ranked[0]
    assert (best["gpu"], best["workers"], best["transient"]) == ("k80", 8, True)
    assert best["p_deadline"] >= 0.9
    assert all(r["workers"] >= 8 for r in ranked)  # 1, 2 and 4 workers miss the hour
    assert (out / "pareto.png").stat().st_size > 10_000 and (out / "plan.csv").exists()


def _runs() -> list[QueuedRun]:
    # a sweep in submission order: long runs first, then short ones (GPUs, seconds)
    sizes = [(8, 7200), (8, 6000), (4, 600), (4, 900), (2, 300), (8, 1200), (16, 400)]
    return [QueuedRun(str(i), g, d, d) for i, (g, d) in enumerate(sizes)]


def test_quota_policies_order_and_las_needs_no_lengths() -> None:
    runs = _runs()
    fifo, spf = schedule(runs, 16, "fifo"), schedule(runs, 16, "spf")
    las = schedule(runs, 16, "las", las_threshold_gpu_h=0.5)
    assert las.average_s < fifo.average_s and spf.average_s < fifo.average_s
    # Gittins, knowing the distribution of lengths, preempts less for the same average here
    gittins = schedule(runs, 16, "gittins", las_threshold_gpu_h=0.5)
    assert gittins.average_s <= las.average_s and gittins.preemptions < las.preemptions
    # LAS ignores predictions: scrambled predictions change SPF, not LAS
    wrong = [QueuedRun(r.name, r.gpus, r.duration_s, 1e5 - r.duration_s) for r in runs]
    assert schedule(wrong, 16, "las", 0.5).completion_s == las.completion_s
    assert schedule(wrong, 16, "spf").average_s > spf.average_s
    # the quota is never exceeded and every run completes after its duration
    for s in (fifo, spf, las, gittins):
        assert all(s.completion_s[r.name] >= r.duration_s for r in runs)
    ranked = compare(runs, 16, 0.5, 0.0)
    assert [s.average_s for s in ranked] == sorted(s.average_s for s in ranked)
    assert ranked[-1].policy == "fifo"
    with pytest.raises(ValueError, match="quota_gpus=4"):
        schedule(runs, 4, "fifo")


def test_batched_sweep_writes_the_results_schema_and_queue(tmp_path: Path) -> None:
    runs = run_sweep(["+experiment=cifar10_res32", "provider=sim"],
                     ["cluster.workers=2,8", "job.train_steps=4000,16000"], tmp_path)
    assert len(runs) == 4
    rows = (tmp_path / "runs.csv").read_text().splitlines()
    assert len(rows) == 5 and rows[0].startswith("cluster.workers,job.train_steps")
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["provider"] == "sim" and summary["status"] == "completed"
    for name in ("config.yaml", "plan.json", "events.jsonl", "metrics.csv"):
        assert (tmp_path / "0" / name).exists()
    from analysis.runs import load_runs_table

    table = load_runs_table(tmp_path)
    assert len(table) == 4 and set(table["provider"]) == {"sim"}


def test_queue_compare_false_reports_the_configured_policy_alone(tmp_path: Path,
                                                                   capsys) -> None:
    from orchestrator.config.simulate import QueueConfig, QueuePolicy
    from orchestrator.simulate.sweep import report_queue

    runs = run_sweep(["+experiment=cifar10_res32", "provider=sim"],
                     ["cluster.workers=2,8"], tmp_path)
    every = report_queue(runs, QueueConfig(quota_gpus=8), "resnet_cifar_32", tmp_path)
    assert len(every) > 1 and "best:" in capsys.readouterr().out
    alone = report_queue(runs, QueueConfig(policy=QueuePolicy.las, quota_gpus=8, compare=False),
                         "resnet_cifar_32", tmp_path)
    assert [s.policy for s in alone] == ["las"] and "best:" not in capsys.readouterr().out
    assert [s["policy"] for s in json.loads((tmp_path / "queue.json").read_text())[
        "schedules"]] == ["las"]


def test_hydra_multirun_with_provider_sim(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32", "-m",
         "cluster.workers=4,8", "provider=sim", f"hydra.sweep.dir={tmp_path}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = (tmp_path / "runs.csv").read_text().splitlines()
    assert len(rows) == 3 and ",sim," in rows[1]
