"""A run with `job.data_dir=gs://...` on "Google Cloud": the real CLI with `provider=gce` against
the fake Compute API (VMs = namespace sshd hosts) and gcp-storage-emulator for the bucket. The
orchestrator downloads the CIFAR-shaped files into its data cache once and the deployer copies
them to the VM whose roles read them; the chief trains on that copy.

On the shared-filesystem bed: the subject is the data's path (bucket, cache, the copy into the
VM's run directory), not the VM; VMs that share nothing with this machine are test_gce_e2e.py
and the headline (which stages its files to them the same way)."""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioning.gce.storage import GcsStore, GcsUrl
from tests.provisioning.gce_fixtures import BUCKET, PROJECT, ZONES, storage_emulator
from tests.provisioning.test_gce_e2e import ENV, REPO
from tests.provisioning.test_gce_ssh import fake_on_bed
from tests.provisioning.test_gce_storage import cifar10_bin, read_tree
from tests.testbed import SshTestBed
from tests.testbed.fixtures import host_python, ssh_testbed  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]


def test_a_run_trains_on_a_gs_data_dir_staged_to_the_vms(ssh_testbed: SshTestBed,
                                                         tmp_path: Path) -> None:
    bed = ssh_testbed
    files = cifar10_bin(tmp_path / "src", records=64)
    url = f"gs://{BUCKET}/datasets/cifar10"
    run_dir, vms = tmp_path / "run", tmp_path / "vms"
    with storage_emulator(), fake_on_bed(bed, 2, project=PROJECT, zones=tuple(ZONES),
                                         provision_s=0.05, staging_s=0.05, insert_op_s=0.05,
                                         delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2) as fake:
        GcsStore().upload(tmp_path / "src", GcsUrl.parse(url))
        argv = [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "provider=gce",
                f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
                f"provider.project={PROJECT}", f"provider.zones=[{ZONES[0]}]",
                "provider.ssh_user=root", f"provider.ssh_key={bed.client_key}",
                f"provider.python={host_python()}", f"provider.remote_root={vms}",
                "provider.ready_poll_s=0.1", "provider.host_key_poll_s=0.2",
                "cluster.workers=1", "job.problem=image_cifar10", f"job.data_dir={url}",
                "job.train_steps=20", "job.batch_size=8", "job.eval_frequency=0",
                f"data_cache={tmp_path / 'cache'}", "preflight=false", "progress=false",
                f"hydra.run.dir={run_dir}"]
        done = subprocess.run(argv, cwd=REPO, env={**ENV, **{k: os.environ[k] for k in (
            "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}}, capture_output=True, text=True,
            timeout=480)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert fake.live_instances() == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    assert summary["final_accuracy"] is not None
    spec = json.loads((run_dir / "trainer_spec.json").read_text())
    assert spec["job"]["data_dir"] == "data/cifar10"  # the staged copy, relative to the work dir
    cached = tmp_path / "cache" / "gs" / BUCKET / "datasets" / "cifar10"
    assert read_tree(cached) == files  # downloaded once, on the orchestrator's machine
    staged = sorted(vms.glob("*/hosts/*/data/cifar10"))
    assert len(staged) == 1, "only the chief's VM (with the evaluator) reads the data"
    assert read_tree(staged[0]) == files
