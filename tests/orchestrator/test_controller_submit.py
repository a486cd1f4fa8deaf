"""`--detach` on the user's side, before anything is created: what it refuses (one line naming
the field, exit 2, nothing in the bucket or the cloud) and its dry run (the plan of every point
and the controller's line, nothing created). The submit that creates a controller VM is tested
on the fake cloud with isolated VMs (tests/provisioning/test_gce_detach.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.controller import layout
from orchestrator.controller.submit import (
    _sweep_names,
    controller_zones,
    detached_resume,
    first_point,
)
from provisioning.gce.storage import GcsStore, GcsUrl
from tests.fakes.gce_server import FakeGce
from tests.fakes.isolated_gce import ZONES  # conf/provider/gce.yaml's order
from tests.provisioning.gce_fixtures import BUCKET, PROJECT, storage_emulator, write_ssh_key

# with the detached sweeps (make gce-fake): each test runs the real command (a dry run of
# every point), kept out of make test's 25 minutes
pytestmark = pytest.mark.headline

REPO = Path(__file__).resolve().parents[2]
HEADLINE = ["+experiment=cifar10_res32", "-m", "cluster.workers=4,8"]


def orchestrate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd,
                          env={**os.environ, "XDG_CACHE_HOME": str(cwd / "cache")},
                          capture_output=True, text=True, timeout=300)


def test_the_controller_goes_beside_its_cluster() -> None:
    from provisioning.gce.config import GceConfig

    cfg = GceConfig(zones=["us-west1-b", "us-central1-a", "us-west1-a"])
    assert controller_zones(cfg, [None, "us-west1-b"]) == ["us-west1-b", "us-west1-a",
                                                           "us-central1-a"]
    cfg.controller_zone = "europe-west4-a"
    assert controller_zones(cfg, ["us-west1-b"]) == ["europe-west4-a"]


def test_first_point_and_the_folder_names() -> None:
    assert first_point(["cluster.workers=4,8", "seed=1", "sync=asp,bsp"]) == [
        "cluster.workers=4", "seed=1", "sync=asp"]
    sweep_id, folder = _sweep_names("cifar10_res32", None)
    assert layout.sweep_id_problem(sweep_id) is None
    assert folder.startswith("multirun/cifar10-res32/")
    # the VMs' sweep-id label (orchestrator/sweep.py sweep_id: parent and own name) is the id
    assert "-".join(Path(folder).parts[-2:]) == sweep_id
    assert _sweep_names("x", "multirun/lab/run-7")[0] == "lab-run-7"
    assert _sweep_names("x", None, sweep=False)[1].startswith("outputs/x/")


@pytest.mark.parametrize(("extra", "field"), [
    (["provider=local"], "provider"),
    (["provider.project=p"], "provider.storage"),
    (["provider.storage=gs://my-bucket/p", "provider.controller_machine_type=n2-standard-2"],
     "provider.controller_machine_type"),
])
def test_detach_refuses_in_one_line_before_anything(tmp_path: Path, extra: list[str],
                                                    field: str) -> None:
    done = orchestrate(*HEADLINE, *extra, "--detach", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: {field}:"), done.stderr
    assert "--detach" in lines[0]


def test_detach_dry_run_plans_every_point_and_the_controller_creating_nothing(
        tmp_path: Path) -> None:
    with storage_emulator(), FakeGce(project=PROJECT) as fake:
        done = orchestrate(*HEADLINE, f"provider.api_endpoint={fake.endpoint}",
                           "provider.credentials=anonymous", f"provider.project={PROJECT}",
                           f"provider.storage=gs://{BUCKET}/lab", "dry_run=true",
                           "--detach", cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.count("cifar10_res32") >= 2  # each point's plan
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("controller: "))
        assert "e2-standard-2" in line and "2 point(s)" in line, line
        assert "may create and delete the sweep's VMs" in done.stdout  # Editor, on the fake
        assert fake.instances == {}
        assert GcsStore().list(GcsUrl.parse(f"gs://{BUCKET}/lab")) == {}


def test_a_controller_account_that_cannot_create_vms_is_refused_before_anything(
        tmp_path: Path) -> None:
    """The default compute account only views VMs (a hardened project): the controller could
    not run the sweep, said in one line naming the setting and the roles to grant."""
    with storage_emulator(), FakeGce(project=PROJECT) as fake:
        fake.iam_policy = {"roles/compute.viewer": [
            f"serviceAccount:{fake.default_service_account}"]}
        done = orchestrate(*HEADLINE, f"provider.api_endpoint={fake.endpoint}",
                           "provider.credentials=anonymous", f"provider.project={PROJECT}",
                           f"provider.storage=gs://{BUCKET}/lab", "provider.lease_s=0",
                           "--detach", cwd=tmp_path)
        assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith("config error: provider.service_account: "), line
        assert "compute.instances.create" in line and "roles/compute.instanceAdmin.v1" in line
        assert fake.instances == {}
        assert GcsStore().list(GcsUrl.parse(f"gs://{BUCKET}/lab")) == {}


@pytest.mark.slow  # this tool's wheel is built
def test_detach_uploads_what_the_controller_needs_and_creates_it(tmp_path: Path) -> None:
    """The submit itself, on the fake Compute API (loopback: no VM boots here): the user's
    repository, this tool's wheel and the data folder in the bucket, the command as the
    controller must run it (the data's upload, no local key, no preflight), controller.json
    `submitted`, one on-demand controller VM, the id remembered, and how to follow printed."""
    lab = tmp_path / "lab"
    (lab / "experiments").mkdir(parents=True)
    (lab / "experiments" / "mine.yaml").write_text(
        (REPO / "experiments" / "cifar10_res32.yaml").read_text().replace(
            "name: cifar10_res32", "name: mine"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 1000)
    with storage_emulator(), FakeGce(project=PROJECT, zones=ZONES) as fake:
        fake.stockout("us-west1-b")  # the cluster's zone has no capacity left
        done = orchestrate("+experiment=mine", "-m", "cluster.workers=4,8",
                           f"provider.api_endpoint={fake.endpoint}",
                           "provider.credentials=anonymous", f"provider.project={PROJECT}",
                           f"provider.storage=gs://{BUCKET}/lab", f"job.data_dir={data}",
                           f"provider.ssh_key={write_ssh_key(tmp_path)}", "preflight=false",
                           "--detach", cwd=lab)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("detached: "))
        urls = layout.SweepUrls.parse(line.rsplit("its state in ", 1)[1])
        assert urls.sweep_id.startswith("mine-")
        objects = GcsStore().list(GcsUrl.parse(urls.root))
        assert {"submit/command.json", "submit/repo.tar.gz", "data/a.bin",
                "controller.json"} <= set(objects), objects
        assert any(n.startswith("submit/transient_orchestrator-") for n in objects), objects
        command = layout.Command.from_json(GcsStore().read_bytes(GcsUrl.parse(
            urls.child("submit", "command.json"))).decode())  # type: ignore[union-attr]
        assert f"job.data_dir={urls.data}" in command.overrides
        assert "preflight=false" in command.overrides
        assert not any(str(tmp_path) in a for a in command.overrides)  # nothing of this machine
        assert command.provider["ssh_key"] is None
        assert command.sweep_dir.startswith("multirun/mine/")
        (vm,) = fake.live_instances()
        assert vm.name == command.controller_vm and vm.body["labels"]["role"] == "controller"
        # the next zone of its region, recorded where the agent reads it
        assert vm.zone == command.controller_zone == "us-west1-a", vm.zone
        assert "uploaded " in done.stdout and "status " + urls.sweep_id in done.stdout
        # the index: the sweep by its id, from where it was submitted
        status = subprocess.run([sys.executable, "-m", "orchestrator.controller", "status",
                                 urls.sweep_id], cwd=lab, capture_output=True, text=True,
                                env={**os.environ, "XDG_CACHE_HOME": str(lab / "cache")},
                                timeout=120)
        assert status.returncode == 0, status.stderr
        assert "submitted" in status.stdout, status.stdout


def test_resume_of_a_detached_sweep_by_its_url_refuses_while_its_controller_lives(
        tmp_path: Path) -> None:
    """`python -m orchestrator --resume gs://.../sweeps/<id>` is the controller's resume: with a
    controller heard from a moment ago it refuses in one line (two orchestrators never own
    one sweep), creating and deleting nothing."""
    import time as clock

    assert detached_resume(["x", "--resume", "gs://b/p/sweeps/s-1"]) == "gs://b/p/sweeps/s-1"
    assert detached_resume(["x", "--resume=multirun/a/b"]) is None
    with storage_emulator(), FakeGce(project=PROJECT) as fake:
        urls = layout.SweepUrls(f"gs://{BUCKET}/lab", "lab-20261129-000000-abcd")
        command = layout.Command(urls.sweep_id, ["+experiment=x"], "multirun/lab/x",
                                 {"name": "gce", "project": PROJECT,
                                  "api_endpoint": fake.endpoint, "credentials": "anonymous"},
                                 controller_vm="tc-x", controller_zone="us-west1-b")
        store = GcsStore()
        store.write_bytes(GcsUrl.parse(urls.child("submit", "command.json")),
                          command.to_json().encode())
        store.write_bytes(GcsUrl.parse(urls.child("controller.json")), layout.ControllerState(
            layout.RUNNING, clock.time(), vm="tc-x", zone="us-west1-b").to_json().encode())
        done = orchestrate("--resume", urls.root, cwd=tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert "is alive" in line and urls.sweep_id in line, done.stderr
        assert fake.operations == {} and not (tmp_path / "multirun").exists()
