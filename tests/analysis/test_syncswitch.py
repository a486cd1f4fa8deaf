"""Sync-Switch numbers reproduced from the ``Time`` column; the offline switch-point policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import syncswitch as ss


@pytest.fixture(scope="module")
def cifar10():
    return ss.summarize(ss.load_reference_runs("cifar10_res32")).set_index("protocol")


@pytest.mark.parametrize(("protocol", "time_s", "accuracy"), [
    ("BSP", 10603.7, 0.9200), ("ASP", 1607.3, 0.8918), ("BSP 5% → ASP", 2085.7, 0.9174)])
def test_cifar10_reproduction(cifar10, protocol: str, time_s: float, accuracy: float) -> None:
    row = cifar10.loc[protocol]
    assert row["time_s"] == pytest.approx(time_s, abs=0.1)
    assert row["accuracy"] == pytest.approx(accuracy, abs=1e-4)


def test_speedup_claim(cifar10) -> None:
    assert cifar10.loc["BSP 5% → ASP", "speedup_vs_bsp"] == pytest.approx(5.1, abs=0.05)
    assert cifar10.loc["BSP 4% → ASP", "speedup_vs_bsp"] == pytest.approx(5.4, abs=0.05)


def test_cifar100_and_cluster16() -> None:
    c100 = ss.summarize(ss.load_reference_runs("cifar100_res50")).set_index("bsp_fraction")
    assert c100.loc[1.0, "time_s"] == pytest.approx(11304, abs=1)
    assert c100.loc[0.125, "accuracy"] == pytest.approx(0.746, abs=5e-4)
    c16 = ss.summarize(ss.load_reference_runs("cluster_16")).set_index("bsp_fraction")
    assert c16.loc[0.5, "time_s"] == pytest.approx(5139, abs=1)


@pytest.mark.parametrize(("name", "expected"), [
    ("b5-a95-run3", (0.05, False, 3)), ("a25-b75-run1", (0.75, True, 1)),
    ("b50_a50_run5", (0.5, False, 5)), ("b50-a50", (0.5, False, 1)), ("6_94_2", (0.0625, False, 2)),
    ("12_88_5", (0.125, False, 5)), ("5050_run2", (0.5, False, 2)), ("bsp_run3", (1.0, False, 3)),
    ("asp_4", (0.0, False, 4))])
def test_parse_run_name(name: str, expected) -> None:
    assert ss.parse_run_name(name) == expected


def test_exclusions_are_explained() -> None:
    left_out = {r.name: r.note for r in ss.load_reference_runs("cifar10_res32") if not r.complete}
    assert "cifar10_res32/baseline/bsp_1" in left_out
    assert all(left_out.values())


class TestOfflinePolicy:
    def test_first_step_halves(self) -> None:
        d = ss.recommend_next_fraction({1.0: 0.92})
        assert d.next_fraction == 0.5 and d.best_fraction == 1.0

    def test_halving_while_passing(self) -> None:
        d = ss.recommend_next_fraction({1.0: 0.92, 0.5: 0.919, 0.25: 0.918})
        assert d.next_fraction == 0.125 and d.best_fraction == 0.25

    def test_bisects_after_a_failure(self) -> None:
        d = ss.recommend_next_fraction({1.0: 0.92, 0.5: 0.919, 0.25: 0.918, 0.125: 0.90})
        assert d.next_fraction == pytest.approx(0.1875) and d.lower == 0.125

    def test_converges(self) -> None:
        d = ss.recommend_next_fraction({1.0: 0.92, 0.05: 0.917, 0.04: 0.91})
        assert d.next_fraction is None and d.best_fraction == 0.05

    def test_reference_cifar10(self, cifar10) -> None:
        d = ss.recommend_next_fraction(cifar10.reset_index(), tolerance=0.005)
        assert d.best_fraction == 0.05 and d.next_fraction is None

    def test_needs_bsp_accuracy(self) -> None:
        with pytest.raises(ValueError, match="full-BSP"):
            ss.recommend_next_fraction({0.5: 0.9})


def test_time_to_accuracy() -> None:
    import pandas as pd

    curve = pd.DataFrame({"time_s": [0, 10, 20], "accuracy": [0.1, 0.8, 0.9]})
    assert ss.time_to_accuracy(curve, 0.85) == 20
    assert ss.time_to_accuracy(curve, 0.95) != ss.time_to_accuracy(curve, 0.95)  # NaN


def test_own_runs_phases(sweep_dir: Path) -> None:
    runs = {r.name: r for r in ss.own_runs(sweep_dir)}
    hybrid = runs["run3"]
    assert hybrid.bsp_fraction == pytest.approx(100 / (100 + 1800 / 2))
    assert hybrid.time_s == 140.0  # phase wall times; the switch pause is not counted
    assert runs["run2"].protocol == "ASP"
