"""The loader of our own results reads every file of the layout and tolerates its quirks."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.runs import find_run_dirs, load_run, load_runs_table, override_columns


def test_load_run_reads_all_files(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.summary.run_id == "run9" and run.summary.workers == 2
    assert run.summary.extra == {"future_field": 7}  # newer fields kept, not rejected
    assert run.config["cluster"]["workers"] == 2 and run.plan["roles"] == ["ps", "worker"]
    assert list(run.events["kind"]) == ["start", "teardown"]  # torn last line skipped
    assert run.metrics["global_step"].is_unique  # duplicated step collapsed
    assert run.metrics["global_step"].is_monotonic_increasing


def test_phases_parsed(sweep_dir: Path) -> None:
    run = load_run(sweep_dir / "3")
    assert [p.protocol for p in run.summary.phases] == ["bsp", "asp"]
    assert run.summary.switch_overhead_s == 12.0


def test_sweep_table_and_discovery(sweep_dir: Path) -> None:
    assert [p.name for p in find_run_dirs(sweep_dir.parents[1])] == ["0", "1", "2", "3"]
    table = load_runs_table(sweep_dir)
    assert len(table) == 4
    assert set(override_columns(table)) == {"cluster.workers", "sync.protocol", "cluster.transient"}


def test_table_from_summaries_without_runs_csv(sweep_dir: Path) -> None:
    (sweep_dir / "runs.csv").unlink()
    table = load_runs_table(sweep_dir)
    assert sorted(table["run_id"]) == ["run0", "run1", "run2", "run3"]
    assert table["cost_usd"].dtype.kind == "f"


def test_missing_run_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no summary\.json"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no runs\.csv"):
        load_runs_table(tmp_path)
