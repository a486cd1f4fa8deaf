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
        compose_experiment("icac19_k80", ["provider=gce"])
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


def test_the_dry_run_shows_the_backends_preview_gce_vms_and_nothing_for_local() -> None:
    from rich.console import Console

    from orchestrator.display import render_preview

    console = Console(record=True, width=200)
    render_preview(make_plan(compose_experiment("cifar10_res32", ["cluster.workers=4"])), console)
    text = console.export_text()
    assert "GCE VMs to create (5)" in text
    assert "ps-0, chief-0, evaluator-0" in text and text.count("Spot") == 4
    render_preview(make_plan(compose_experiment("digits_local")), console)
    assert console.export_text() == ""  # provider=local adds no table


def test_provider_gce_composes_its_typed_config() -> None:
    cfg = compose_experiment("cifar10_res32", ["provider.zones=[us-east1-c]",
                                               "provider.termination_action=STOP"])
    from provisioning.gce.config import GceConfig, TerminationAction

    assert isinstance(cfg.provider, GceConfig)
    assert cfg.provider.zones == ["us-east1-c"]
    assert cfg.provider.termination_action is TerminationAction.STOP
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider.termination_action=HIBERNATE"])
    assert info.value.line().startswith("config error: provider.termination_action: ")


def test_real_run_without_credentials_fails_at_once_in_one_line(tmp_path, monkeypatch) -> None:
    """The headline command without Google credentials: exit 2, one line saying what to do."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(repo), CLOUDSDK_CONFIG=str(tmp_path / "gc"))
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32",
         f"job.data_dir={tmp_path}", "provider.project=my-project",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("config error: provider.credentials: no Google credentials")
    assert "gcloud auth application-default login" in lines[0]
    assert "provider=local" in lines[0]
    assert not (tmp_path / "run" / "journal.jsonl").exists()  # nothing was provisioned



def test_provider_extra_picks_tensorflows_build_by_gpu_or_for_every_vm() -> None:
    """`auto`: the CUDA build on VMs with a GPU, the CPU build elsewhere; `cpu`/`gpu`: that one
    on every VM (what a VM installs, and what `orchestrator.image bake` bakes)."""
    from provisioning.gce.config import GceConfig
    from provisioning.gce.ssh import trainer_extra

    assert GceConfig().extra == "auto" and GceConfig().check() == []
    assert [trainer_extra(gpu) for gpu in (True, False)] == ["gpu", "cpu"]
    assert [trainer_extra(gpu, "cpu") for gpu in (True, False)] == ["cpu", "cpu"]
    assert [trainer_extra(gpu, "gpu") for gpu in (True, False)] == ["gpu", "gpu"]
    assert compose_experiment("cifar10_res32", ["provider.extra=cpu"]).provider.extra == "cpu"
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider.extra=rocm"])
    assert info.value.line() == "config error: provider.extra: 'rocm': must be auto, cpu or gpu"


def test_a_vm_lease_shorter_than_the_unreachable_grace_is_refused() -> None:
    """A VM lease the run cannot renew through a network drop it waits out would end healthy
    VMs: refused in one line before anything is created; as long as the grace (or off) is fine."""
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider.lease_s=120",
                                             "provider.unreachable_grace_s=300"])
    assert info.value.line() == (
        "config error: provider.lease_s: 120 s is shorter than provider.unreachable_grace_s "
        "(300 s): the VMs would end themselves during a drop of this machine's network that "
        "the run waits out; make it at least that")
    for ok in ("provider.lease_s=300", "provider.lease_s=0"):
        compose_experiment("cifar10_res32", [ok, "provider.unreachable_grace_s=300"])


@pytest.mark.parametrize(("override", "expected"), [
    ("provider.controller_zone=mars-north1-a",
     "config error: provider.controller_zone: unknown zone 'mars-north1-a' in catalog 'gce'"),
    ("provider.controller_machine_type=g2-standard-4",
     "config error: provider.controller_machine_type: 'g2-standard-4' has GPUs built in"),
    ("provider.controller_machine_type=a3-highgpu-8g",
     "config error: provider.controller_machine_type: 'a3-highgpu-8g' has GPUs built in"),
    ("provider.controller_machine_type='E2 standard'",
     "config error: provider.controller_machine_type: 'E2 standard' is not a Compute Engine "
     "machine type"),
])
def test_bad_controller_settings_are_refused_in_one_line(override: str, expected: str) -> None:
    """The controller's zone and machine type are checked before anything is provisioned."""
    with pytest.raises(ConfigError) as info:
        compose_experiment("cifar10_res32", ["provider=gce", override])
    line = info.value.line()
    assert line.startswith(expected), line
    assert "\n" not in line


def test_the_controller_is_priced_only_where_a_detached_submit_asks() -> None:
    """The default controller (e2-standard-2) is priced per region; an unpriced controller type
    is no error for an attached run, only for `--detach` (controller_problems)."""
    from provisioning.gce.config import controller_problems

    cfg = compose_experiment("cifar10_res32", ["provider=gce"])
    assert controller_problems(cfg.provider, cfg.pricing) == []
    for zone, on_demand in (("us-central1-a", 0.06701), ("europe-west4-a", 0.07377)):
        assert cfg.pricing.hourly_price("e2-standard-2", None, False, zone) == on_demand
    assert cfg.pricing.hourly_price("e2-standard-4", None, True, "us-west1-b") == 0.05358
    unpriced = compose_experiment("cifar10_res32", [
        "provider=gce", "provider.controller_machine_type=n2-standard-2",
        "provider.controller_zone=us-west1-b"])  # attached: valid
    (problem,) = controller_problems(unpriced.provider, unpriced.pricing)
    assert problem[0] == "provider.controller_machine_type"
    assert problem[1].startswith("'n2-standard-2' is not priced in catalog 'gce'"), problem
