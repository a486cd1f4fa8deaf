"""`provider.labels` against Compute Engine's label rules (issue 35): refused in one line naming
the label as typed, before anything is provisioned, through the same composition and validation
a dry run uses; and the fake Compute API refuses what the real one refuses, so a label that
slipped past validation fails a test as it would fail a real insert."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.validate import compose_experiment
from provisioning.base import ProvisionError
from provisioning.gce.api import ComputeApi
from provisioning.gce.body import base_body, run_labels
from provisioning.gce.config import MAX_LABELS, TOOL_LABEL_KEYS, GceConfig
from provisioning.gce.controller import controller_body
from provisioning.gce.vm import owner_labels
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import fake_fixture, gce_config  # noqa: F401 (fixtures)

EXPERIMENT = "cifar10_res32"  # provider=gce
KEY_RULE = ("label keys must start with a lowercase letter and hold only lowercase letters, "
            "digits, _ and - (at most 63)")
VALUE_RULE = "label values hold only lowercase letters, digits, _ and - (at most 63)"
ROOM = MAX_LABELS - len(TOOL_LABEL_KEYS)


def _labels(n: int) -> str:
    return "provider.labels={" + ", ".join(f"l{i}: v" for i in range(n)) + "}"


def _error(override: str) -> str:
    with pytest.raises(ConfigError) as info:
        compose_experiment(EXPERIMENT, [override])
    return info.value.line()


def test_labels_compute_engine_takes_are_kept_as_typed() -> None:
    labels = {"team": "ml-infra", "cost_center": "", "k" * 63: "v" * 63, "e2e": "run_7"}
    override = "provider.labels={" + ", ".join(f"{k}: '{v}'" for k, v in labels.items()) + "}"
    assert compose_experiment(EXPERIMENT, [override]).provider.labels == labels
    assert len(compose_experiment(EXPERIMENT, [_labels(ROOM)]).provider.labels) == ROOM


@pytest.mark.parametrize(("override", "expected"), [
    ("provider.labels={Team: ml}", f"provider.labels.Team: {KEY_RULE}"),
    ("provider.labels={_team: ml}", f"provider.labels._team: {KEY_RULE}"),
    (f"provider.labels={{{'k' * 64}: ml}}", f"provider.labels.{'k' * 64}: {KEY_RULE}"),
    ("provider.labels={team: ML}", f"provider.labels.team: 'ML': {VALUE_RULE}"),
    ("provider.labels={team: 'ml infra'}", f"provider.labels.team: 'ml infra': {VALUE_RULE}"),
    (f"provider.labels={{team: {'v' * 64}}}", f"provider.labels.team: '{'v' * 64}': {VALUE_RULE}"),
    ("provider.labels={spot: true}", f"provider.labels.spot: 'True': {VALUE_RULE} (YAML read a "
     "true/false as a boolean: quote it, 'true')"),
    ("provider.labels={run-id: mine}", "provider.labels.run-id: the tool sets this label on its "
     "VMs itself (it finds them by it); pick another key"),
])
def test_a_label_compute_engine_refuses_is_one_line_naming_it(override: str,
                                                              expected: str) -> None:
    assert _error(override) == f"config error: {expected}"


def test_too_many_labels_counts_the_tools_own() -> None:
    assert _error(_labels(ROOM + 1)) == (
        f"config error: provider.labels: {ROOM + 1} labels, but Compute Engine takes at most "
        f"{MAX_LABELS} per VM and the tool adds {len(TOOL_LABEL_KEYS)} of its own "
        f"({', '.join(TOOL_LABEL_KEYS)}): at most {ROOM}")


def test_the_tools_own_label_keys_are_the_ones_it_sets() -> None:
    """TOOL_LABEL_KEYS (what validation reserves and counts) against the labels the bodies
    really carry: a key added to a body and not to the list fails here."""
    assert set(run_labels("r", "s", "worker", "h", owner_labels())) == set(TOOL_LABEL_KEYS)
    body = controller_body(GceConfig(), "p", "us-central1-a", "tc-s", "gs://b/sweeps/s", None,
                           {}, None)
    assert set(body["labels"]) <= set(TOOL_LABEL_KEYS)


def test_the_fake_refuses_labels_as_compute_engine_does(fake: FakeGce, tmp_path: Path) -> None:
    """An insert whose labels break GCE's rules (a key with a capital; one label too many with
    the tool's own) is the real API's 400 on resource.labels; the most validation lets through
    is accepted."""
    api = ComputeApi(gce_config(fake, tmp_path))
    tool = run_labels("r", None, "worker", "h", owner_labels()) | {"sweep-id": "s"}

    def insert(name: str, labels: dict[str, str]) -> str:
        cfg = gce_config(fake, tmp_path, labels=labels)
        body = base_body(cfg, name, "us-central1-a", "n1-standard-4", tool, [])
        return api.insert("us-central1-a", body, f"req-{name}")

    for name, labels in (("vm-caps", {"Team": "lab"}),
                         ("vm-many", {f"l{i}": "v" for i in range(ROOM + 1)})):
        with pytest.raises(ProvisionError) as info:
            insert(name, labels)
        assert "HTTP 400" in str(info.value), info.value
        assert "Invalid value for field 'resource.labels'" in str(info.value), info.value
    assert fake.live_instances() == []
    insert("vm-full", {f"l{i}": "v" for i in range(ROOM)})  # exactly 64 with the tool's
