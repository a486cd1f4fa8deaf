"""The controller's agent (`python -m orchestrator.controller.agent URL`) as a real process on
this machine, with the bucket on the GCS emulator and its own VM on the fake Compute API
(loopback). The sweep it runs is a simulated one (`provider=sim`, seconds): what is tested here
is the agent's part, not the cloud run (tests/provisioning/test_gce_detach.py runs that on
isolated VMs): the user's repository unpacked and used, the sweep folder and the console in the
bucket, the phases, `pull` giving back the very files, cancel, and the controller deleting its
own VM at the end.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from orchestrator.controller import layout
from provisioning.gce.body import LEASE_KEY
from provisioning.gce.storage import GcsStore, GcsUrl
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import BUCKET, PROJECT, ZONES, storage_emulator

# with the detached sweeps (make gce-fake): a real agent process per test, one of them over a
# TensorFlow run; kept out of make test's 25 minutes
pytestmark = [pytest.mark.slow, pytest.mark.headline]

REPO = Path(__file__).resolve().parents[2]
SWEEP_ID = "lab-k80-20261128-000000-abcd"
VM = f"tc-{SWEEP_ID}"


def user_repo_archive() -> bytes:
    """A user repository with one experiment of its own: the packaged K80 study, renamed."""
    text = (REPO / "experiments" / "icac19_k80.yaml").read_text()
    data = text.replace("name: icac19_k80", "name: lab_k80").encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("experiments/lab_k80.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def submitted(tmp_path: Path):
    """What `--detach` leaves in the bucket and the cloud: submit/, controller.json, the VM."""
    with storage_emulator(), FakeGce(project=PROJECT, zones=tuple(ZONES), provision_s=0.05,
                                     insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05,
                                     wait_cap_s=0.2) as fake:
        fake.insert(ZONES[0], {"name": VM, "machineType": f"zones/{ZONES[0]}/machineTypes/"
                               "e2-standard-2", "labels": {"role": "controller"}}, None)
        urls = layout.SweepUrls(f"gs://{BUCKET}/lab", SWEEP_ID)
        store = GcsStore()

        def submit(overrides: list[str]) -> layout.Command:
            command = layout.Command(
                sweep_id=SWEEP_ID, overrides=overrides,
                sweep_dir=f"multirun/lab_k80/{SWEEP_ID}",
                provider={"name": "gce", "project": PROJECT, "zones": list(ZONES),
                          "api_endpoint": fake.endpoint, "credentials": "anonymous",
                          "storage": urls.storage},
                controller_vm=VM, controller_zone=ZONES[0], controller_usd_per_hour=0.067)
            store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.COMMAND_FILE)),
                              command.to_json().encode())
            store.write_bytes(GcsUrl.parse(urls.child(layout.SUBMIT, layout.REPO_ARCHIVE)),
                              user_repo_archive())
            return command

        yield fake, urls, store, submit


def agent(urls: layout.SweepUrls, tmp_path: Path) -> subprocess.Popen[str]:
    env = {**__import__("os").environ, "TRANSIENT_CONTROLLER_DIR": str(tmp_path / "controller")}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.controller.agent", urls.root],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def read_state(store: GcsStore, urls: layout.SweepUrls) -> layout.ControllerState:
    text = store.read_bytes(GcsUrl.parse(urls.child(layout.STATE_FILE)))
    assert text is not None
    return layout.ControllerState.from_json(text.decode())


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_agent_runs_the_users_sweep_mirrors_it_and_deletes_its_vm(submitted,
                                                                      tmp_path: Path) -> None:
    fake, urls, store, submit = submitted
    command = submit(["+experiment=lab_k80", "-m", "cluster.workers=1,2", "provider=sim",
                      "progress=false"])
    proc = agent(urls, tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]

    state = read_state(store, urls)
    assert state.phase == layout.DONE and state.exit_code == 0, state
    # the controller's own sweep folder, in the user's experiment's name
    local = tmp_path / "controller" / SWEEP_ID / "repo" / command.sweep_dir
    assert (local / "runs.csv").is_file()
    assert "lab_k80" in (local / "0" / "config.yaml").read_text()
    cost = json.loads((local / layout.STATE_FILE).read_text())  # the controller's own bill
    assert cost["usd_per_hour"] == 0.067 and cost["cost_usd"] > 0 and cost["phase"] == "done"
    console = store.read_bytes(GcsUrl.parse(urls.child(layout.CONSOLE_FILE)))
    assert console and b"completed" in console, console
    # pull: the very files the controller wrote
    dest = tmp_path / "pulled"
    done = subprocess.run([sys.executable, "-m", "orchestrator.controller", "pull", urls.root,
                           str(dest)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    pulled, written = tree(dest), tree(local)
    assert "1/summary.json" in pulled and "1/events.jsonl" in pulled
    # byte for byte, but runs.csv: its run_dir column names the folder pulled into
    assert {k: v for k, v in written.items() if k in pulled and k != "runs.csv"} == \
        {k: v for k, v in pulled.items() if k != "runs.csv"}
    assert set(written) - set(pulled) <= {n for n in written if n.endswith(".lock")}
    rows = list(csv.DictReader(io.StringIO(pulled["runs.csv"].decode())))
    assert [Path(r["run_dir"]).parent for r in rows] == [dest, dest]
    # its last act: its own VM deleted
    deadline = time.monotonic() + 30
    while fake.live_instances() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fake.live_instances() == []


def test_a_bad_sweep_is_recorded_failed_with_its_console(submitted, tmp_path: Path) -> None:
    _, urls, store, submit = submitted
    submit(["+experiment=lab_k80", "provider=sim", "cluster.workers=0"])
    proc = agent(urls, tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-3000:]
    state = read_state(store, urls)
    assert state.phase == layout.FAILED and state.exit_code == 2, state
    console = store.read_bytes(GcsUrl.parse(urls.child(layout.CONSOLE_FILE))) or b""
    assert b"cluster.workers" in console, console


@pytest.mark.tf_cluster
def test_cancel_stops_the_sweep_and_records_it_cancelled(submitted, tmp_path: Path) -> None:
    """A real local TensorFlow run on the controller (the default experiment), far from done
    when `cancel` appears: the orchestrator gets its Ctrl-C, releases its processes, and the
    run is recorded interrupted; the controller says cancelled and deletes its VM."""
    fake, urls, store, submit = submitted
    submit(["job.train_steps=1000000", "progress=false", "preflight=false"])
    proc = agent(urls, tmp_path)
    try:
        deadline = time.monotonic() + 300
        while b'"kind": "step"' not in (store.read_bytes(GcsUrl.parse(
                f"{urls.mirror}/events.jsonl")) or b""):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no training step mirrored"
            time.sleep(1.0)
        store.write_bytes(GcsUrl.parse(urls.child(layout.CANCEL_FILE)), b"")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    state = read_state(store, urls)
    assert state.phase == layout.CANCELLED, (state, out[-3000:])
    summary = store.read_bytes(GcsUrl.parse(f"{urls.mirror}/summary.json"))
    assert summary is not None and b'"interrupted"' in summary, summary
    # it renewed its own VM's lease while it ran (a dead agent's VM ends itself)
    assert LEASE_KEY in fake.instances[(ZONES[0], VM)].metadata()
    assert fake.live_instances() == []
