"""End to end on "Google Cloud": the real CLI with `provider=gce` against the fake Compute API
whose VMs are isolated hosts (gce_fixtures.IsolatedFakeGce over tests/testbed/isolated.py: their
own root filesystem, pid and network namespaces, the login user `transient` made by the guest
agent from the `ssh-keys` metadata, logins refused while a VM boots), roles deployed and trained
over SSH. The VMs boot the image `python -m orchestrator.image bake` makes (tests/testbed/baked.py,
cached on this machine: Debian 13's Python 3.13 with the hosts' runtime), given as
`provider.image`: no `provider.python`, `ssh_user` or `remote_root`, and the VMs reach no package
index, so they only unpack our wheel. The first zone is stocked out (the run lands in the
second), a worker's Spot VM is preempted mid-run (its host is powered off `stop_s` later, every
process on it dies; the run replaces it at the same address and finishes), and afterwards no VM,
no journal entry and no host is left. A second run loses a worker's VM between RUNNING and its
first step (audit S1), which recovery replaces as it would mid-training.
"""

# ruff: noqa: F811  (the bed fixtures are imported, then requested by name)
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioning.journal import ResourceKind, list_unreleased
from tests.provisioning.gce_fixtures import IsolatedFakeGce
from tests.testbed import isolated
from tests.testbed.baked import BakedRuntime
from tests.testbed.isolated import IsolatedTestBed
from tests.testbed.isolated_fixtures import baked_runtime, module_isolated_bed  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]

REPO = Path(__file__).resolve().parents[2]
ZONES = ("us-central1-a", "us-central1-b")
RUN_TIMEOUT_S = 480
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def small_fake(bed: IsolatedTestBed) -> IsolatedFakeGce:
    """3 VMs, and an address to spare should a replacement not get its slot's."""
    return IsolatedFakeGce(bed, 4, login_refused_s=2.0, zones=ZONES, provision_s=0.2,
                           staging_s=0.2, insert_op_s=0.1, delete_op_s=0.2, stop_s=0.2,
                           wait_cap_s=1.0)


def cli_argv(fake: IsolatedFakeGce, bed: IsolatedTestBed, image: str, run_dir: Path,
             *extra: str) -> list[str]:
    """`digits_local` on the fake cloud from the baked image, workers replaced when lost."""
    return [
        sys.executable, "-m", "orchestrator", "+experiment=digits_local", "provider=gce",
        f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
        f"provider.project={fake.project}", f"provider.zones=[{','.join(ZONES)}]",
        f"provider.ssh_key={bed.client_key}", f"provider.image={image}",
        "provider.extra=cpu", "provider.poll_interval_s=0.5", "provider.ready_poll_s=0.1",
        "provider.host_key_poll_s=0.2", "cluster.recovery.on_revocation=replace",
        "cluster.recovery.replacement_delay_s=0", "job.checkpoint_frequency=100",
        "progress=false", *extra, f"hydra.run.dir={run_dir}"]


def preempt_a_worker_when(fake: IsolatedFakeGce, proc: subprocess.Popen[str], run_dir: Path,
                          reached: Callable[[dict], bool], what: str) -> tuple[Any, Any, str]:
    """Once an event of the run satisfies `reached`, preempt a worker's Spot VM (its host goes
    off `stop_s` later) and wait for the run's end: (the VM, its host's pid namespace, the
    run's output). The run is killed if anything fails meanwhile."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not any(reached(e) for e in events(run_dir)):
            assert proc.poll() is None, proc.stdout.read()[-4000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"no {what}"
            time.sleep(0.05)
        worker = next(i for i in fake.live_instances() if i.body["labels"]["role"] == "worker")
        pidns = fake.host_of(worker.zone, worker.name).pidns
        fake.preempt(worker.zone, worker.name)
        out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return worker, pidns, out


def test_cli_on_fake_gce_stockout_preemption_and_nothing_left(
        module_isolated_bed: IsolatedTestBed, baked_runtime: BakedRuntime,
        tmp_path: Path) -> None:
    bed = module_isolated_bed
    run_dir = tmp_path / "run"
    with small_fake(bed) as fake:
        image = fake.add_image(baked_runtime.name, baked_runtime.disk)
        fake.stockout(ZONES[0])
        argv = cli_argv(fake, bed, image, run_dir, "job.train_steps=400")
        proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        worker, pidns, out = preempt_a_worker_when(
            fake, proc, run_dir, lambda e: e.get("kind") == "step" and e.get("step", 0) >= 100,
            "training step 100")
        assert proc.returncode == 0, out[-4000:]
        assert not fake.boot_errors, fake.boot_errors
        assert not isolated.live_processes([pidns])  # the preempted VM's processes died
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_steps"] >= 400
        # The preempted worker was replaced by a new VM at its slot's endpoint (same IP, port).
        assert summary["replacements"] >= 1
        provisioned = next(e for e in events(run_dir) if e["kind"] == "provisioned")
        endpoints = dict(item.split("=") for item in provisioned["hosts"])
        ready = [e for e in events(run_dir) if e["kind"] == "replacement_ready"]
        assert ready and ready[0]["endpoint"] == endpoints[ready[0]["host"]]
        assert worker.ip == ready[0]["endpoint"].split(":")[0]
        inserted = [op for op in fake.operations.values()
                    if op.operation_type == "insert" and op.error is None]
        assert len(inserted) == 4  # 3 VMs + the replacement
        sources = {fake.instances[(op.zone, op.target)].body["disks"][0]["initializeParams"]
                   ["sourceImage"] for op in inserted}
        assert {s.rsplit("/", 1)[1] for s in sources} == {baked_runtime.name}, sources
        # Everything ran in the second zone; every VM is gone, the journal agrees.
        zones = {op.zone for op in fake.operations.values() if op.operation_type == "insert"
                 and op.error is None}
        assert zones == {ZONES[1]}
        assert fake.live_instances() == []
        assert [e for e in list_unreleased(run_dir / "journal.jsonl")
                if e.kind is ResourceKind.VM] == []
        fake.assert_hosts_off(10.0)  # every VM's host powered off


def test_cli_on_fake_gce_worker_preempted_before_training_is_replaced(
        module_isolated_bed: IsolatedTestBed, baked_runtime: BakedRuntime,
        tmp_path: Path) -> None:
    """A Spot worker preempted before training (audit S1): the moment the run records
    `provisioned` (every VM RUNNING and checked), the fake preempts a worker's VM, whose host
    powers off while the deployer logs into the VMs and sets them up. The loss goes to
    `cluster.recovery` (replace): a new VM at the worker's address, the roles deployed on the
    resulting cluster, the run completes; no VM, journal entry or host is left."""
    bed = module_isolated_bed
    run_dir = tmp_path / "run"
    with small_fake(bed) as fake:
        image = fake.add_image(baked_runtime.name, baked_runtime.disk)
        argv = cli_argv(fake, bed, image, run_dir, "job.train_steps=200", "preflight=false")
        proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        worker, _, out = preempt_a_worker_when(
            fake, proc, run_dir, lambda e: e.get("kind") == "provisioned", "provisioned")
        assert proc.returncode == 0, out[-4000:]
        assert not fake.boot_errors, fake.boot_errors
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_steps"] >= 200
        assert summary["revocations"] == 1 and summary["replacements"] == 1
        kinds = [e["kind"] for e in events(run_dir)]
        # the loss was decided before training started, and training started once
        assert kinds.index("revocation") < kinds.index("train_start")
        assert kinds.count("train_start") == 1
        ready = next(e for e in events(run_dir) if e["kind"] == "replacement_ready")
        assert ready["endpoint"].split(":")[0] == worker.ip  # the worker's slot, its address
        inserted = [op for op in fake.operations.values()
                    if op.operation_type == "insert" and op.error is None]
        assert len(inserted) == 4  # 3 VMs + the replacement
        assert fake.live_instances() == []
        assert [e for e in list_unreleased(run_dir / "journal.jsonl")
                if e.kind is ResourceKind.VM] == []
        fake.assert_hosts_off(10.0)  # every VM's host powered off
