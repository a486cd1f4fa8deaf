"""Nothing leaked, nothing over-deleted (audit rows 10, 11, 25): an insert that raised but
created the VM anyway is deleted by name; a Spot VM preempted while booting is re-created alone;
a delete of a VM GCE is already stopping, and an internal IP still held, are retried."""

from __future__ import annotations

import time
from pathlib import Path

from provisioning.base import HostState, Role
from provisioning.gce.config import TerminationAction
from provisioning.journal import list_unreleased
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    fake_fixture,
    make_provider_fixture,
    small_request,
)


def test_an_insert_that_raised_but_created_the_vm_is_deleted(fake: FakeGce, make_provider,
                                                             tmp_path: Path) -> None:
    fake.fail_inserts("us-central1-a", 5)  # the first insert and its 4 retries all "fail"
    provider = make_provider()
    cluster = provider.acquire(small_request("ghost", tmp_path, workers=2))
    try:
        inserted = [i for i in fake.instances.values() if i.zone == "us-central1-a"]
        assert inserted, "the failing insert created its VM (as GCE may)"
        # Its zone was given up, so that VM's slot was created elsewhere in the region, and
        # the VM the client never saw succeed is deleted already: exactly the cluster bills.
        assert len(fake.live_instances()) == 3
        assert {i.name for i in fake.live_instances()} == {
            provider.vm_of(h.id).name for h in cluster.hosts}
    finally:
        provider.release(cluster)
    assert fake.live_instances() == []
    assert list_unreleased(tmp_path / "journal.jsonl") == []


def test_a_spot_vm_preempted_while_booting_is_recreated_alone(fake: FakeGce, make_provider,
                                                             tmp_path: Path) -> None:
    fake.provision_s = 0.4
    fake.preempt_booting = 1
    provider = make_provider()
    cluster = provider.acquire(small_request("boot-pre", tmp_path, workers=2))
    try:
        assert fake.calls["instances.insert"] == 4  # 3 VMs + the one preempted while booting
        assert len(fake.live_instances()) == 3
        preempted = [i for i in fake.instances.values() if i.preempted]
        assert len(preempted) == 1 and preempted[0].spot()
        # Not over-deleted: every VM that was not preempted is still the one first created.
        assert {i.name for i in fake.instances.values() if not i.preempted} == {
            i.name for i in fake.live_instances()}
        assert set(provider.poll(cluster).values()) == {HostState.RUNNING}
        assert len(cluster.hosts_for(Role.WORKER)) == 2
    finally:
        provider.release(cluster)
    assert fake.live_instances() == []


def test_deleting_a_vm_gce_is_stopping_and_reusing_its_ip_are_retried(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.not_ready_while_stopping = True
    fake.ip_hold_s = 5.0  # outlasts the delete retries' backoff, also on a loaded machine
    provider = make_provider(termination_action=TerminationAction.DELETE)
    cluster = provider.acquire(small_request("nr", tmp_path, workers=1))
    try:
        fake.stop_s = 3.0  # the preempted VM stays STOPPING a while
        lost = cluster.hosts_for(Role.WORKER)[0]
        vm = provider.vm_of(lost.id)
        fake.preempt(vm.zone, vm.name)
        assert provider.poll(cluster)[lost.id] is HostState.REVOKED
        new = provider.replace(cluster, [lost.id])  # delete: not ready; insert: IP held
        replacement = new.hosts_for(Role.WORKER)[0]
        assert replacement.endpoint == lost.endpoint
        assert fake.calls["instances.delete"] >= 2  # the refused delete was asked again
        assert fake.calls["instances.insert"] >= 4  # 2 VMs, then the held IP asked again
    finally:
        provider.release(cluster)
        provider.release(new if "new" in locals() else cluster)
    deadline = time.monotonic() + 10
    while fake.live_instances() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.live_instances() == []
