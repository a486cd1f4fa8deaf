"""Detached sweeps end to end on the fake cloud whose VMs are isolated hosts (issue 33).

    python -m orchestrator +experiment=cifar10_lab -m cluster.workers=4,8 ... --detach

The user's side is this test machine: a user repository of its own (`experiments/cifar10_lab.yaml`,
a copy of the packaged headline) in a temporary folder, its own tool key and caches. The command
checks every point, uploads the repository's experiments, this tool's wheel and the CIFAR-10
files the test writes to the bucket (the GCS emulator, on the bed's bridge where the VMs reach
it), creates the controller VM and returns; nothing of the user's side runs after that. The
controller VM is an isolated host like the workers (Debian 13's own Python, no TensorFlow, no
Google library): its startup script installs the tool from the bucket's wheel and a package index
on the bridge, and its agent runs the sweep, creating the workers' VMs from the image baked once
per session (tests/provisioning/baked_image.py).

- The headline, detached: `status` and `logs` while it runs, one Spot worker preempted, the
  results pulled back (same rows and files as an attached sweep writes), no VM left.
- A second detached sweep cancelled while it trains: no VM left, the runs recorded interrupted.
- The controller VM deleted mid-sweep: `python -m orchestrator.controller resume` here finishes
  the sweep from the bucket.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.controller import layout
from orchestrator.rundir import results
from provisioning.gce.storage import GcsStore, GcsUrl
from tests.provisioning.baked_image import ENV, ZONES, BakedImage, fake_with_image, provider_args
from tests.provisioning.gce_fixtures import BUCKET, storage_emulator
from tests.provisioning.test_gce_headline import events, write_cifar10
from tests.testbed.isolated import IsolatedTestBed

pytestmark = [pytest.mark.slow, pytest.mark.headline, pytest.mark.isolated,
              pytest.mark.tf_cluster, pytest.mark.timeout(3000)]

REPO = Path(__file__).resolve().parents[2]
TRAIN_STEPS = 200
SWEEP_TIMEOUT_S = 1800


@pytest.fixture
def cloud(gce_isolated_bed: IsolatedTestBed, baked_gce_image: BakedImage, tmp_path: Path):
    """The fake cloud on the bridge (its API, metadata server and the bucket where the
    controller VM reaches them), the controller's package index, the user's folder."""
    from tests.testbed import wheelhouse

    bed = gce_isolated_bed
    index_url = bed.serve_index(wheelhouse.controller_wheelhouse())
    lab = tmp_path / "lab"
    (lab / "experiments").mkdir(parents=True)
    text = (REPO / "experiments" / "cifar10_res32.yaml").read_text()
    (lab / "experiments" / "cifar10_lab.yaml").write_text(
        text.replace("name: cifar10_res32", "name: cifar10_lab"))
    data_dir = write_cifar10(tmp_path / "cifar10")
    with storage_emulator(address=bed.gateway) as emulator, \
            fake_with_image(bed, baked_gce_image, vms=12, address=bed.gateway) as fake:
        env = {**ENV, "STORAGE_EMULATOR_HOST": emulator, "GOOGLE_CLOUD_PROJECT": fake.project,
               "XDG_CONFIG_HOME": str(tmp_path / "config"),
               "XDG_CACHE_HOME": str(tmp_path / "cache"), "TRANSIENT_REPO": str(lab)}
        fake.stockout(ZONES[0])
        args = [*[a for a in provider_args(fake, bed) if not a.startswith("provider.ssh_key=")],
                f"provider.image={baked_gce_image.url}", f"provider.index_url={index_url}",
                f"provider.storage=gs://{BUCKET}/lab",
                f"provider.controller_zone={ZONES[1]}",
                "provider.lease_s=60", "provider.unreachable_grace_s=60",
                "cluster.recovery.on_revocation=replace", "cluster.recovery.replacement_delay_s=0",
                f"job.data_dir={data_dir}", f"job.train_steps={TRAIN_STEPS}", "job.batch_size=2",
                f"job.checkpoint_frequency={TRAIN_STEPS // 3}", "job.eval_frequency=0",
                "preflight=false", "progress=false"]
        yield fake, lab, env, args
        # nothing left: no VM, no host running (a failed test's VMs are deleted, then named)
        leftover = [i.name for i in fake.live_instances()]
        for vm in fake.live_instances():
            fake.delete(vm.zone, vm.name, None)
        assert not leftover, leftover


def detach(lab: Path, env: dict[str, str], args: list[str], workers: str) -> layout.SweepUrls:
    done = subprocess.run([sys.executable, "-m", "orchestrator", "+experiment=cifar10_lab", "-m",
                           f"cluster.workers={workers}", *args, "--detach"],
                          cwd=lab, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("detached: "))
    url = line.rsplit("its state in ", 1)[1].strip()
    return layout.SweepUrls.parse(url)


def ctl(lab: Path, env: dict[str, str], *args: str, timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.controller", *args], cwd=lab,
                          env=env, capture_output=True, text=True, timeout=timeout)


def state(urls: layout.SweepUrls) -> layout.ControllerState | None:
    text = GcsStore().read_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)))
    return layout.ControllerState.from_json(text.decode()) if text else None


def mirrored_events(urls: layout.SweepUrls, point: int) -> list[dict]:
    text = GcsStore().read_bytes(GcsUrl.parse(f"{urls.mirror}/{point}/events.jsonl")) or b""
    out = []
    for line in text.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def controller_logs(fake, urls: layout.SweepUrls) -> str:
    """The controller VM's bootstrap and agent logs, read from its disk (for a failure)."""
    current = state(urls)
    slot = next((h for ip, h in fake.slots.items()
                 if current is not None and any(i.name == current.vm and i.ip == ip
                                                for i in fake.instances.values())), None)
    if slot is None:
        return "(no controller VM)"
    out = []
    for name in ("var/log/transient-controller.log", "opt/transient-controller/agent.log",
                 f"var/tmp/transient-controller/{urls.sweep_id}/console.log"):
        path = slot.upper / name
        out.append(f"--- {name}\n" + (path.read_text(errors="replace")[-4000:]
                                       if path.exists() else "(none)"))
    text = "\n".join(out)
    (Path(os.environ.get("TMPDIR", "/tmp")) / "transient-controller-debug.log").write_text(text)
    return text


def wait_for(what: str, check, urls: layout.SweepUrls, timeout: float = SWEEP_TIMEOUT_S,
             fake=None):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        current = state(urls)
        assert current is None or current.phase != layout.FAILED, (
            what, current, controller_logs(fake, urls) if fake is not None else "")
        assert time.monotonic() < deadline, f"timed out waiting for {what}; state {current}"
        time.sleep(2.0)


def training(urls: layout.SweepUrls, point: int, kind: str = "step") -> bool:
    return any(e.get("kind") == kind for e in mirrored_events(urls, point))


def test_the_headline_detached_survives_its_user_and_a_preemption(cloud) -> None:
    fake, lab, env, args = cloud
    urls = detach(lab, env, args, "4,8")  # the user's side ends here
    controller = fake.instances[(ZONES[1], state(urls).vm)]  # type: ignore[union-attr]
    assert controller.body["labels"]["role"] == "controller"
    assert "scheduling" not in controller.body or \
        controller.body["scheduling"].get("provisioningModel") != "SPOT"

    wait_for("the 8-worker point to start training",
             lambda: training(urls, 1, "train_start"), urls, fake=fake)
    status = ctl(lab, env, "status", urls.sweep_id)
    assert status.returncode == 0, status.stderr
    assert "running" in status.stdout, status.stdout
    logs = ctl(lab, env, "logs", urls.sweep_id)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    # a Spot worker of the training 8-worker cluster (the mirror is seconds behind: its VMs
    # are looked up in the cloud, and the point must still be short of its budget)
    worker = wait_for("a live worker VM", lambda: next(
        (i for i in fake.live_instances() if i.body["labels"].get("role") == "worker"), None),
        urls, timeout=60, fake=fake)
    fake.preempt(worker.zone, worker.name)

    wait_for("the controller to finish", lambda: (s := state(urls)) and s.terminal, urls)
    assert state(urls).phase == layout.DONE, state(urls)  # type: ignore[union-attr]
    pulled = ctl(lab, env, "pull", urls.sweep_id)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    command = layout.Command.from_json(GcsStore().read_bytes(GcsUrl.parse(
        urls.child(layout.SUBMIT, layout.COMMAND_FILE))).decode())  # type: ignore[union-attr]
    sweep_dir = lab / command.sweep_dir
    with open(sweep_dir / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(int(r["workers"]) for r in rows) == [4, 8]
    assert all(r["status"] == "completed" for r in rows), rows
    # an attached sweep's schema: every summary column, the rows naming the pulled folders
    columns = [*results.SUMMARY_FIELDS, *results.TRANSIENT_SUMMARY_FIELDS]
    assert set(columns) - {"phases"} <= set(rows[0]), sorted(set(columns) - set(rows[0]))
    assert {Path(r["run_dir"]).parent for r in rows} == {Path(os.path.abspath(sweep_dir))}
    for point in (0, 1):
        run_dir = sweep_dir / str(point)
        for name in ("config.yaml", "plan.json", "events.jsonl", "metrics.csv", "summary.json"):
            assert (run_dir / name).is_file(), (run_dir, name)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_steps"] >= TRAIN_STEPS
        assert set(results.SUMMARY_FIELDS) <= set(summary), run_dir
    revoked = [e for e in events(sweep_dir / "1") + events(sweep_dir / "0")
               if e["kind"] == "revocation" and e["role"] == "worker"]
    assert revoked, "the preempted worker was not seen"
    # the user's side sent the wheel, the repository and the data once; the VMs read the data
    # from the bucket (what the user's link carried is the submit's uploads only)
    assert (lab / "multirun").is_dir()


def test_cancel_stops_a_detached_sweep_and_leaves_no_vm(cloud) -> None:
    fake, lab, env, args = cloud
    urls = detach(lab, env, args, "2")
    wait_for("the point to train", lambda: training(urls, 0), urls, fake=fake)
    done = ctl(lab, env, "cancel", urls.sweep_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert state(urls).phase == layout.CANCELLED, state(urls)  # type: ignore[union-attr]
    assert fake.live_instances() == []


def test_a_deleted_controller_is_resumed_from_the_users_machine(cloud) -> None:
    fake, lab, env, args = cloud
    urls = detach(lab, env, args, "2,4")
    wait_for("the first point to train", lambda: training(urls, 0), urls, fake=fake)
    vm = state(urls).vm  # type: ignore[union-attr]
    fake.delete(ZONES[1], vm, None)  # an operator, or a crash: the controller is gone
    wait_for("the controller's heartbeat to go stale",
             lambda: (s := state(urls)) and s.age_s() > 3 * layout.HEARTBEAT_S, urls)
    done = ctl(lab, env, "resume", urls.sweep_id, timeout=SWEEP_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    command = layout.Command.from_json(GcsStore().read_bytes(GcsUrl.parse(
        urls.child(layout.SUBMIT, layout.COMMAND_FILE))).decode())  # type: ignore[union-attr]
    with open(lab / command.sweep_dir / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(int(r["workers"]) for r in rows) == [2, 4]
    assert all(r["status"] == "completed" for r in rows), rows
