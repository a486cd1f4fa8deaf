"""End to end on "Google Cloud": the real CLI with `provider=gce` against the fake Compute API,
every VM backed by a namespace sshd host of the SSH test bed (the VM's internal and external IP),
roles deployed and trained over SSH. The first zone is stocked out (the run lands in the second),
a worker's Spot VM is preempted mid-run (its processes die, the VM goes away; the run replaces it
at the same address and finishes), and afterwards no VM, no journal entry and no process is left.
"""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioning.journal import ResourceKind, list_unreleased
from tests.provisioning.gce_fixtures import preempt_a_worker
from tests.provisioning.test_gce_ssh import fake_on_bed
from tests.testbed import SshTestBed
from tests.testbed.fixtures import host_python, ssh_testbed  # noqa: F401

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


def test_cli_on_fake_gce_stockout_preemption_and_nothing_left(
        ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    bed = ssh_testbed
    run_dir = tmp_path / "run"
    with fake_on_bed(bed, 3, zones=ZONES, provision_s=0.2, staging_s=0.2, insert_op_s=0.1,
                     delete_op_s=0.2, stop_s=0.2, wait_cap_s=1.0) as fake:
        fake.stockout(ZONES[0])
        argv = [
            sys.executable, "-m", "orchestrator", "+experiment=digits_local", "provider=gce",
            f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
            f"provider.project={fake.project}", f"provider.zones=[{','.join(ZONES)}]",
            "provider.ssh_user=root", f"provider.ssh_key={bed.client_key}",
            f"provider.python={host_python()}", f"provider.remote_root={tmp_path / 'vms'}",
            "provider.poll_interval_s=0.5", "provider.ready_poll_s=0.1",
            "provider.host_key_poll_s=0.2", "cluster.recovery.on_revocation=replace",
            "cluster.recovery.replacement_delay_s=0", "job.train_steps=400",
            "job.checkpoint_frequency=100", "progress=false", f"hydra.run.dir={run_dir}"]
        proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not any(e.get("kind") == "step" and e.get("step", 0) >= 100
                          for e in events(run_dir)):
                assert proc.poll() is None, proc.stdout.read()[-4000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "no training step 100"
                time.sleep(0.2)
            worker = preempt_a_worker(fake, bed)
            out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        assert proc.returncode == 0, out[-4000:]
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
        # Everything ran in the second zone; every VM is gone, the journal agrees.
        zones = {op.zone for op in fake.operations.values() if op.operation_type == "insert"
                 and op.error is None}
        assert zones == {ZONES[1]}
        assert fake.live_instances() == []
        assert [e for e in list_unreleased(run_dir / "journal.jsonl")
                if e.kind is ResourceKind.VM] == []
    assert bed.processes_left(bed.hosts[:3], within_s=10) == {h.name: [] for h in bed.hosts[:3]}
