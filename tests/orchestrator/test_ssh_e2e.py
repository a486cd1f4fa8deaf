"""End to end over SSH: the real CLI trains digits on isolated hosts (tests/testbed/isolated.py):
machines that share nothing with this one but its kernel (their own root filesystem, pid, mount
and network namespaces, sshd as their only service, a non-root user with sudo).

`+experiment=ssh_digits` with a provider file written for the bed: ps-0 with the chief and the
evaluator colocated on machine h0, workers on h1 and h2, h3 a spare. The hosts boot from the
image `python -m orchestrator.image bake` makes (tests/testbed/baked.py, cached on this machine):
Debian 13's Python 3.13 with the hosts' runtime installed under the image's root
(/var/tmp/transient, user `transient`), so setup only sends and unpacks our wheel, and the roles
import the trainer from it. No `python:` in the inventory; the hosts reach no package index.

Faults: a worker's link cut or its machine frozen mid-run (the cluster shrinks and finishes;
the closing line names what it could not stop, and those roles end by themselves once back),
the PS machine powered off (its whole pid namespace killed, sshd included: restart from the
latest checkpoint on the spare) or frozen, the orchestrator SIGKILLed (then `python -m
orchestrator.release` leaves nothing on any host), a machine that hangs at the start (one line
within the connection timeout, nothing left).
"""

# ruff: noqa: F811  (the bed fixtures are imported, then requested by name)
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

from orchestrator.runtime.deploy import role_lease_s
from tests.orchestrator.test_run_local import check_run_dir, read_events
from tests.testbed.baked import BakedRuntime
from tests.testbed.fixtures import write_provider_file
from tests.testbed.isolated import IsolatedHost, IsolatedTestBed
from tests.testbed.isolated_fixtures import baked_runtime, module_isolated_bed  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
# preflight (one local TF step before provisioning) is tested on its own; here it only costs time
SMALL = ["job.train_steps=400", "job.checkpoint_frequency=100", "job.eval_frequency=200",
         "progress=false", "preflight=false"]
RUN_TIMEOUT_S = 420
EVENT_WAIT_S = 240
# A lost machine is declared lost ~13 s after it stops answering (heartbeat 2 s + 6 s, then
# GRACES' 5 s while the others answer); the survivor alone must still have well over that much
# work left, even on a quiet fast machine (~100 steps/s), or the run completes before the loss
# is seen (CI, 2026-11-25).
LOSS_STEPS = 3200


HOSTS = 4  # h0: ps-0, chief, evaluator; h1, h2: workers; h3: the spare


@pytest.fixture(scope="module")
def bed(module_isolated_bed: IsolatedTestBed, baked_runtime: BakedRuntime) -> IsolatedTestBed:
    """This module's bed: 4 hosts of the baked image, the login user its `transient`."""
    key = module_isolated_bed.client_key.with_suffix(".pub").read_text()
    for _ in range(HOSTS):
        module_isolated_bed.add_host(disk=baked_runtime.disk, accounts={baked_runtime.user: key})
    return module_isolated_bed


@pytest.fixture(autouse=True)
def no_role_outlives_its_test(bed: IsolatedTestBed):
    """Whatever a test leaves on the bed's hosts (a frozen machine's roles after a failed
    assertion, a machine left off or cut) is undone, so that one failure cannot cascade into
    the next test."""
    yield
    for host in bed.hosts:
        if not host.running:
            bed.start(host)  # powered on again, from its own disk
        bed.restore(host)
        bed.thaw(host)
        for pid in bed.role_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


#: The fault tests' graces: a machine silent while others answer is lost after 5 s (the faults
#: below are machines that do not come back), and the roles' lease follows the longest grace.
GRACES = {"unreachable_grace_s": 5.0, "outage_grace_s": 20.0}
ROLE_LEASE_S = role_lease_s(max(GRACES.values()))


def provider_dir(bed: IsolatedTestBed, root: str, tmp_path: Path, **options: object) -> Path:
    """A Hydra search dir holding `provider/testbed.yaml`: the bed's 4 hosts, the last a spare,
    each with the image's root (no `python`: the hosts' own interpreter and runtime)."""
    hosts = bed.inventory(bed.hosts[:HOSTS])
    for i, entry in enumerate(hosts):
        entry.update(root=root, spare=i == HOSTS - 1)
    return write_provider_file(tmp_path / "conf", "testbed", {
        "hosts": hosts, "known_hosts": str(bed.known_hosts), "stop_grace_s": 1.0,
        **GRACES, **options})


def start_run(repo_root: Path, bed: IsolatedTestBed, baked: BakedRuntime, tmp_path: Path,
              *extra: str, **options: object) -> tuple[subprocess.Popen[str], Path]:
    run_dir = tmp_path / "run"
    overridden = {item.split("=")[0] for item in extra}
    small = [item for item in SMALL if item.split("=")[0] not in overridden]
    argv = [sys.executable, "-m", "orchestrator", "+experiment=ssh_digits", "provider=testbed",
            *small, *extra,
            f"hydra.searchpath=[file://{provider_dir(bed, baked.root, tmp_path, **options)}]",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(argv, cwd=repo_root, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, run_dir


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"run did not finish in {RUN_TIMEOUT_S} s:\n{out[-4000:]}")
    return out


def wait_for(run_dir: Path, predicate, what: str) -> dict:
    """The first event satisfying `predicate` (the run is live, the file grows)."""
    deadline = time.monotonic() + EVENT_WAIT_S
    while time.monotonic() < deadline:
        path = run_dir / "events.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if predicate(event):
                    return event
        time.sleep(0.2)
    pytest.fail(f"no {what} event within {EVENT_WAIT_S} s")


def completed(proc: subprocess.Popen[str], out: str, run_dir: Path) -> tuple[dict, list[dict]]:
    """The summary and events of a run that must have completed."""
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    return summary, read_events(run_dir)


def step_at_least(n: int):
    return lambda e: e.get("kind") == "step" and e.get("step", 0) >= n


def wait_for_closures_settled(run_dir: Path) -> None:
    """Wait until the chief has chosen its steps per closure and, if more than one, finished
    tracing the unrolled closure (in the background, on every worker). A worker that hangs
    during that trace stalls the chief until gRPC keepalive gives up on it (391 s, seen on
    2026-11-25 with the worker frozen 1 s after the choice): a trainer limitation of its own,
    not what the tests below inject their faults into."""
    chosen = wait_for(run_dir, lambda e: e.get("kind") == "steps_per_closure",
                      "steps_per_closure")
    if chosen["steps"] > 1:
        wait_for(run_dir, lambda e: e.get("kind") == "closure_unrolled", "closure_unrolled")


def assert_nothing_left(bed: IsolatedTestBed, hosts: list[IsolatedHost]) -> None:
    # a role that release stopped may take a while to be reaped on a loaded machine; waiting
    # longer costs nothing when nothing is left (it returns as soon as the hosts are clean).
    # After a drop of our network this includes the dead connection's SFTP server, which the
    # host's sshd would keep for hours: the reconnected machine ends that session.
    left = bed.processes_left(hosts, within_s=30)
    assert left == {h.name: [] for h in hosts}, {
        name: [_cmdline(pid) for pid in pids] for name, pids in left.items() if pids}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return f"{pid} (gone)"


def assert_no_key_material(bed: IsolatedTestBed, run_dir: Path) -> None:
    secret = [ln for ln in bed.client_key.read_text().splitlines()
              if ln and not ln.startswith("-----")]
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 50_000_000:
            text = path.read_bytes().decode(errors="replace")
            for line in secret:
                assert line not in text, f"key material in {path}"


def test_digits_over_ssh_matches_a_local_run(repo_root: Path, bed: IsolatedTestBed,
                                             baked_runtime: BakedRuntime,
                                             tmp_path: Path) -> None:
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path)
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    summary = check_run_dir(run_dir)  # the local run's checks: same files, schema, accuracy
    assert summary["provider"] == "ssh"
    provisioned = next(e for e in read_events(run_dir) if e["kind"] == "provisioned")
    addresses = {h.name: h.address for h in bed.hosts}
    hosts = dict(item.split("=") for item in provisioned["hosts"])
    assert hosts["ps-0"].split(":")[0] == addresses["h0"]
    assert hosts["chief-0"].split(":")[0] == addresses["h0"] != hosts["worker-0"].split(":")[0]
    assert len({hosts["ps-0"], hosts["chief-0"], hosts["evaluator-0"]}) == 3  # own ports
    # the wheel unpacked on the host's own disk beside the image's venv; nothing of this
    # machine visible there
    envs = f"{baked_runtime.root}/envs"
    listed = bed.ssh(bed.hosts[1], f"ls -d {envs}/*/site/trainer {envs}/venv-*/venv/bin/python")
    assert listed.returncode == 0 and len(listed.stdout.split()) == 2, listed
    for path in (repo_root, Path(sys.prefix)):
        assert bed.ssh(bed.hosts[1], f"test -e {path}").returncode == 1, path
    assert_no_key_material(bed, run_dir)
    assert_nothing_left(bed, bed.hosts[:4])


@pytest.mark.outage  # a host's link cut or its machine frozen: minutes, run by make test-outage
@pytest.mark.parametrize("fault", ["cut_link", "freeze"])
def test_lost_worker_machine_shrinks_and_completes(repo_root: Path, bed: IsolatedTestBed,
                                                   baked_runtime: BakedRuntime,
                                                   tmp_path: Path, fault: str) -> None:
    """A worker machine whose link is cut (packets vanish) or that hangs (every process,
    sshd included, SIGSTOPped: TCP stays up, nothing answers) is lost like a revoked one."""
    worker_host = bed.hosts[2]  # worker-1
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path,
                              f"job.train_steps={LOSS_STEPS}")
    try:
        wait_for(run_dir, step_at_least(100), "step >= 100")
        wait_for_closures_settled(run_dir)
        (bed.cut if fault == "cut_link" else bed.freeze)(worker_host)
        out = finish(proc)
    finally:
        (bed.restore if fault == "cut_link" else bed.thaw)(worker_host)
    summary, events = completed(proc, out, run_dir)
    assert summary["restarts"] == 0 and summary["final_accuracy"] >= 0.9
    lost = [e for e in events if e["kind"] in ("revocation", "server_failure")]
    assert [e.get("role") for e in lost] == ["worker"], lost  # only the cut worker was lost
    assert any(e["kind"] == "recovery_start" for e in events)
    # The run could not stop the lost machine's roles: its closing line says so, and how.
    said = " ".join(out.split())  # (a line wrapped where the output is not a terminal)
    assert f"not confirmed stopped: run python -m orchestrator.release {run_dir}" in said, out
    # Once the machine is back, its roles end by themselves: nobody renews their lease (the
    # orchestrator is gone), so they exit within its term of the last renewal.
    left = bed.processes_left([worker_host], within_s=ROLE_LEASE_S + 30)
    assert left == {worker_host.name: []}, left
    subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir)], cwd=repo_root,
                   env=ENV, check=True, capture_output=True, timeout=120)
    assert_nothing_left(bed, bed.hosts[:4])


@pytest.mark.outage
@pytest.mark.parametrize("drop_s", [20, 120])
def test_a_drop_of_the_orchestrators_network_costs_nothing(
        repo_root: Path, bed: IsolatedTestBed, baked_runtime: BakedRuntime, tmp_path: Path,
        drop_s: int) -> None:
    """The orchestrator's own network gone for 20 s or 120 s mid-training (its address on the
    bed's bridge removed: nothing reaches the hosts from here, nor here from them, while the
    hosts still reach each other): training goes on on the hosts, every connection is
    re-established once the network is back and every role's output is read on from where it
    was. The run completes with its exact step count, no restart, no lost step, no loss, and
    nothing is left. With the default graces (60 s alone, 300 s for an outage)."""
    steps = 3000
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path, f"job.train_steps={steps}",
                              unreachable_grace_s=60.0, outage_grace_s=300.0)
    try:
        wait_for(run_dir, step_at_least(100), "step >= 100")
        wait_for_closures_settled(run_dir)
        dropped = time.time()
        bed.drop_orchestrator()
        time.sleep(drop_s)
        bed.restore_orchestrator()
        restored = time.time()
        out = finish(proc)
    finally:
        bed.restore_orchestrator()
    summary, events = completed(proc, out, run_dir)
    # the hosts trained on meanwhile (the roles' own clocks; the bed shares this kernel's)
    assert any(e["kind"] == "step" and dropped + 1 < e["role_time"] < restored - 1
               for e in events), "no training step during the drop"
    assert summary["global_steps"] == steps, summary
    assert summary["restarts"] == 0 and summary["lost_steps"] == 0, summary
    assert summary["revocations"] == 0 and summary["recoveries"] == 0, summary
    assert summary["final_accuracy"] >= 0.9, summary
    kinds = {e["kind"] for e in events}
    assert not kinds & {"revocation", "server_failure", "recovery_start", "restart"}, kinds
    said = " ".join(out.split())
    assert "unreachable" in said and "reachable again" in said, out[-3000:]
    assert_nothing_left(bed, bed.hosts[:4])


@pytest.mark.outage
def test_an_outage_past_the_grace_stops_resumable_and_resume_completes(
        repo_root: Path, bed: IsolatedTestBed, baked_runtime: BakedRuntime,
        tmp_path: Path) -> None:
    """The orchestrator's network gone for longer than `provider.outage_grace_s`: no restart
    is spent on machines it cannot reach; the run stops `interrupted` with one line saying
    what happened and that `--resume` continues, which it then does (the roles it could not
    stop are cleaned up first), to the exact step count, leaving nothing."""
    steps = 3000
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path, f"job.train_steps={steps}",
                              "job.checkpoint_frequency=200", outage_grace_s=15.0)
    try:
        wait_for(run_dir, lambda e: e.get("kind") == "checkpoint" and e.get("step", 0) > 0,
                 "checkpoint")
        bed.drop_orchestrator()
        try:
            out = finish(proc)
        finally:
            bed.restore_orchestrator()
    finally:
        bed.restore_orchestrator()
    assert proc.returncode != 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert summary["restarts"] == 0, summary
    said = " ".join(out.split())
    assert "lost contact with every machine" in said and "--resume" in said, out[-3000:]
    resumed = subprocess.run([sys.executable, "-m", "orchestrator", "--resume", str(run_dir)],
                             cwd=repo_root, env=ENV, capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_steps"] == steps, summary
    assert_nothing_left(bed, bed.hosts[:4])


@pytest.mark.outage
@pytest.mark.parametrize("fault", ["killed", "freeze"])
def test_lost_ps_machine_restarts_from_checkpoint_on_the_spare(
        repo_root: Path, bed: IsolatedTestBed, baked_runtime: BakedRuntime, tmp_path: Path,
        fault: str) -> None:
    """The PS machine (ps, chief and evaluator) powered off, sshd included (on again from its
    disk once the run has ended), or frozen (every process SIGSTOPped until the run has
    ended): the run restarts on the spare from the latest checkpoint. A frozen machine's
    roles cannot be stopped: the closing line names them with the release command, and once
    thawed they end by themselves (their lease)."""
    ps_host, spare = bed.hosts[0], bed.hosts[3]
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path)
    try:
        wait_for(run_dir, lambda e: e.get("kind") == "checkpoint" and e.get("step", 0) > 0,
                 "checkpoint")
        deadline = time.monotonic() + EVENT_WAIT_S  # ...and it reached the orchestrator's store
        while not (run_dir / "checkpoints" / "checkpoint").exists():
            assert time.monotonic() < deadline, "no checkpoint synced to the run directory"
            time.sleep(0.2)
        if fault == "freeze":
            bed.freeze(ps_host)
        else:
            bed.stop(ps_host)  # powered off: sshd, PS, chief, evaluator die at once
        out = finish(proc)
    finally:
        (bed.thaw if fault == "freeze" else bed.start)(ps_host)
    summary, events = completed(proc, out, run_dir)
    assert summary["restarts"] == 1 and summary["final_accuracy"] >= 0.9
    starts = [e for e in events if e["kind"] == "train_start"]
    assert starts[-1].get("resumed_from") not in (None, 0), starts  # resumed from a checkpoint
    moved = [e for e in events if e["kind"] == "replacement_ready" and e.get("host") == "ps-0"]
    assert moved and moved[-1]["endpoint"].startswith(spare.address + ":"), moved  # the spare
    if fault == "freeze":
        said = " ".join(out.split())
        assert f"not confirmed stopped: run python -m orchestrator.release {run_dir}" in said, out
        left = bed.processes_left([ps_host], within_s=ROLE_LEASE_S + 30)
        assert left == {ps_host.name: []}, left  # thawed: ps, chief, evaluator ended by lease
    assert_nothing_left(bed, bed.hosts[:4])


def test_orchestrator_killed_then_release_leaves_nothing(repo_root: Path,
                                                        bed: IsolatedTestBed,
                                                        baked_runtime: BakedRuntime,
                                                        tmp_path: Path) -> None:
    proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path)
    wait_for(run_dir, step_at_least(50), "step >= 50")
    os.killpg(proc.pid, signal.SIGKILL)  # no finally, no teardown: only the journal remains
    proc.communicate()
    assert any(bed.role_pids(h) for h in bed.hosts[:3]), "nothing was running"
    result = subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir)],
                            cwd=repo_root, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_nothing_left(bed, bed.hosts[:4])
    again = subprocess.run([sys.executable, "-m", "orchestrator.release", str(run_dir)],
                           cwd=repo_root, env=ENV, capture_output=True, text=True, timeout=120)
    assert "0 resource(s)" in again.stdout, again.stdout  # idempotent


def test_machine_hanging_at_start_is_one_line_and_leaves_nothing(
        repo_root: Path, bed: IsolatedTestBed, baked_runtime: BakedRuntime,
        tmp_path: Path) -> None:
    """A machine that accepts TCP but whose sshd hangs (SIGSTOPped): the run fails before any
    role starts, with one line naming the machine, within about the connection timeout (no
    handshake retries for a host that does not answer), and leaves nothing on the others."""
    frozen = bed.hosts[2]
    bed.freeze(frozen)
    try:
        proc, run_dir = start_run(repo_root, bed, baked_runtime, tmp_path,
                                  "provider.connect_timeout_s=3")
        out = finish(proc)
    finally:
        bed.thaw(frozen)
    assert proc.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    # one handshake, given up after the timeout (retries would say "failed 4 times")
    # (paramiko's own words after it vary with timing: "No existing session", "Error reading
    # SSH protocol banner")
    assert summary["error"].startswith(f"SshUnreachableError: ssh host {frozen.name} "
                                       f"({frozen.user}@{frozen.address}:22) does not "
                                       "answer: no SSH "
                                       "handshake within 3 s ("), summary["error"]
    assert summary["error"] in " ".join(out.split())  # printed (wrapped to the terminal)
    assert "Traceback" not in out and "paramiko" not in out, out[-3000:]
    assert_nothing_left(bed, bed.hosts[:4])
