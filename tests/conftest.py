"""Shared fixtures: keep TensorFlow quiet and give tests the repository paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


#: Fixtures whose tests run on isolated hosts (tests/testbed/isolated.py): such a test is marked
#: `isolated` by what it uses, so `-m "not isolated"` deselects it without a list to keep.
_ISOLATED_FIXTURES = frozenset({"isolated_bed", "module_isolated_bed", "isolated_index"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _ISOLATED_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.isolated)
