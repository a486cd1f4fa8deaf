"""Pytest fixtures over the isolated hosts (tests/testbed/isolated.py). Import them into a test
module:

    from tests.testbed.isolated_fixtures import isolated_bed, isolated_index  # noqa: F401

`isolated_bed` (session scope; `module_isolated_bed`: the same for one module) is one bed with
no host: a test adds the hosts it needs (`isolated_bed.add_host(image="trixie")`, a baked
`disk=`, ...) and stops them when done (`isolated_bed.stop(host)`); the session's end removes
everything and asserts nothing is left. `baked_runtime` (session scope) is the image with the
hosts' runtime baked in (tests/testbed/baked.py), built first if this machine has none: hosts
boot from its `disk` with its `user` (`accounts={baked.user: key}`), and a fake cloud knows it
as a custom image (`IsolatedFakeGce.add_image`). `isolated_index` serves the hosts' dependency
set (tensorflow-cpu and what it pulls) for Python 3.11 and 3.13 on the bed's bridge and gives
its `--index-url`; plain http, so a host's pip also needs `--trusted-host
<isolated_bed.gateway>`. When this machine cannot run isolated hosts, tests using them are
skipped with a loud reason naming what is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.testbed import baked, wheelhouse
from tests.testbed.isolated import IsolatedTestBed, skip_reason


def _own_bed() -> Iterator[IsolatedTestBed]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    bed = IsolatedTestBed()
    try:
        yield bed
    finally:
        bed.close()
    assert not bed.leftovers(), f"isolated bed left {bed.leftovers()}"


@pytest.fixture(scope="session")
def isolated_bed() -> Iterator[IsolatedTestBed]:
    yield from _own_bed()


@pytest.fixture(scope="module")
def module_isolated_bed() -> Iterator[IsolatedTestBed]:
    """A bed of the test module's own: for tests that need its host numbering or its one
    index for themselves."""
    yield from _own_bed()


@pytest.fixture(scope="session")
def baked_runtime() -> baked.BakedRuntime:
    """The baked image (built once per machine, under a file lock: safe beside other
    pytest-xdist workers); read-only."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return baked.build()


@pytest.fixture(scope="session")
def isolated_index(isolated_bed: IsolatedTestBed) -> str:
    """The index URL of the session bed, serving `wheelhouse.HOST_REQUIREMENTS` for both
    images' Pythons (downloaded once into the cache outside the checkout)."""
    return isolated_bed.serve_index(wheelhouse.merged())
