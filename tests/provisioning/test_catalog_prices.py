"""Only what can be rented, at today's regional prices (issue 37): each GPU on the machine
shapes Compute Engine attaches it to, with their vCPUs, memory and GPU counts from one table
(provisioning/gce/body.py), priced per region with the date the prices were read."""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.plan import make_plan
from orchestrator.validate import compose_experiment
from provisioning.base import BadRequestError
from provisioning.catalog import GpuOffer, MachineOffer, PricingConfig, RegionPrice
from provisioning.gce.body import VmRequest, accelerators
from provisioning.gce.config import GceConfig
from provisioning.gce.preflight import vm_demand
from provisioning.gce.preview import preview_vms
from provisioning.machine_shapes import FIXED_GPU_SHAPES, gpus_per_vm
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    fake_fixture,
    make_provider_fixture,
    small_request,
)


def _catalog() -> PricingConfig:
    return PricingConfig(
        name="t", date="2026-11-28", transient_market="spot",  # type: ignore[arg-type]
        gpus={"l4": GpuOffer(0.5, 0.2, regions={"europe-west4": RegionPrice(0.6, 0.1)})},
        machine_types={"g2-standard-4": MachineOffer(0.15, 0.06, 4, 16, regions={
            "europe-west4": RegionPrice(0.16, 0.05)}),
            "g2-standard-24": MachineOffer(0.9, 0.35, 24, 96)})


def test_a_zone_is_priced_at_its_regions_prices_else_the_catalogue_default() -> None:
    cat = _catalog()
    assert cat.hourly_price("g2-standard-4", "l4", True, "europe-west4-b") == pytest.approx(0.15)
    assert cat.hourly_price("g2-standard-4", "l4", False, "europe-west4-a") == \
        pytest.approx(0.76)
    assert cat.hourly_price("g2-standard-4", "l4", True, "us-east1-c") == pytest.approx(0.26)
    assert cat.hourly_price("g2-standard-4", "l4", True) == pytest.approx(0.26)
    # a shape with two built-in L4s pays for both
    assert cat.hourly_price("g2-standard-24", "l4", True) == pytest.approx(0.35 + 2 * 0.2)


def test_each_gpu_comes_on_its_series_with_the_shapes_gpu_count() -> None:
    counts = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1,
              "g2-standard-24": 2, "g2-standard-32": 1, "g2-standard-48": 4, "g2-standard-96": 8,
              "a2-highgpu-1g": 1, "a2-highgpu-2g": 2, "a2-highgpu-4g": 4, "a2-highgpu-8g": 8,
              "a2-megagpu-16g": 16, "a3-highgpu-8g": 8}
    for machine, n in counts.items():
        assert gpus_per_vm(machine, None) == n, machine
    assert FIXED_GPU_SHAPES["a2-ultragpu-1g"] == ("a100-80gb", 1)
    assert accelerators("a2-ultragpu-2g", "a100-80gb") == []
    with pytest.raises(BadRequestError, match="built-in a100-80gb"):
        accelerators("a2-ultragpu-1g", "a100")  # the 40 GB A100 is A2 Standard's
    with pytest.raises(BadRequestError, match="does not exist"):
        accelerators("g2-standard-6", "l4")
    with pytest.raises(BadRequestError, match="use a a2-\\* machine type"):
        accelerators("n1-standard-8", "a100-80gb")
    assert gpus_per_vm("n1-standard-8", "t4") == 1 and gpus_per_vm("n1-standard-8", None) == 0


def test_the_shipped_catalogue_is_dated_current_and_rentable() -> None:
    cfg = compose_experiment("cifar10_res32")
    cat = cfg.pricing
    assert datetime.date.fromisoformat(cat.date) >= datetime.date(2026, 11, 1)
    # today's Spot prices, not 2019's preemptible ones (T4 0.11, P100 0.43, V100 0.74)
    for gpu, old in {"t4": 0.11, "p100": 0.43, "v100": 0.74}.items():
        assert cat.gpus[gpu].preemptible_usd_per_h > old * 1.2, gpu
    for name, machine in cat.machine_types.items():
        assert machine.vcpus and machine.memory_gb, name
        for gpu in cat.gpus:
            try:
                accelerators(name, gpu)
            except BadRequestError:
                continue
            if gpus_per_vm(name, gpu):  # a GPU it takes: priced, in every region listed
                for zone in cat.zones_for(gpu):
                    assert cat.hourly_price(name, gpu, True, zone) > 0
    for gpu in ("t4", "v100", "p100", "l4", "a100"):
        assert {"us-central1", "us-east1", "us-west1", "europe-west4"} <= set(
            cat.gpus[gpu].regions), gpu
    assert cat.gpus["v100"].regions["europe-west4"].preemptible_usd_per_h < \
        cat.gpus["v100"].regions["us-central1"].preemptible_usd_per_h


def test_a_plan_in_europe_is_priced_at_europes_prices() -> None:
    def worker_h(zone: str) -> float:
        plan = make_plan(compose_experiment("cifar10_res32", [
            "cluster.workers=1", "cluster.worker_groups.0.gpu=v100",
            f"cluster.worker_groups.0.zone={zone}", f"cluster.ps_zone={zone}"]))
        return next(h.hourly_usd for h in plan.hosts if h.role == "worker")

    cat = compose_experiment("cifar10_res32").pricing
    europe, iowa = worker_h("europe-west4-a"), worker_h("us-central1-a")
    assert europe == pytest.approx(cat.hourly_price("n1-standard-4", "v100", True,
                                                    "europe-west4-a"), abs=1e-6)
    assert europe < iowa  # V100 Spot: 0.7148 there, 0.992 in Iowa


@pytest.mark.parametrize(("machine", "gpu", "gpus"), [
    ("g2-standard-24", "l4", 2), ("a2-highgpu-4g", "a100", 4), ("n1-standard-8", "t4", 1)])
def test_the_dry_run_previews_and_counts_quota_for_every_gpu_of_a_shape(
        machine: str, gpu: str, gpus: int) -> None:
    plan = make_plan(compose_experiment("cifar10_res32", [
        "cluster.workers=1", f"cluster.worker_groups.0.gpu={gpu}",
        f"cluster.worker_groups.0.machine_type={machine}",
        "cluster.worker_groups.0.zone=us-central1-a", "cluster.ps_zone=us-central1-a"]))
    worker = next(vm for vm in preview_vms(plan.hosts) if vm.spot)
    assert worker.machine_type == machine
    assert worker.gpu == (f"{gpus}× {gpu} (built in)" if machine[:2] in ("g2", "a2")
                          else f"{gpu} (attached)")
    vm = VmRequest("tp-x-worker-0-1", "us-central1-a", machine, gpu, True, {}, ["w"])
    demand: Counter[str] = vm_demand(vm, GceConfig(), {})
    assert demand["GPUS_ALL_REGIONS"] == gpus


def test_the_planner_prints_the_date_its_prices_were_read() -> None:
    from orchestrator.simulate.planner import parse_args
    from orchestrator.simulate.planner_report import header
    from orchestrator.simulate.validate import compose

    assert "prices gce 2026-11-28)" in header(compose(parse_args(["+experiment=cifar10_res32"])),
                                              0, 0)


@pytest.mark.parametrize(("machine", "gpu", "gpus"), [("g2-standard-24", "l4", 2),
                                                      ("a2-highgpu-2g", "a100", 2)])
def test_the_fake_compute_api_creates_a_multi_gpu_shape_whose_gpus_are_all_seen(
        fake: FakeGce, make_provider, tmp_path: Path, machine: str, gpu: str,
        gpus: int) -> None:
    """The provider creates the shape with no guestAccelerators (the GPUs are built in) and
    its GPU check passes on the count the VM reports."""
    request = small_request("shape", tmp_path, workers=1, gpu=gpu)
    request.hosts[1] = replace(request.hosts[1], machine_type=machine)
    provider = make_provider()
    cluster = provider.acquire(request)
    try:
        worker = next(i for i in fake.live_instances() if i.body["labels"]["role"] == "worker")
        assert worker.body["machineType"].endswith(f"/machineTypes/{machine}")
        assert "guestAccelerators" not in worker.body
        assert sum(n for _, n in worker.accelerators()) == gpus
    finally:
        provider.release(cluster)


def test_the_vcpu_quota_counts_a_megagpu_shape_as_google_sells_it() -> None:
    """a2-megagpu-16g has 96 vCPUs, not 16 × the A2 per-GPU 12 (compute/docs/gpus)."""
    from provisioning.gce.preflight import machine_cpus

    assert [machine_cpus(m) for m in ("a2-megagpu-16g", "a2-highgpu-2g", "n1-standard-8")] == [
        96, 24, 8]
