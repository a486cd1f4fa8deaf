"""The GCE backend against the fake Compute API, through the real google-cloud-compute client."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from provisioning.base import BadRequestError, CapacityError, HostState, Role
from provisioning.gce.config import RUN_UNKNOWN_S, TerminationAction
from provisioning.gce.errors import QuotaError
from provisioning.journal import ResourceKind, list_unreleased
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    fake_fixture,
    make_provider_fixture,
    small_request,
)


def live(fake: FakeGce) -> dict[str, str]:
    """name -> zone of every VM that exists (would be billed)."""
    return {i.name: i.zone for i in fake.live_instances()}


def test_acquire_builds_one_vm_per_machine_with_spot_labels_and_host_keys(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    provider = make_provider()
    cluster = provider.acquire(small_request("run-a_1", tmp_path))
    try:
        assert [h.spec.name for h in cluster.hosts] == ["ps-0", "worker-0", "worker-1", "chief-0",
                                                       "evaluator-0"]
        assert len(fake.live_instances()) == 3  # chief and evaluator share ps-0's VM
        ps, chief, evaluator = (cluster.hosts_for(r)[0] for r in (Role.PS, Role.CHIEF,
                                                                  Role.EVALUATOR))
        assert ps.address == chief.address == evaluator.address
        assert len({ps.port, chief.port, evaluator.port}) == 3
        workers = cluster.hosts_for(Role.WORKER)
        assert len({w.address for w in workers} | {ps.address}) == 3
        bodies = {i.name: i.body for i in fake.live_instances()}
        by_role = {b["labels"]["role"]: b for b in bodies.values()}
        assert set(by_role) == {"ps_chief_evaluator", "worker"}
        worker = by_role["worker"]
        no_plan = {"seconds": str(RUN_UNKNOWN_S)}  # a config no plan fitted: the default life
        assert worker["scheduling"] == {"provisioningModel": "SPOT",
                                        "instanceTerminationAction": "DELETE",
                                        "onHostMaintenance": "TERMINATE",
                                        "automaticRestart": False, "maxRunDuration": no_plan}
        assert worker["guestAccelerators"][0]["acceleratorType"].endswith(
            "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4")
        assert by_role["ps_chief_evaluator"]["scheduling"] == {  # on-demand CPU VM: its life
            "maxRunDuration": no_plan, "instanceTerminationAction": "DELETE"}
        labels = worker["labels"]
        assert labels["tool"] == "transient-ps" and labels["run-id"] == "run-a_1"
        assert labels["team"] == "lab" and labels["host-id"].startswith("run-a_1-worker-")
        metadata = {i["key"]: i["value"] for i in worker["metadata"]["items"]}
        assert metadata["enable-guest-attributes"] == "TRUE"
        assert metadata["ssh-keys"].startswith("transient:ssh-ed25519 ")
        assert "instance/preempted" in metadata["startup-script"]
        assert all(h.workdir.as_posix().startswith("/var/tmp/transient/run-a_1/hosts/")
                   for h in cluster.hosts)
        # Host keys pinned from the guest attributes, for every VM.
        known = (tmp_path / "known_hosts").read_text().splitlines()
        published = {(i.ip, k, v) for i in fake.live_instances() for k, v in i.host_keys}
        assert {tuple(line.split()) for line in known} == published
        assert provider.vm_of(workers[0].id).ssh.pinned  # RejectPolicy, no first-use pinning
        # Journalled: one create per VM, none released yet.
        open_vms = [e for e in list_unreleased(tmp_path / "journal.jsonl")
                    if e.kind is ResourceKind.VM]
        assert sorted(e.resource_id for e in open_vms) == sorted(live(fake))
    finally:
        provider.release(cluster)
    assert live(fake) == {}
    assert list_unreleased(tmp_path / "journal.jsonl") == []
    provider.release(cluster)  # idempotent


def test_creation_is_parallel_and_idempotent_per_request(fake: FakeGce, make_provider,
                                                         tmp_path: Path) -> None:
    fake.insert_op_s = 0.5  # each insert operation takes half a second
    provider = make_provider()
    started = time.monotonic()
    cluster = provider.acquire(small_request("par", tmp_path, workers=8))
    elapsed = time.monotonic() - started
    try:
        assert len(fake.live_instances()) == 9
        assert fake.calls["instances.insert"] == 9
        # 9 sequential inserts would take ≥ 4.5 s; parallel ones about one operation.
        assert elapsed < 4.5, f"acquire took {elapsed:.1f} s: inserts were not parallel"
    finally:
        provider.release(cluster)


def test_poll_is_one_list_per_interval_and_maps_states(fake: FakeGce, make_provider,
                                                       tmp_path: Path) -> None:
    provider = make_provider(poll_interval_s=3600.0)
    cluster = provider.acquire(small_request("poll", tmp_path, workers=6))
    try:
        before = dict(fake.calls)
        for _ in range(20):
            states = provider.poll(cluster)
        assert set(states.values()) == {HostState.RUNNING}
        assert fake.calls["instances.aggregatedList"] - before["instances.aggregatedList"] == 1
        # No per-VM get: the acquire's only one reads the first VM's effective OS Login.
        assert fake.calls["instances.get"] == before.get("instances.get", 0) == 1
    finally:
        provider.release(cluster)
    assert set(provider.poll(cluster).values()) == {HostState.TERMINATED}


@pytest.mark.parametrize("action", [TerminationAction.DELETE, TerminationAction.STOP])
def test_preempted_worker_is_revoked_and_replaced_in_its_slot(
        fake: FakeGce, make_provider, tmp_path: Path, action: TerminationAction) -> None:
    provider = make_provider(termination_action=action)
    cluster = provider.acquire(small_request("pre", tmp_path))
    try:
        lost = cluster.hosts_for(Role.WORKER)[1]
        vm = provider.vm_of(lost.id)
        assert fake.instances[(vm.zone, vm.name)].body["scheduling"][
            "instanceTerminationAction"] == str(action)
        fake.preempt(vm.zone, vm.name)
        time.sleep(0.1)  # past STOPPING
        states = provider.poll(cluster)
        assert states[lost.id] is HostState.REVOKED
        assert [s for h, s in states.items() if h != lost.id] == [HostState.RUNNING] * 4
        assert provider.revocations[lost.id] == "preempted"
        new = provider.replace(cluster, [lost.id])
        replacement = new.hosts_for(Role.WORKER)[1]
        assert replacement.id != lost.id
        assert replacement.endpoint == lost.endpoint  # same slot: same internal IP and port
        assert new.index_of(replacement) == 1
        assert provider.poll(new)[replacement.id] is HostState.RUNNING
        assert (vm.zone, vm.name) not in {(i.zone, i.name) for i in fake.live_instances()}
        assert len(fake.live_instances()) == 3
    finally:
        provider.release(cluster)
        provider.release(new)
    assert live(fake) == {}


def test_stockout_in_first_zone_lands_in_the_next(fake: FakeGce, make_provider,
                                                  tmp_path: Path) -> None:
    fake.stockout("us-central1-a")
    provider = make_provider()
    cluster = provider.acquire(small_request("so", tmp_path))
    try:
        assert set(live(fake).values()) == {"us-central1-b"}
        assert len(cluster.hosts) == 5
    finally:
        provider.release(cluster)
    assert live(fake) == {}


def test_stockout_everywhere_is_a_capacity_error_leaving_nothing(fake: FakeGce, make_provider,
                                                                 tmp_path: Path) -> None:
    fake.stockout("us-central1-b")
    fake.stockout("us-east1-c")
    fake.stockout("us-central1-a", inserts=1)  # one VM fails there, the others succeed
    provider = make_provider()
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        provider.acquire(small_request("so2", tmp_path))
    assert live(fake) == {}
    assert list_unreleased(tmp_path / "journal.jsonl") == []


@pytest.mark.parametrize("cross_region", [False, True])
def test_regional_quota_moves_the_whole_cluster_to_one_region(
        fake: FakeGce, make_provider, tmp_path: Path, cross_region: bool) -> None:
    fake.set_quota("PREEMPTIBLE_NVIDIA_T4_GPUS", 1, region="us-central1")
    provider = make_provider(cross_region=cross_region)
    cluster = provider.acquire(small_request("q", tmp_path, workers=2))
    try:
        zones = sorted(i.zone for i in fake.live_instances())
        if cross_region:  # each VM on its own: one T4 fits in us-central1, the other moves
            assert zones == ["us-central1-a", "us-central1-a", "us-east1-c"]
        else:  # the PS never talks to its workers across regions
            assert zones == ["us-east1-c"] * 3
        placement = json.loads((tmp_path / "placement.json").read_text())
        assert sorted(vm["zone"] for vm in placement["vms"]) == zones
        assert placement["regions"] == sorted({z.rsplit("-", 1)[0] for z in zones})
    finally:
        provider.release(cluster)
    assert live(fake) == {}


def test_a_stockout_in_the_ps_zone_keeps_the_cluster_in_its_region(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.stockout("us-central1-a", inserts=1)  # whichever VM asks first
    provider = make_provider()
    cluster = provider.acquire(small_request("so1", tmp_path, workers=2))
    try:
        zones = sorted(i.zone for i in fake.live_instances())
        assert zones == ["us-central1-a", "us-central1-a", "us-central1-b"]
    finally:
        provider.release(cluster)


def test_global_gpu_quota_stops_with_the_metric_named(fake: FakeGce, make_provider,
                                                      tmp_path: Path) -> None:
    """As an insert finds it (the pre-create checks off: quotas can change between them)."""
    fake.set_quota("GPUS_ALL_REGIONS", 1)
    provider = make_provider(preflight_checks=False)
    with pytest.raises(QuotaError, match="GPUS_ALL_REGIONS") as info:
        provider.acquire(small_request("gq", tmp_path, workers=2))
    assert info.value.region is None and "all regions" in str(info.value)
    assert live(fake) == {}


def test_accelerator_not_offered_is_a_bad_request_and_nothing_stays(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.accelerators["us-central1-a"].discard("nvidia-tesla-t4")
    provider = make_provider()
    with pytest.raises(BadRequestError, match="acceleratorTypes/nvidia-tesla-t4"):
        provider.acquire(small_request("bad", tmp_path))
    assert live(fake) == {}  # the PS VM created alongside was deleted
    assert fake.calls["instances.delete"] >= 1


def test_bad_machine_gpu_pair_fails_before_any_insert(fake: FakeGce, make_provider,
                                                      tmp_path: Path) -> None:
    provider = make_provider()
    with pytest.raises(BadRequestError, match="a2"):
        provider.acquire(small_request("a100", tmp_path, gpu="a100"))
    assert live(fake) == {}


def test_missing_zone_is_a_bad_request(fake: FakeGce, make_provider, tmp_path: Path) -> None:
    provider = make_provider(zones=[])
    with pytest.raises(BadRequestError, match=r"provider\.zones"):
        provider.acquire(small_request("nz", tmp_path, zone=None))
    assert live(fake) == {}
