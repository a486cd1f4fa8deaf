"""The orchestrator's own network dropped mid-training on "Google Cloud": a blip costs nothing.

The real CLI trains a small CIFAR-10-shaped job (`+experiment=cifar10_res32`, 2 Spot workers,
tiny batches) on the fake Compute API whose VMs are isolated hosts booted from the session's
baked image (tests/provisioning/baked_image.py, as test_gce_headline.py). Mid-training, the
user's machine loses its network for 20 s or 120 s: its address on the bed's bridge is removed
(no packet between it and the VMs, while the VMs still reach each other and their metadata
server), and the Compute API stops answering it (503 to every call, `FakeGce.api_down`).

Expected, and asserted: the VMs are neither revoked nor deleted, their roles train on, every
connection is re-established once the network is back and the roles' output is read on from
where it was; the run completes with its exact step count, no restart, no lost step, no loss,
and afterwards no VM and no host is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.provisioning.baked_image import ENV, BakedImage, fake_with_image, provider_args
from tests.provisioning.test_gce_headline import events, write_cifar10
from tests.testbed.isolated import IsolatedTestBed

pytestmark = [pytest.mark.slow, pytest.mark.outage, pytest.mark.isolated,
              pytest.mark.tf_cluster, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
WORKERS = 2
TRAIN_STEPS = 400
RUN_TIMEOUT_S = 1200


@pytest.mark.parametrize("drop_s", [20, 120])
def test_a_drop_of_the_orchestrators_network_costs_nothing_on_gce(
        gce_isolated_bed: IsolatedTestBed, baked_gce_image: BakedImage, tmp_path: Path,
        drop_s: int) -> None:
    bed = gce_isolated_bed
    data_dir = write_cifar10(tmp_path / "cifar10")
    run_dir = tmp_path / "run"
    with fake_with_image(bed, baked_gce_image, vms=WORKERS + 1) as fake:
        argv = [
            sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32",
            f"cluster.workers={WORKERS}",
            *provider_args(fake, bed), f"provider.image={baked_gce_image.url}",
            f"job.data_dir={data_dir}", f"job.train_steps={TRAIN_STEPS}", "job.batch_size=2",
            f"job.checkpoint_frequency={TRAIN_STEPS // 4}", "job.eval_frequency=0",
            "preflight=false", "progress=false", f"hydra.run.dir={run_dir}"]
        env = {**ENV, "GOOGLE_CLOUD_PROJECT": fake.project}
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not any(e.get("kind") == "step" for e in events(run_dir)):
                assert proc.poll() is None, proc.stdout.read()[-6000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "training never started"
                time.sleep(0.3)
            vms = {(i.zone, i.name) for i in fake.live_instances()}
            dropped = time.time()
            bed.drop_orchestrator()
            fake.api_down = True
            try:
                time.sleep(drop_s)
            finally:
                fake.api_down = False
                bed.restore_orchestrator()
            restored = time.time()
            out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
        except BaseException:
            bed.restore_orchestrator()
            fake.api_down = False
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        assert proc.returncode == 0, out[-6000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed", summary["error"]
        assert summary["global_steps"] == TRAIN_STEPS, summary
        assert summary["restarts"] == 0 and summary["lost_steps"] == 0, summary
        assert summary["revocations"] == 0 and summary["replacements"] == 0, summary
        # the VMs trained on meanwhile (the roles' own clocks; the bed shares this kernel's)
        assert any(e["kind"] == "step" and dropped + 1 < e["role_time"] < restored - 1
                   for e in events(run_dir)), "no training step during the drop"
        kinds = {e["kind"] for e in events(run_dir)}
        assert not kinds & {"revocation", "server_failure", "recovery_start", "restart"}, kinds
        # the same VMs from start to end: none deleted or re-created by the drop
        inserted = [op for op in fake.operations.values()
                    if op.operation_type == "insert" and op.error is None]
        assert len(inserted) == WORKERS + 1 and {(op.zone, op.target) for op in inserted} == vms
        said = " ".join(out.split())
        assert "unreachable" in said and "reachable again" in said, out[-3000:]
        assert fake.live_instances() == []
        fake.assert_hosts_off(10.0)
