"""The user's commands for a detached sweep (``python -m orchestrator.controller``) and the
sweep folder's mirror, against the GCS emulator and the fake Compute API.

The sweep folder is a real one: a simulated sweep (``provider=sim``, two points, seconds) run
once per module, pushed to the emulator as the controller pushes it; the controller's records
(``command.json``, ``controller.json``, ``console.log``) are written as the agent writes them.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.controller import __main__ as cli
from orchestrator.controller import index, layout
from orchestrator.controller.mirror import SweepMirror, mirrored
from provisioning.gce.config import CREDENTIALS_ANONYMOUS, TOOL_LABEL
from provisioning.gce.storage import GcsStore, GcsUrl, store_for_provider
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    BUCKET,
    PROJECT,
    ZONES,
    fake_fixture,
    storage_emulator,
)

# with the detached sweeps (make gce-fake): real command processes against the emulator,
# kept out of make test's 25 minutes and off its most loaded moments
pytestmark = pytest.mark.headline

SWEEP_ID = "icac19-k80-20261129-002233-ab12"
SWEEP_DIR = "multirun/icac19-k80/20261129-002233-ab12"
CONSOLE = b"[1/2] started\ncompleted icac19_k80: 64000 steps\n[2/2] started\n"
ZONE = ZONES[0]
CONTROLLER_VM = "tc-icac19-k80-ab12"


@pytest.fixture(scope="module")
def sim_sweep(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-point simulated sweep (1 and 2 workers)."""
    folder = tmp_path_factory.mktemp("sim") / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "-m", "+experiment=icac19_k80", "provider=sim",
         "cluster.workers=1,2", f"hydra.sweep.dir={folder}"], cwd=repo_root,
        env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert (folder / "runs.csv").is_file() and (folder / "1" / "summary.json").is_file()
    return folder


@pytest.fixture(name="bucket")
def bucket_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GcsStore]:
    """The emulator, and this machine's sweep index in the test's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with storage_emulator():
        yield store_for_provider({"project": PROJECT})  # the emulator: no credentials


def urls() -> layout.SweepUrls:
    return layout.SweepUrls(f"gs://{BUCKET}/lab", SWEEP_ID)


def url(*parts: str) -> GcsUrl:
    return GcsUrl.parse(urls().child(*parts))


def publish(store: GcsStore, folder: Path, fake: FakeGce | None = None,
            phase: str = layout.RUNNING, heard_s_ago: float = 1.0) -> SweepMirror:
    """What the user's side and the agent write: command, state, console, the folder."""
    provider = {"project": PROJECT, "zones": list(ZONES),  # anonymous: only with the fake
                "credentials": CREDENTIALS_ANONYMOUS if fake else "adc",
                "api_endpoint": fake.endpoint if fake else None, "poll_interval_s": 0.0,
                "retry_backoff_s": 0.01, "operation_timeout_s": 20.0, "storage": urls().storage}
    command = layout.Command(
        sweep_id=SWEEP_ID, overrides=["-m", "+experiment=icac19_k80", "provider=sim",
                                      "cluster.workers=1,2,4"],
        sweep_dir=SWEEP_DIR, provider=provider, submitted_by="me@laptop",
        submitted_at=time.time() - 600, controller_vm=CONTROLLER_VM, controller_zone=ZONE,
        controller_usd_per_hour=0.36)
    store.write_bytes(url(layout.SUBMIT, layout.COMMAND_FILE), command.to_json().encode())
    set_state(store, phase, heard_s_ago)
    store.write_bytes(url(layout.CONSOLE_FILE), CONSOLE)
    mirror = SweepMirror(store, folder, url(layout.MIRROR))
    mirror.push()
    return mirror


def set_state(store: GcsStore, phase: str, heard_s_ago: float = 1.0) -> None:
    now = time.time()
    store.write_bytes(url(layout.STATE_FILE), layout.ControllerState(
        phase, now - heard_s_ago, vm=CONTROLLER_VM, zone=ZONE, started=now - 500,
        exit_code=0 if phase == layout.DONE else None).to_json().encode())


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


def test_pull_gives_the_files_back_and_a_push_sends_only_what_changed(
        bucket: GcsStore, sim_sweep: Path, tmp_path: Path) -> None:
    folder = tmp_path / "controller" / "sweep"
    shutil.copytree(sim_sweep, folder)
    mirror = publish(bucket, folder)
    remote = bucket.list(url(layout.MIRROR))
    assert "0/events.jsonl" in remote and "runs.csv" in remote
    assert "0/run.lock" not in remote and "run.lock" not in remote  # an flock means nothing there

    dest = tmp_path / "laptop" / "sweep"
    pulled = SweepMirror(bucket, dest, url(layout.MIRROR)).pull(dest)
    original = {n: b for n, b in files(folder).items() if mirrored(n)}
    assert sorted(pulled) == sorted(original)
    got = files(dest)
    assert set(got) == set(original)
    for name, data in original.items():
        if name != "runs.csv":
            assert got[name] == data, name
    # runs.csv: the same rows, each run_dir naming the point's folder here
    with open(folder / "runs.csv", newline="") as a, open(dest / "runs.csv", newline="") as b:
        there, here = list(csv.DictReader(a)), list(csv.DictReader(b))
    assert [r["run_dir"] for r in here] == [str(dest / Path(r["run_dir"]).name) for r in there]
    assert [{k: v for k, v in r.items() if k != "run_dir"} for r in here] == \
        [{k: v for k, v in r.items() if k != "run_dir"} for r in there]
    assert SweepMirror(bucket, dest, url(layout.MIRROR)).pull(dest) == ["runs.csv"]

    with open(folder / "1" / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"time": time.time(), "kind": "note", "role": "orchestrator"}) + "\n")
    assert mirror.push() == ["1/events.jsonl"]
    assert mirror.push() == []
    (folder / "0" / "metrics.csv").unlink()  # gone here: gone there (a resume moves files)
    mirror.push()
    assert "0/metrics.csv" not in bucket.list(url(layout.MIRROR))
    assert SweepMirror(bucket, dest, url(layout.MIRROR)).pull(dest) == \
        ["1/events.jsonl", "runs.csv"]
    assert (dest / "1" / "events.jsonl").read_bytes() == \
        (folder / "1" / "events.jsonl").read_bytes()


def test_status_shows_each_point_with_its_steps(bucket: GcsStore, sim_sweep: Path,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "sweep"
    shutil.copytree(sim_sweep, folder)
    (folder / "1" / "summary.json").unlink()  # point 1 still runs: its events say how far
    publish(bucket, folder)
    assert cli.main(["status", str(urls())]) == 0
    out = capsys.readouterr().out
    assert f"sweep {SWEEP_ID}: running (heard" in out
    lines = {line.split(":")[0]: line for line in out.splitlines() if line.startswith("point")}
    assert "cluster.workers=1; completed; protocol asp; step 64000/64000" in lines["point 0"]
    assert "cluster.workers=2; running; protocol asp; step 64000/64000" in lines["point 1"]
    assert "cluster.workers=4; not started" in lines["point 2"]
    assert "$1.6557" in lines["point 0"]  # the point's summary's cost
    assert "1 of 3 point(s) ended" in out

    set_state(bucket, layout.RUNNING, heard_s_ago=120)
    assert cli.main(["status", str(urls())]) == 0
    out = capsys.readouterr().out
    assert re.search(f"sweep {SWEEP_ID}: unresponsive \\(last heard 12\\d s ago\\)", out)


def test_logs_and_pull_through_the_real_command_by_sweep_id(
        bucket: GcsStore, sim_sweep: Path, tmp_path: Path, repo_root: Path) -> None:
    folder = tmp_path / "controller"
    shutil.copytree(sim_sweep, folder)
    publish(bucket, folder, phase=layout.DONE)
    submitted_from = tmp_path / "repo"
    submitted_from.mkdir()
    index.remember(urls(), submitted_from)
    env = {**os.environ, "PYTHONPATH": str(repo_root)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestrator.controller", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)

    logs = run("logs", "-f", SWEEP_ID)  # the sweep is done: -f prints it all and ends
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == CONSOLE.decode()
    pull = run("pull", SWEEP_ID)
    assert pull.returncode == 0, pull.stderr
    dest = submitted_from / SWEEP_DIR  # where the attached sweep would have written it
    assert str(dest) in pull.stdout
    assert (dest / "1" / "summary.json").read_bytes() == \
        (folder / "1" / "summary.json").read_bytes()


def test_pull_waits_for_the_end_unless_partial(bucket: GcsStore, sim_sweep: Path,
                                               tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    publish(bucket, sim_sweep)
    assert cli.main(["pull", str(urls()), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pull: sweep") and "--partial" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert cli.main(["pull", str(urls()), str(tmp_path / "out"), "--partial"]) == 0
    assert (tmp_path / "out" / "runs.csv").is_file()


def test_cancel_of_a_silent_controller_deletes_the_sweeps_vms(
        bucket: GcsStore, fake: FakeGce, sim_sweep: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    publish(bucket, sim_sweep, fake, phase=layout.RUNNING, heard_s_ago=300)
    mine = {"tool": TOOL_LABEL, "sweep-id": SWEEP_ID}
    for name, labels in (("tp-w-0", mine), ("tp-w-1", mine), (CONTROLLER_VM, mine),
                         ("tp-other-0", {**mine, "sweep-id": "another-sweep"}),
                         ("unrelated", {"sweep-id": SWEEP_ID})):
        fake.insert(ZONE, {"name": name, "labels": labels}, None)
    assert cli.main(["cancel", str(urls()), "--wait", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"unresponsive \(last heard 30\d s ago\)", out)
    left = sorted(i.name for i in fake.live_instances())
    assert left == ["tp-other-0", "unrelated"]  # another sweep's, and no VM of this tool
    assert f"{ZONE}/{CONTROLLER_VM}" in out and f"{ZONE}/tp-w-0" in out
    assert out.index(f"{ZONE}/tp-w-1") < out.index(f"{ZONE}/{CONTROLLER_VM}")  # its last
    state = layout.ControllerState.from_json(bucket.read_bytes(url(layout.STATE_FILE)).decode())
    assert state.phase == layout.CANCELLED
    assert bucket.read_bytes(url(layout.CANCEL_FILE)) is not None  # a late controller sees it
    assert cli.main(["cancel", str(urls())]) == 0  # again: nothing left to do
    assert "already ended: cancelled" in capsys.readouterr().out


@pytest.mark.parametrize("sweep", ["Not_an_id", "never-submitted-here",
                                   "gs://lab-bucket/lab/runs/x",
                                   f"gs://{BUCKET}/lab/sweeps/nothing-there"])
def test_a_bad_sweep_is_one_line_and_exit_2(bucket: GcsStore, sweep: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", sweep]) == 2
    err = capsys.readouterr().err
    assert err.startswith("status: ") and err.count("\n") == 1


def test_follow_prints_the_console_as_it_grows_until_the_end(bucket: GcsStore,
                                                             sim_sweep: Path) -> None:
    import io

    publish(bucket, sim_sweep)
    sweep = cli.open_sweep(str(urls()))
    more = [b"[2/2] ended: completed\n", b"sweep done\n"]

    def sleep(_: float) -> None:  # the controller goes on between two polls
        console = bucket.read_bytes(url(layout.CONSOLE_FILE)) or b""
        bucket.write_bytes(url(layout.CONSOLE_FILE), console + more.pop(0))
        if not more:
            set_state(bucket, layout.DONE)

    out = io.BytesIO()
    state = cli.follow(sweep, 0, out, poll_s=0.0, sleep=sleep)
    assert state is not None and state.phase == layout.DONE
    assert out.getvalue() == CONSOLE + b"[2/2] ended: completed\nsweep done\n"  # each byte once

    set_state(bucket, layout.RUNNING, heard_s_ago=120)  # a dead controller: stop following
    with pytest.raises(cli.Failed, match=f"unresponsive .*resume {SWEEP_ID} continues"):
        cli.follow(sweep, 0, io.BytesIO(), poll_s=0.0, sleep=sleep)


def interrupted(verb: str, cwd: Path, repo_root: Path) -> tuple[int, str, str]:
    """Run a following command (`attach`, `logs -f`) as the user does and press Ctrl-C once
    it has printed the console: (exit code, stdout, stderr)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.controller", *verb.split(), str(urls())], cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(repo_root)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        # Ctrl-C must reach it even when the tests run in the background of a non-interactive
        # shell (which ignores SIGINT, and children inherit that: Python then keeps it ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = [proc.stdout.readline() for _ in CONSOLE.splitlines()]  # type: ignore[union-attr]
        assert "".join(seen) == CONSOLE.decode()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)  # a loaded machine's exit
    finally:
        proc.kill()
    return proc.returncode, out, err


def test_attach_detaches_on_ctrl_c_and_the_sweep_goes_on(
        bucket: GcsStore, sim_sweep: Path, tmp_path: Path, repo_root: Path) -> None:
    import threading

    publish(bucket, sim_sweep, heard_s_ago=0.0)
    stop = threading.Event()

    def controller() -> None:  # its heartbeat, however long a loaded machine takes
        while not stop.wait(1.0):
            set_state(bucket, layout.RUNNING, 0.0)

    beating = threading.Thread(target=controller, daemon=True)
    beating.start()
    try:
        code, out, err = interrupted("attach", tmp_path, repo_root)
        assert code == 0, err
        assert f"detached: the sweep goes on (python -m orchestrator.controller attach " \
            f"{SWEEP_ID}" in out and "Traceback" not in err
        code, out, err = interrupted("logs -f", tmp_path, repo_root)
        assert (code, out, err) == (130, "", "")  # quietly
    finally:
        stop.set()
        beating.join(10)
    assert bucket.read_bytes(url(layout.CANCEL_FILE)) is None  # never stops the sweep
    state = layout.ControllerState.from_json(bucket.read_bytes(url(layout.STATE_FILE)).decode())
    assert state.phase == layout.RUNNING


def test_cancel_waits_for_a_controller_that_answers(
        bucket: GcsStore, fake: FakeGce, sim_sweep: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import threading

    publish(bucket, sim_sweep, fake, heard_s_ago=0.0)
    fake.insert(ZONE, {"name": CONTROLLER_VM, "labels": {"tool": TOOL_LABEL}}, None)
    stop = threading.Event()

    def controller() -> None:  # the agent's side: the cancel object -> the sweep stops
        while not stop.wait(0.2):
            if bucket.read_bytes(url(layout.CANCEL_FILE)) is not None:
                set_state(bucket, layout.CANCELLED)
                return
            set_state(bucket, layout.RUNNING, 0.0)  # its heartbeat

    agent = threading.Thread(target=controller, daemon=True)
    agent.start()
    try:
        assert cli.main(["cancel", str(urls()), "--wait", "120"]) == 0
    finally:
        stop.set()
        agent.join(10)
    out = capsys.readouterr().out
    assert f"sweep {SWEEP_ID}: cancelled" in out and "deleting the sweep's VMs" not in out
    assert not fake.live_instances()  # the controller's VM too, had it not deleted itself
