"""The report writes valid HTML whose images exist, for the reference data and our sweeps."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from analysis.report import build_report


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.stack: list[str] = []
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag not in ("meta", "br"):
            self.stack.append(tag)
        self.tables += tag == "table"

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}>"
        self.stack.pop()


def _check(page: Path) -> _Collector:
    parser = _Collector()
    parser.feed(page.read_text())
    assert parser.stack == []
    assert parser.images and all((page.parent / src).stat().st_size > 5000 for src in parser.images)
    assert all(re.fullmatch(r"[\w.-]+\.png", src) for src in parser.images)
    return parser


@pytest.fixture(scope="module")
def reference_report(tmp_path_factory) -> Path:
    return build_report("reference", tmp_path_factory.mktemp("ref"))


def test_reference_report(reference_report: Path) -> None:
    parser = _check(reference_report)
    assert len(parser.images) >= 6 and parser.tables >= 5
    text = reference_report.read_text()
    for needle in ("Speed vs workers", "Revocation lifetimes", "Cost and speed", "Sync-Switch"):
        assert needle in text


def test_own_report(sweep_dir: Path, tmp_path: Path) -> None:
    page = build_report(sweep_dir, tmp_path / "out")
    parser = _check(page)
    assert {"speed_vs_workers.png", "cost_pareto.png", "accuracy_curves.png"} <= set(parser.images)


def _page_text(page: Path) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text()))


def test_single_run_report_says_instead_of_plotting(run_dir: Path, tmp_path: Path) -> None:
    """One run has nothing to compare: numbers and a sentence, no one-point plots."""
    page = build_report(run_dir, tmp_path / "out")
    parser = _Collector()
    parser.feed(page.read_text())
    assert parser.stack == [] and parser.images == []
    assert not list(page.parent.glob("*.png"))
    text = _page_text(page)
    assert "same cluster size (2 workers)" in text
    assert "One configuration (workers=2): 100.0 s wall time, $0.0200" in text
    assert "nothing to compare" in text and "Evaluations" in text


def test_speed_figure_integer_ticks_and_legend_only_for_what_is_drawn() -> None:
    from analysis import plots
    from analysis.report import flag_saturation

    speeds = pd.DataFrame({"panel": "p", "series": "ASP", "workers": [2, 4, 8],
                           "speed": [10.0, 20.0, 40.0], "speed_std": [float("nan")] * 3})
    speeds["bottleneck"] = flag_saturation(speeds)
    assert not speeds["bottleneck"].any()  # linear from 2 to 8 workers: no ring
    fig = plots.speed_vs_workers_figure(speeds, "t", flag_label="RING")
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [2, 4, 8]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ASP"]

    speeds["speed"] = [10.0, 20.0, 22.0]  # 4 more workers added 2 steps/s: a ring at 8
    speeds["bottleneck"] = flag_saturation(speeds)
    assert speeds["bottleneck"].tolist() == [False, False, True]
    fig = plots.speed_vs_workers_figure(speeds, "t", flag_label="RING")
    assert sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts()) == ["ASP", "RING"]
    plt.close("all")


def test_count_ticks_are_whole_numbers_for_many_sizes() -> None:
    from analysis import plots

    fig, ax = plt.subplots()
    ax.plot(range(1, 65), range(64))
    plots.count_ticks(ax, pd.Series(range(1, 65)))
    assert all(float(t).is_integer() for t in ax.get_xticks())
    plt.close(fig)


def test_cost_legend_names_only_the_kinds_present(sweep_dir: Path) -> None:
    from analysis import cost, plots

    table = cost.cost_table(sweep_dir)
    on_demand = table[~table["transient"]]
    fig = plots.cost_pareto_figure(on_demand, "t", "wall time per run")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "transient" not in labels and "on-demand" in labels
    assert fig.axes[0].get_xlabel().startswith("wall time per run")
    plt.close(fig)


def test_a_section_the_table_cannot_support_says_why_in_words(sweep_dir: Path,
                                                              tmp_path: Path) -> None:
    """A runs.csv without the cost column: the cost section names the column, not pandas."""
    table = pd.read_csv(sweep_dir / "runs.csv").drop(columns=["cost_usd"])
    table.to_csv(sweep_dir / "runs.csv", index=False)
    text = _page_text(build_report(sweep_dir, tmp_path / "out"))
    assert "table has no cost_usd column (a runs.csv of another tool or version?)" in text
