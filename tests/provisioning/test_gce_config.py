"""Catalog truth and the headline experiment with provider=gce, through the real configs."""

from __future__ import annotations

import pytest

from orchestrator.config.errors import ConfigError
from orchestrator.plan import make_plan
from orchestrator.validate import compose_experiment
from provisioning.catalog import retirement
from provisioning.gce.preview import preview_vms


def test_k80_on_gce_is_a_config_error_naming_the_replacement() -> None:
    with pytest.raises(ConfigError) as info:
        compose_experiment("icac19_k80", ["provider.name=gce"])
    line = info.value.line()
    assert line.startswith("config error: cluster.worker_groups.0.gpu: K80 was retired on GCE "
                           "on 2024-05-01"), line
    assert "use t4" in line and "\n" not in line


def test_papers_k80_cluster_stays_valid_for_dry_runs_and_analysis() -> None:
    plan = make_plan(compose_experiment("icac19_k80"))  # provider=local
    assert {h.gpu for h in plan.hosts if h.role == "worker"} == {"k80"}
    assert retirement("local", "k80") is None and retirement("gce", "t4") is None


@pytest.mark.parametrize("workers", [4, 8, 16])
def test_headline_sweep_points_validate_and_preview_vms_per_zone(workers: int) -> None:
    plan = make_plan(compose_experiment("cifar10_res32", [f"cluster.workers={workers}"]))
    vms = preview_vms(plan.hosts)
    assert len(vms) == workers + 1  # chief and evaluator ride on ps-0's VM
    assert vms[0].hosts == ["ps-0", "chief-0", "evaluator-0"] and not vms[0].spot
    assert all(vm.gpu == "t4 (attached)" and vm.spot and vm.zone == "us-west1-b"
               for vm in vms[1:])
