"""ICAC'19's cost/speed comparison reproduced; the same table on our own runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import cost


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
