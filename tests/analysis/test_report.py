"""The report writes valid HTML whose images exist, for the reference data and our sweeps."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

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
