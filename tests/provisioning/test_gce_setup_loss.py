# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
"""A VM lost after RUNNING and before its first training step is a loss like any other (audit
S1). In the acquire: a VM preempted while its host keys or its GPU check are awaited is seen
gone at the next poll (the listing says STOPPING) and re-created alone, instead of being waited
for until a timeout that blames the guest attributes or the driver; the fake Compute API
preempts it at that very moment (`FakeGce.preempt_when_read`). After the acquire (namespace
hosts, below): a VM preempted before its first login (also one that answers nothing), while it
is set up, while the dataset is staged, or as its role starts goes to `cluster.recovery` (a
worker replaced or left out, the PS's VM re-created) and the run completes, nothing left."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime.data import STAGED_DATA_DIR
from orchestrator.runtime.fleet import Fleet
from orchestrator.runtime.supervisor import Supervisor
from provisioning.base import CapacityError, Role
from provisioning.gce.provider import GceProvider
from tests.fakes.gce_server import GPU_NAMESPACE, FakeGce, FakeInstance
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    ZONES,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    processes_die_with_vm,
    small_request,
)
from tests.testbed.fixtures import ssh_testbed  # noqa: F401 (fixture)
from trainer.layout import SPEC_FILE


def role_is(role: str):  # type: ignore[no-untyped-def]
    """A `preempt_when_read` match: VMs whose role label is `role` (ps_chief_evaluator for the
    PS's VM of `small_request`)."""
    return lambda inst: inst.body["labels"]["role"] == role


def preempted(fake: FakeGce) -> list[FakeInstance]:
    return [i for i in fake.instances.values() if i.preempted]


@pytest.mark.parametrize(("namespace", "role"), [
    ("hostkeys", "worker"),  # while the host keys are awaited
    (GPU_NAMESPACE, "worker"),  # while the GPU check is awaited
    ("hostkeys", "ps_chief_evaluator"),  # the PS's machine: re-acquired the same way
])
def test_a_vm_preempted_while_checked_is_recreated_and_the_acquire_completes(
        fake: FakeGce, make_provider, tmp_path: Path, namespace: str, role: str) -> None:
    fake.preempt_when_read(namespace, role_is(role))
    # a GPU check that waited for its timeout would take 660 s: the test would time out
    provider = make_provider(gpu_timeout_s=600.0, host_key_poll_s=0.05)
    cluster = provider.acquire(small_request("lost-early", tmp_path, workers=2))
    try:
        [gone] = preempted(fake)
        assert gone.body["labels"]["role"] == role
        live = fake.live_instances()
        assert gone not in live
        assert sorted(i.body["labels"]["role"] for i in live) == [
            "ps_chief_evaluator", "worker", "worker"]
        # the cluster's hosts are on the live VMs, each checked: its keys from guest attributes
        assert {provider.vm_of(h.id).name for h in cluster.hosts} == {i.name for i in live}
        assert all(provider.vm_of(h.id).host_keys for h in cluster.hosts)
        assert len(cluster.hosts_for(Role.WORKER)) == 2
    finally:
        provider.release(cluster)
    assert fake.live_instances() == []


def test_a_vm_preempted_at_every_check_ends_the_acquire_in_one_line_leaving_nothing(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    for _ in range(3):  # boot_preemptions=1: the first loss is re-created, the second fails
        fake.preempt_when_read("hostkeys", role_is("worker"))
    provider = make_provider(boot_preemptions=1, host_key_poll_s=0.05)
    with pytest.raises(CapacityError) as info:
        provider.acquire(small_request("lost-twice", tmp_path, workers=1))
    message = str(info.value)
    assert "\n" not in message
    assert "before its first use (provider.boot_preemptions=1)" in message
    assert fake.live_instances() == []


# --- after the acquire: the first deployment on namespace hosts ---------------------------------
#
# The fake's VMs are the SSH test bed's namespace hosts (`test_gce_ssh.fake_on_bed`), a VM that
# stops taking its host's processes with it (`processes_die_with_vm`); the roles are
# tests/orchestrator/fake_role.py, started over SSH by the real deployer and followed by the
# real supervisor. A watcher preempts a VM at one moment of the deployment, seen on the host:
# before its first login, once the deployer uses its work dir (setup), once the dataset is
# staged there, once a role runs there.

FAKE_ROLE = Path(__file__).resolve().parents[1] / "orchestrator" / "fake_role.py"
RUN_LIMIT_S = 240.0  # SSH setup of three VMs on a loaded machine; only stops a hang


def moment_reached(moment: str, workdir: Path, bed_host: Any, bed: Any) -> bool:
    """Whether the deployment reached `moment` on the VM whose work dir is `workdir`."""
    if moment == "setup":
        return workdir.exists()
    if moment == "data":
        return (workdir / STAGED_DATA_DIR).exists()
    if moment == "start":
        return (workdir / SPEC_FILE).exists() and bool(bed.role_pids(bed_host))
    raise ValueError(moment)


def run_preempting(bed: Any, tmp_path: Path, moment: str, slot: str, policy: str,
                   silent: bool = False, stockout: bool = False
                   ) -> tuple[list[dict[str, Any]], GceProvider, Fleet, Supervisor, str]:
    """Acquire 1 PS VM (chief and evaluator on it) and 2 worker VMs, preempt the VM of host
    `slot` at `moment` ("login": before the deployment; `silent`: its host answers nothing
    from then on, as a VM that is off; `stockout`: no zone has capacity any more), deploy
    and follow the run to its end, release.
    Returns the events, provider, fleet, supervisor and the preempted VM's name; asserts
    nothing is left."""
    from orchestrator.plan import make_plan
    from orchestrator.rundir import results
    from orchestrator.runtime.control import ControlChannel
    from orchestrator.runtime.progress import RunProgress
    from orchestrator.runtime.run import build_trainer_spec
    from orchestrator.transient.revocation import RevocationSchedule
    from orchestrator.validate import compose_experiment
    from provisioning.journal import JOURNAL_FILE, Journal
    from tests.provisioning.test_gce_ssh import FAST, fake_on_bed
    from tests.testbed.fixtures import host_python
    from trainer.layout import CHECKPOINT_DIR, CONTROL_FILE

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    behaviour = tmp_path / "behaviour.json"
    behaviour.write_text(json.dumps({"step_s": 0.05}))
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    (dataset / "part-0.bin").write_bytes(b"\0" * 4096)
    by_address = {h.address: h for h in bed.hosts}
    silenced: set[str] = set()  # hosts cut off: a VM that is off

    def boot(ip: str, seconds: float) -> None:  # a new VM there is a new machine: it answers
        if ip in silenced:
            silenced.discard(ip)
            bed.restore(by_address[ip])

    # a spare address: a restart re-creates the PS's VM at any address
    with fake_on_bed(bed, 4, on_gone=processes_die_with_vm(bed), on_boot=boot, **FAST) as fake:
        cfg = compose_experiment("digits_local", [
            "job.train_steps=20", "job.checkpoint_frequency=10", "cluster.workers=2",
            f"cluster.recovery.on_revocation={policy}", "cluster.recovery.replacement_delay_s=0",
            "cluster.recovery.restart_delay_s=0", "progress=false"])
        plan = make_plan(cfg)
        gce = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"),
                         boot_timeout_s=900.0)  # a first login waits for a booting VM
        provider = GceProvider(gce, journal=Journal(run_dir / JOURNAL_FILE))
        cluster = provider.acquire(small_request("setup-loss", run_dir, workers=2, gpu=None))
        spec = build_trainer_spec(cfg, plan, cluster, "setup-loss")
        spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job,
                                                                  data_dir=str(dataset)))
        control = ControlChannel(run_dir / CONTROL_FILE)
        control.reset()
        rec = results.RunRecorder(run_dir)
        fleet = Fleet(provider, cluster, run_dir, spec,
                      provider.checkpoint_store("setup-loss", run_dir / CHECKPOINT_DIR),
                      control, rec=rec, ready_timeout_s=60.0, stop_grace_s=0.5,
                      command=[host_python(), str(FAKE_ROLE)],
                      env={"FAKE_ROLE_BEHAVIOUR": str(behaviour)})
        supervisor = Supervisor(
            cfg, fleet, rec, RunProgress("setup-loss", plan.total_steps, False), control,
            RevocationSchedule.from_config(cfg.revocation, plan.hosts), restart_timeout_s=60.0,
            poll_interval_s=0.3)
        target = next(h for h in cluster.hosts if h.spec.name == slot)
        vm = provider.vm_of(target.id)
        name, zone = vm.name, vm.zone
        workdir, bed_host = target.workdir, by_address[target.address]
        errors: list[BaseException] = []

        def preempt_at_moment() -> None:
            try:
                deadline = time.monotonic() + RUN_LIMIT_S
                while not moment_reached(moment, workdir, bed_host, bed):
                    assert time.monotonic() < deadline, f"{moment} never reached on {slot}"
                    time.sleep(0.01)
                fake.preempt(zone, name)
            except BaseException as error:  # reported below
                errors.append(error)

        watcher = None
        if stockout:
            for zone_name in ZONES:
                fake.stockout(zone_name)
        if moment == "login":
            fake.preempt(zone, name)
            if silent:
                silenced.add(bed_host.address)
                bed.cut(bed_host)
        else:
            watcher = threading.Thread(target=preempt_at_moment, daemon=True)
            watcher.start()
        started = time.monotonic()
        try:
            supervisor.deploy()
            supervisor.follow()
        finally:
            fleet.release()
            rec.close()
            for address in silenced:
                bed.restore(by_address[address])
        assert time.monotonic() - started < RUN_LIMIT_S
        if watcher is not None:
            watcher.join(5)
        assert not errors, errors
        assert fake.live_instances() == []
        left = bed.processes_left(bed.hosts[:4])
        assert not any(left.values()), left
        events = [json.loads(line) for line in
                  (run_dir / results.EVENTS_FILE).read_text().splitlines()]
        return events, provider, fleet, supervisor, name


def completed(events: list[dict[str, Any]], supervisor: Supervisor, moment: str) -> None:
    """The run trained once, to its end, on the last deployment; one before was given up at
    `moment` (roles started only when the loss came at their start), unless the chief's
    machine was lost before a deployment began (its first login)."""
    assert supervisor.state.error is None, supervisor.state.error
    assert [e["kind"] for e in events if e["kind"] in ("train_start", "train_end")] == [
        "train_start", "train_end"]
    *given_up, last = supervisor.fleet.deployments
    assert len(given_up) <= 1 and last.tasks
    assert all(bool(d.tasks) == (moment == "start") for d in given_up)


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "slot"), [("login", "worker-1"), ("start", "worker-1")])
def test_a_worker_vm_preempted_before_training_is_replaced_under_replace(
        ssh_testbed, tmp_path: Path, moment: str, slot: str) -> None:
    events, provider, fleet, supervisor, lost = run_preempting(
        ssh_testbed, tmp_path, moment, slot, "replace")
    completed(events, supervisor, moment)
    assert [e["host"] for e in events if e["kind"] == "revocation"] == [slot]
    [ready] = [e for e in events if e["kind"] == "replacement_ready"]
    assert ready["host"] == slot
    replacement = provider.vm_of(ready["host_id"])
    assert replacement.name != lost  # a new VM serves the slot, at its address
    assert fleet.cluster.host(ready["host_id"]).endpoint == ready["endpoint"]
    assert next(e for e in events if e["kind"] == "train_start")["workers"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("slot", ["worker-1", "ps-0"])
def test_a_first_login_waiting_for_a_vm_that_was_preempted_gives_up_at_once(
        ssh_testbed, tmp_path: Path, slot: str) -> None:
    """The VM is off (its host answers nothing): the first login, which waits up to
    `boot_timeout_s` for a booting VM, gives up as soon as GCE says the VM is gone; the
    worker is left out (shrink), the PS's VM (the chief's first login) is re-created."""
    events, provider, fleet, supervisor, lost = run_preempting(
        ssh_testbed, tmp_path, "login", slot, "shrink", silent=True)
    completed(events, supervisor, "login")
    lost_hosts = {e["host"] for e in events if e["kind"] == "revocation"}
    if slot == "worker-1":
        assert lost_hosts == {"worker-1"}
        assert [h.spec.name for h in fleet.dropped] == ["worker-1"]
    else:
        assert lost_hosts == {"ps-0", "chief-0", "evaluator-0"}
        assert not fleet.dropped
        assert provider.vm_of(fleet.cluster.hosts_for(Role.PS)[0].id).name != lost


@pytest.mark.slow
def test_a_worker_lost_before_training_without_capacity_for_a_replacement_shrinks_the_cluster(
        ssh_testbed, tmp_path: Path) -> None:
    events, _provider, fleet, supervisor, _lost = run_preempting(
        ssh_testbed, tmp_path, "login", "worker-1", "replace", stockout=True)
    completed(events, supervisor, "login")
    [failed] = [e for e in events if e["kind"] == "replacement_failed"]
    assert failed["hosts"] == ["worker-1"] and "no zone could create" in failed["error"]
    assert [e["action"] for e in events if e["kind"] == "recovery_end"] == ["continue"]
    assert next(e for e in events if e["kind"] == "train_start")["workers"] == 1
    assert [h.spec.name for h in fleet.dropped] == ["worker-1"]


@pytest.mark.slow
def test_a_worker_vm_preempted_during_setup_shrinks_the_cluster_under_shrink(
        ssh_testbed, tmp_path: Path) -> None:
    events, provider, fleet, supervisor, lost = run_preempting(
        ssh_testbed, tmp_path, "setup", "worker-0", "shrink")
    completed(events, supervisor, "setup")
    assert [e["host"] for e in events if e["kind"] == "revocation"] == ["worker-0"]
    assert [e["action"] for e in events if e["kind"] == "recovery_end"] == ["continue"]
    assert next(e for e in events if e["kind"] == "train_start")["workers"] == 1
    assert [h.spec.name for h in fleet.dropped] == ["worker-0"]
    assert provider.vm_of(fleet.dropped[0].id).name == lost


@pytest.mark.slow
def test_the_ps_vm_preempted_while_the_dataset_is_staged_is_recreated(
        ssh_testbed, tmp_path: Path) -> None:
    events, provider, fleet, supervisor, lost = run_preempting(
        ssh_testbed, tmp_path, "data", "ps-0", "shrink")
    completed(events, supervisor, "data")
    [start] = [e for e in events if e["kind"] == "recovery_start"]
    assert (start["action"], start["attempt"]) == ("restart", 1)
    ready = {e["host"]: e["host_id"] for e in events if e["kind"] == "replacement_ready"}
    assert {"ps-0", "chief-0", "evaluator-0"} <= set(ready)  # the VM and every role on it
    assert provider.vm_of(ready["ps-0"]).name != lost
    assert fleet.cluster.hosts_for(Role.PS)[0].id == ready["ps-0"]
