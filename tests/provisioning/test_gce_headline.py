"""The headline command end to end on "Google Cloud":

    python -m orchestrator +experiment=cifar10_res32 -m cluster.workers=4,8,16

run as written (Hydra's sweep, one cluster after the other) against the fake Compute API, every
VM backed by a namespace sshd host of the SSH test bed, with Cloud Storage on gcp-storage-emulator,
and overrides that only make it small: a short step budget, batch 2, CIFAR-10-shaped files the
test writes, evaluation on a few images. The experiment's own zones are used: its plan zone
(us-west1-b) is stocked out, so every cluster lands in the next zone of `provider.zones`. A Spot
worker of the 16-worker cluster is preempted mid-run (its processes die, the VM goes away) and
replaced. Afterwards: three completed runs in runs.csv, every run's result files, checkpoints and
results in the bucket, no VM in the fake and no process on any namespace host.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from provisioning.gce.storage import GcsStore, GcsUrl
from provisioning.journal import ResourceKind, list_unreleased
from tests.provisioning.gce_fixtures import preempt_a_worker
from tests.provisioning.test_gce_ssh import fake_on_bed
from tests.provisioning.test_gce_storage import BUCKET, emulator_fixture  # noqa: F401
from tests.testbed import SshTestBed, skip_reason
from tests.testbed.fixtures import host_python

# Costly for a test: 3 clusters, 38 TensorFlow processes (19 for 16 workers), ResNet-32 built
# by each chief and evaluator. Measured 550-650 CPU-seconds (27 min wall on the 2-core machine
# at load ~26 from other work), so about 5 min on an idle 2-core machine at best; the cap
# leaves room for a loaded one.
pytestmark = [pytest.mark.slow, pytest.mark.headline, pytest.mark.tf_cluster,
              pytest.mark.namespaces, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
WORKERS = (4, 8, 16)
PREEMPTED_RUN = 2  # the sweep's third run: the 16-worker cluster
# conf/provider/gce.yaml's zone order; the experiment plans us-west1-b, which is stocked out.
ZONES = ("us-west1-b", "us-west1-a", "us-central1-a", "us-central1-b")
PREFIX = "headline"
TRAIN_STEPS = 100
PREEMPT_AT_STEP = 1  # the first progress report: training is under way
RUN_TIMEOUT_S = 1700
CIFAR_TRAIN_PER_FILE, CIFAR_TEST = 40, 16


def write_cifar10(root: Path, seed: int = 0) -> Path:
    """CIFAR-10's binary layout (trainer/problems.py CIFAR_LAYOUTS): 5 train batches and a test
    batch of records `label byte + 3072 channel-major pixel bytes`, with random content."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name, n in [(f"data_batch_{i}.bin", CIFAR_TRAIN_PER_FILE) for i in range(1, 6)] + [
            ("test_batch.bin", CIFAR_TEST)]:
        labels = rng.integers(0, 10, (n, 1), dtype=np.uint8)
        pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        (folder / name).write_bytes(np.concatenate([labels, pixels], axis=1).tobytes())
    return root


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


@pytest.fixture(name="bed")
def bed_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshTestBed]:
    """A test bed of its own with one namespace host per VM of the largest cluster: the 16
    workers' VMs and ps-0's (chief and evaluator share it). Not the session's bed, whose
    inventory other tests use whole."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    bed = SshTestBed(tmp_path_factory.mktemp("gcebed"), hosts=max(WORKERS) + 1)
    try:
        yield bed
    finally:
        bed.close()
    assert not bed.leftovers(), f"test bed left {bed.leftovers()}"


def test_headline_sweep_on_fake_gce(bed: SshTestBed, emulator: str, tmp_path: Path) -> None:
    hosts = bed.hosts
    data_dir = write_cifar10(tmp_path / "cifar10")
    sweep_dir = tmp_path / "sweep"
    started = time.monotonic()
    with fake_on_bed(bed, len(hosts), zones=ZONES, provision_s=0.2, staging_s=0.2, insert_op_s=0.1,
                     delete_op_s=0.2, stop_s=0.2, wait_cap_s=1.0) as fake:
        fake.stockout(ZONES[0])
        argv = [
            sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32", "-m",
            f"cluster.workers={','.join(map(str, WORKERS))}",
            # the fake cloud, its SSH hosts and the emulated bucket
            f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
            f"provider.project={fake.project}", "provider.ssh_user=root",
            f"provider.ssh_key={bed.client_key}", f"provider.python={host_python()}",
            f"provider.remote_root={tmp_path / 'vms'}", f"provider.storage=gs://{BUCKET}/{PREFIX}",
            "provider.poll_interval_s=0.5", "provider.ready_poll_s=0.1",
            "provider.host_key_poll_s=0.2", "cluster.recovery.on_revocation=replace",
            "cluster.recovery.replacement_delay_s=0",
            # small: a short budget, tiny batches, the test's files, few evaluations
            f"job.data_dir={data_dir}", f"job.train_steps={TRAIN_STEPS}", "job.batch_size=2",
            f"job.checkpoint_frequency={TRAIN_STEPS // 2}", "job.eval_frequency=0",
            "preflight=false", "progress=false", f"hydra.sweep.dir={sweep_dir}"]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
               "STORAGE_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": fake.project}
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        preempted_dir = sweep_dir / str(PREEMPTED_RUN)
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not any(e.get("kind") == "step" and e.get("step", 0) >= PREEMPT_AT_STEP
                          for e in events(preempted_dir)):
                assert proc.poll() is None, proc.stdout.read()[-6000:]  # type: ignore[union-attr]
                assert time.monotonic() < deadline, f"no step {PREEMPT_AT_STEP} in run 3"
                time.sleep(0.3)
            worker = preempt_a_worker(fake, bed)
            out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        print(f"headline sweep: {time.monotonic() - started:.1f} s")
        assert proc.returncode == 0, out[-6000:]

        # Three clusters, each provisioned in the second zone, trained to the budget.
        with open(sweep_dir / "runs.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert sorted(int(r["workers"]) for r in rows) == list(WORKERS)
        inserted = [op for op in fake.operations.values()
                    if op.operation_type == "insert" and op.error is None]
        assert {op.zone for op in inserted} == {ZONES[1]}
        assert any(op.zone == ZONES[0] and op.error is not None  # the stock-out was met
                   for op in fake.operations.values() if op.operation_type == "insert")
        assert len(inserted) == sum(n + 1 for n in WORKERS) + 1  # + the replacement
        for row in rows:
            run_dir = Path(row["run_dir"])
            assert row["status"] == "completed", row
            for name in ("config.yaml", "plan.json", "events.jsonl", "metrics.csv",
                         "summary.json"):
                assert (run_dir / name).is_file(), (run_dir, name)
            summary = json.loads((run_dir / "summary.json").read_text())
            assert summary["status"] == "completed" and summary["provider"] == "gce"
            assert summary["workers"] == int(row["workers"])
            assert summary["global_steps"] >= TRAIN_STEPS
            assert summary["final_accuracy"] is not None
            kinds = [e["kind"] for e in events(run_dir)]
            for kind in ("provisioned", "ready", "train_start", "checkpoint", "eval",
                         "train_end", "teardown"):
                assert kind in kinds, (run_dir, kind)
            provisioned = next(e for e in events(run_dir) if e["kind"] == "provisioned")
            assert len(provisioned["hosts"]) == summary["workers"] + 3  # ps, chief, evaluator
            # Checkpoints and results in the bucket, under gs://BUCKET/PREFIX/<run_id>/.
            run_prefix = f"{PREFIX}/{summary['run_id']}"
            objects = GcsStore().list(GcsUrl(BUCKET, run_prefix))
            checkpoints = {n for n in objects if n.startswith("checkpoints/")}
            assert "checkpoints/checkpoint" in checkpoints, sorted(objects)
            assert any(n.endswith(".index") for n in checkpoints), sorted(checkpoints)
            for name in ("summary.json", "events.jsonl", "metrics.csv", "config.yaml"):
                assert f"results/{name}" in objects, (name, sorted(objects))

        # The preempted worker was revoked and replaced at its slot's endpoint.
        revoked = [e for e in events(preempted_dir) if e["kind"] == "revocation"]
        assert ("worker", "revoked") in [(e["role"], e["cause"]) for e in revoked], revoked
        summary = json.loads((preempted_dir / "summary.json").read_text())
        assert summary["replacements"] >= 1
        ready = next(e for e in events(preempted_dir) if e["kind"] == "replacement_ready")
        assert ready["endpoint"].split(":")[0] == worker.ip

        # Nothing left: no VM in the fake, no VM in any journal, no process on any host.
        assert fake.live_instances() == []
        for row in rows:
            assert [e for e in list_unreleased(Path(row["run_dir"]) / "journal.jsonl")
                    if e.kind is ResourceKind.VM] == []
    assert bed.processes_left(hosts, within_s=10) == {h.name: [] for h in hosts}
