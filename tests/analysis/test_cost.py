"""ICAC'19's cost/speed comparison reproduced; the same table on our own runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import cost
from tests.analysis.conftest import write_run


@pytest.fixture(scope="module")
def headline() -> cost.Headline:
    return cost.icac19_headline()


def test_headline_numbers(headline: cost.Headline) -> None:
    assert headline.speedup == pytest.approx(7.65, abs=0.01)
    assert round(headline.transient_time_s, 1) == 1840.5
    assert round(headline.on_demand_1_time_s, 1) == 14081.0
    assert round(headline.transient_cost_usd, 4) == 1.1145
    assert round(headline.on_demand_n_cost_usd, 4) == 3.0126
    assert round(headline.savings_vs_n_on_demand_pct, 1) == 63.0  # paper: 62.9 %


def test_accuracy_by_cluster_size() -> None:
    table = cost.icac19_k80_table().set_index(["workers", "transient"])["accuracy"].round(4)
    assert table[(1, False)] == 0.9307
    assert [table[(n, True)] for n in (2, 4, 8)] == [0.9193, 0.9123, 0.8879]


def test_price_model_reproduces_on_demand_costs() -> None:
    table = cost.icac19_k80_table()
    on_demand = table[~table["transient"]]
    assert on_demand["price_model_cost_usd"].to_numpy() == pytest.approx(
        on_demand["cost_usd"].to_numpy(), rel=1e-3)


def test_pareto_mask() -> None:
    mask = cost.pareto_mask([1.0, 2.0, 3.0, 1.5], [3.0, 1.0, 2.0, 3.5])
    assert mask.tolist() == [True, True, False, False]


def test_reference_pareto() -> None:
    table = cost.cost_table("reference")
    assert set(table.loc[table["pareto"], "config"]) == {"8 transient K80", "8 on-demand K80"}


def test_own_runs(sweep_dir: Path) -> None:
    table = cost.cost_table(sweep_dir)
    assert len(table) == 4
    base = table[(table["workers"] == 1) & ~table["transient"]].iloc[0]
    assert base["speedup_vs_1_on_demand"] == 1.0
    asp = table[table["config"].str.contains("asp")].iloc[0]
    assert asp["speedup_vs_1_on_demand"] == pytest.approx(400 / 150)
    assert asp["savings_vs_1_on_demand_pct"] == pytest.approx(50.0)
    assert asp["pareto"]


def test_cli_json(capsys) -> None:
    assert cost.main(["reference", "--json"]) == 0
    assert '"speedup"' in capsys.readouterr().out


def _sweep(root: Path, rows: list[dict], transient: bool) -> Path:
    """A sweep whose markets are only in each run's plan.json (no override column names them)."""
    for i, row in enumerate(rows):
        run = write_run(root / str(i), str(i), row["workers"], "asp", None, row["wall_time_s"],
                        row["cost_usd"], row["final_accuracy"])
        hosts = [{"role": "ps", "transient": False},
                 {"role": "worker", "transient": transient}]
        (run / "plan.json").write_text(json.dumps({"hosts": hosts}))
        row.update(run_dir=str(run), status="completed", run_id=f"run{i}")
    pd.DataFrame(rows).to_csv(root / "runs.csv", index=False)
    return root


def test_a_seed_sweep_at_one_size_is_one_configuration_read_as_transient_from_its_plans(
        tmp_path: Path, capsys) -> None:
    rows = [{"job.seed": s, "workers": 4, "wall_time_s": 100.0 + s, "cost_usd": 0.1,
             "final_accuracy": 0.9} for s in (1, 2, 3)]
    table = cost.cost_table(_sweep(tmp_path / "seeds", rows, transient=True))
    assert len(table) == 1 and table.iloc[0]["runs"] == 3 and table.iloc[0]["transient"]
    assert table["speedup_vs_1_on_demand"].isna().all()
    assert cost.main([str(tmp_path / "seeds")]) == 0
    assert "no on-demand configuration" in capsys.readouterr().out


def test_learning_rates_at_one_size_have_no_single_baseline(tmp_path: Path, capsys) -> None:
    rows = [{"job.hparams.learning_rate": lr, "workers": 2, "wall_time_s": 100.0,
             "cost_usd": 0.1, "final_accuracy": acc} for lr, acc in ((0.1, 0.9), (0.01, 0.8))]
    table = cost.cost_table(_sweep(tmp_path / "lr", rows, transient=False))
    assert len(table) == 2 and not table["transient"].any()
    assert table["savings_vs_n_on_demand_pct"].isna().all()
    assert cost.main([str(tmp_path / "lr")]) == 0
    assert "several on-demand configurations have 2 worker(s)" in capsys.readouterr().out
