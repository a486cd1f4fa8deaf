"""Shared fixtures and the test tiers: keep TensorFlow quiet, give tests the repository paths,
and mark each test by what it needs (docs/contributing.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# session fixtures shared across modules live here (imported into two modules they would be two)
from tests.provisioning.baked_image import baked_gce_image, gce_isolated_bed  # noqa: F401

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Tests talk only to loopback and their own namespaces: a developer's own Google credentials
# (a key file, gcloud's application-default login) must not make pricing.live=auto read the real
# Cloud Billing API (provisioning/gce/billing.py); the billing tests point it at their stand-in.
os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
os.environ["CLOUDSDK_CONFIG"] = str(Path(__file__).resolve().parent / "no-gcloud-config")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


#: Fixtures whose tests run on isolated hosts (tests/testbed/isolated.py): such a test is marked
#: `isolated` (and `namespaces`) by what it uses, so `-m "not isolated"` deselects it without a
#: list to keep.
_ISOLATED_FIXTURES = frozenset({"isolated_bed", "module_isolated_bed", "isolated_index",
                                "gce_isolated_bed", "baked_gce_image"})
#: Fixtures whose tests run on the SSH test bed (tests/testbed: sshd hosts in network
#: namespaces, root): marked `namespaces`. A test that builds a bed itself, or gets one through
#: `request.getfixturevalue` (the conformance suite's ssh and gce beds), is marked where it does.
_NAMESPACE_FIXTURES = frozenset({"ssh_testbed", "ssh_provider_config"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _ISOLATED_FIXTURES:
            item.add_marker(pytest.mark.isolated)
        # isolated hosts are namespaces too: `-m "not namespaces"` leaves out everything that
        # needs root and Linux namespaces, whichever bed it runs on
        if fixtures & _NAMESPACE_FIXTURES or item.get_closest_marker("isolated"):
            item.add_marker(pytest.mark.namespaces)
