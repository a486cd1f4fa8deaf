"""The headline command end to end on "Google Cloud", on machines that share nothing with this one:

    python -m orchestrator +experiment=cifar10_res32 -m cluster.workers=4,8,16

run as written (Hydra's sweep, one cluster after the other) against the fake Compute API whose
VMs are isolated hosts (tests/testbed/isolated.py: own root filesystem, pid and network
namespaces, Debian 13's own Python 3.13, no TensorFlow, login user `transient` made by the guest
agent from the `ssh-keys` metadata, logins refused while the VM boots), with Cloud Storage on
gcp-storage-emulator. No `provider.python`, no `provider.ssh_user`, no `provider.remote_root`:
the VMs run the trainer from the runtime baked into their image.

As a user would (README "Baked images"), the image is baked first with the real command,
`python -m orchestrator.image bake`, on a fake of the same bed (once per pytest session:
tests/provisioning/baked_image.py, `baked_gce_image`; this fake imports it): one VM of the
base family (`debian-13`, which the fake boots from the Debian 13 root filesystem) installs the
hosts' runtime from a package index on the bed's bridge (pypiserver, `provider.index_url`), is
stopped, its disk becomes the image. The sweep then runs with `provider.image=<baked>` and the default `provider.index_url`
(the public PyPI), which the VMs cannot reach: a VM that tried to install anything would fail
the run, so the VMs only unpack our wheel.

**The fake's GPUs are labels.** The experiment plans Spot T4 workers, and the VMs are created
with the T4 in `guestAccelerators` (asserted), but the fake's VMs have no GPU and no nvidia-smi.
So the run sets two real, documented settings (README "Running on Google Cloud"):
`provider.gpu_check=false` (otherwise the worker VMs would rightly stop the run: "sees no GPU")
and `provider.extra=cpu` (every VM installs TensorFlow's CPU build, here: the image is baked
with it; the CUDA build is ~2.5 GB of wheels that no host here could use). The GPU check itself
is tested in test_gce_gpu.py; nothing here pretends a GPU.

Overrides only make the run small: a short step budget, batch 2, CIFAR-10-shaped files the
test writes (staged to the VMs over SFTP: they do not share this machine's files), evaluation on
a few images. The experiment's own zones are used: its plan zone (us-west1-b) is stocked out,
so every cluster lands in the next zone of `provider.zones`. A Spot worker of the 16-worker
cluster is preempted mid-run (its VM's host is powered off, every process on it dies) and
replaced. Afterwards: three completed runs in runs.csv, every run's result files, checkpoints
and results in the bucket, no VM in the fake and no host running.
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
from pathlib import Path

import numpy as np
import pytest

from provisioning.gce.storage import GcsStore, GcsUrl
from provisioning.journal import ResourceKind, list_unreleased
from tests.provisioning.baked_image import ENV, ZONES, BakedImage, fake_with_image, provider_args
from tests.provisioning.test_gce_storage import BUCKET, emulator_fixture  # noqa: F401
from tests.testbed import isolated
from tests.testbed.isolated import IsolatedTestBed

# Costly for a test: a bake (TensorFlow installed once on a VM), 3 clusters, 38 TensorFlow
# processes (19 for 16 workers) on 17 isolated hosts, ResNet-32 built by each chief and
# evaluator. The cap leaves room for a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.headline, pytest.mark.isolated,
              pytest.mark.tf_cluster, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
WORKERS = (4, 8, 16)
PREEMPTED_RUN = 2  # the sweep's third run: the 16-worker cluster
# ZONES: conf/provider/gce.yaml's order; the experiment plans us-west1-b, which is stocked out.
PREFIX = "headline"
TRAIN_STEPS = 100
PREEMPT_AT_STEP = 1  # the first progress report: training is under way
RUN_TIMEOUT_S = 1700
CIFAR_TRAIN_PER_FILE, CIFAR_TEST = 40, 16
TIMING_FILE = REPO / ".bench" / "gce-fake.json"  # bake and sweep seconds of the last pass


def write_cifar10(root: Path, seed: int = 0) -> Path:
    """CIFAR-10's binary layout (trainer/datasets.py DATASETS): 5 train batches and a test
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


def test_headline_sweep_on_fake_gce(gce_isolated_bed: IsolatedTestBed,
                                    baked_gce_image: BakedImage, emulator: str,
                                    tmp_path: Path) -> None:
    bed = gce_isolated_bed
    data_dir = write_cifar10(tmp_path / "cifar10")
    sweep_dir = tmp_path / "sweep"
    image = baked_gce_image.url
    # one VM per address: the largest cluster's 17 VMs, and one for the preempted worker's
    # replacement (a preempted VM keeps its address until it is deleted)
    with fake_with_image(bed, baked_gce_image, vms=max(WORKERS) + 2) as fake:
        baked_at = time.monotonic()
        fake.stockout(ZONES[0])
        argv = [
            sys.executable, "-m", "orchestrator", "+experiment=cifar10_res32", "-m",
            f"cluster.workers={','.join(map(str, WORKERS))}",
            # the fake cloud, the baked image and the emulated bucket
            *provider_args(fake, bed), f"provider.image={image}",
            f"provider.storage=gs://{BUCKET}/{PREFIX}",
            "cluster.recovery.on_revocation=replace", "cluster.recovery.replacement_delay_s=0",
            # small: a short budget, tiny batches, the test's files, few evaluations
            f"job.data_dir={data_dir}", f"job.train_steps={TRAIN_STEPS}", "job.batch_size=2",
            f"job.checkpoint_frequency={TRAIN_STEPS // 2}", "job.eval_frequency=0",
            "preflight=false", "progress=false", f"hydra.sweep.dir={sweep_dir}"]
        env = {**ENV, "STORAGE_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": fake.project}
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
            worker = next(i for i in fake.live_instances()
                          if i.body["labels"]["role"] == "worker")
            pidns = fake.host_of(worker.zone, worker.name).pidns
            fake.preempt(worker.zone, worker.name)  # its host goes off `stop_s` later
            out, _ = proc.communicate(timeout=max(10, deadline - time.monotonic()))
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        now = time.monotonic()
        timing = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "bake_s": baked_gce_image.bake_s, "sweep_s": round(now - baked_at, 1),
                  "load": round(os.getloadavg()[0], 1), "cores": os.cpu_count()}
        print(f"headline: bake {timing['bake_s']} s, sweep {timing['sweep_s']} s")
        assert proc.returncode == 0, out[-6000:]
        assert not fake.boot_errors, fake.boot_errors
        assert not isolated.live_processes([pidns])  # the preempted VM's processes died

        # Three clusters, each provisioned in the second zone from the baked image, trained
        # to the budget; the workers' VMs carry the plan's T4 (a label on the fake).
        with open(sweep_dir / "runs.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert sorted(int(r["workers"]) for r in rows) == list(WORKERS)
        inserted = [op for op in fake.operations.values()  # VMs
                    if op.operation_type == "insert" and op.error is None and op.zone in ZONES]
        bodies = [fake.instances[(op.zone, op.target)].body for op in inserted]
        assert {op.zone for op in inserted} == {ZONES[1]}
        assert any(op.zone == ZONES[0] and op.error is not None  # the stock-out was met
                   for op in fake.operations.values() if op.operation_type == "insert")
        assert len(inserted) == sum(n + 1 for n in WORKERS) + 1  # + the replacement
        sources = [b["disks"][0]["initializeParams"]["sourceImage"] for b in bodies]
        from_image = [s for s in sources if s.endswith(baked_gce_image.name)]
        assert len(from_image) == len(inserted), sources
        workers = [b for b in bodies if b["labels"]["role"] == "worker"]
        assert len(workers) == sum(WORKERS) + 1
        assert all("nvidia-tesla-t4" in b["guestAccelerators"][0]["acceleratorType"]
                   for b in workers), workers[0].get("guestAccelerators")
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

        # The preempted worker was revoked and replaced.
        revoked = [e for e in events(preempted_dir) if e["kind"] == "revocation"]
        assert ("worker", "revoked") in [(e["role"], e["cause"]) for e in revoked], revoked
        summary = json.loads((preempted_dir / "summary.json").read_text())
        assert summary["replacements"] >= 1
        assert any(e["kind"] == "replacement_ready" for e in events(preempted_dir))
        # One preemption, counted once and never as a crash, whichever of its signals (the
        # worker's exit, the cloud's listing) came first (orchestrator/runtime/supervisor.py).
        assert len(revoked) == 1 and summary["revocations"] == 1, (revoked, summary)
        crashed = [e for e in events(preempted_dir) if e.get("cause") == "crashed"]
        assert not crashed, crashed
        # No healthy worker failed: only the preempted one may have closures failed (gRPC
        # keepalive within the servers' ping policy, trainer/keepalive.py; the 16-worker run
        # once failed five healthy workers by GOAWAY "too_many_pings").
        for row in rows:
            run_events = events(Path(row["run_dir"]))
            failed = {e["worker"] for e in run_events if e["kind"] == "worker_failure"}
            lost = [e for e in run_events if e["kind"] == "revocation" and e["role"] == "worker"]
            assert len(failed) <= len(lost), (row["workers"], failed, lost)
            pings = [e for e in run_events if "too_many_pings" in str(e.get("error", "")).lower()
                     or "too many pings" in str(e.get("error", "")).lower()]
            assert not pings, pings

        # Nothing left: no VM in the fake, no VM in any journal, no host running.
        assert fake.live_instances() == []
        for row in rows:
            assert [e for e in list_unreleased(Path(row["run_dir"]) / "journal.jsonl")
                    if e.kind is ResourceKind.VM] == []
        fake.assert_hosts_off(10.0)
    # docs/benchmarks.md quotes it (bench/hosts.py): the figure of the last passing run here
    TIMING_FILE.parent.mkdir(exist_ok=True)
    TIMING_FILE.write_text(json.dumps(timing) + "\n")
