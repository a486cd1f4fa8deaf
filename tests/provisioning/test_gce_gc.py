"""`python -m orchestrator.gc` against the fake: orphans of a SIGKILLed orchestrator are deleted,
the VMs of a live run are kept.

On the shared-filesystem bed: the subject is the API's view (labels, leases, the journal), not
the hosts."""

# ruff: noqa: F811  (fixtures are imported, then requested by name)
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import gc
from provisioning.base import ClusterRequest, HostSpec, Role
from provisioning.gce.provider import GceProvider
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    PROJECT,
    ZONES,
    fake_fixture,
    gce_config,
    make_provider_fixture,
    processes_die_with_vm,
    small_request,
)
from tests.provisioning.test_gce_e2e import ENV, events
from tests.provisioning.test_gce_ssh import fake_on_bed
from tests.testbed import SshTestBed
from tests.testbed.fixtures import host_python, ssh_testbed  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

# An orchestrator stand-in: acquires a cluster through the real provider, then hangs until killed.
ORCHESTRATOR = """
import sys, time
from pathlib import Path
from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from tests.provisioning.gce_fixtures import small_request
endpoint, key, workdir = sys.argv[1:4]
cfg = GceConfig(project="test-project", zones=["us-central1-a"], api_endpoint=endpoint,
                credentials="anonymous", ssh_key=key, ready_poll_s=0.05, host_key_timeout_s=2)
GceProvider(cfg).acquire(small_request("killed-run", Path(workdir), workers=2))
print("acquired", flush=True)
time.sleep(600)
"""


def gc_args(fake: FakeGce, *extra: str) -> list[str]:
    return ["--project", PROJECT, "--api-endpoint", fake.endpoint, "--credentials",
            "anonymous", *extra]


def test_gc_deletes_orphans_of_a_killed_orchestrator_and_keeps_live_runs(
        fake: FakeGce, make_provider, tmp_path: Path, capsys) -> None:
    live_provider = make_provider()
    live_cluster = live_provider.acquire(small_request("live-run", tmp_path / "live", workers=1))
    key = gce_config(fake, tmp_path).ssh_key
    proc = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR, fake.endpoint, key,
                             str(tmp_path / "killed")], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "acquired"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    runs = {i.body["labels"]["run-id"] for i in fake.live_instances()}
    assert runs == {"live-run", "killed-run"}

    assert gc.main(gc_args(fake, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert out.count("would delete") == 3 and out.count("keeping") == 2
    assert len(fake.live_instances()) == 5  # dry run deleted nothing

    assert gc.main(gc_args(fake)) == 0
    assert {i.body["labels"]["run-id"] for i in fake.live_instances()} == {"live-run"}
    assert "3 deleted" in capsys.readouterr().out

    assert gc.main(gc_args(fake)) == 0  # idempotent: nothing left to delete
    assert "0 deleted" in capsys.readouterr().out
    live_provider.release(live_cluster)
    assert fake.live_instances() == []


def test_gc_without_credentials_says_how_to_authenticate(tmp_path: Path, capsys,
                                                        monkeypatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    assert gc.main(["--project", "p"]) == 2
    assert "gcloud auth application-default login" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_gc_cli_after_a_sigkilled_orchestrator_run_leaves_no_vm_and_no_process(
        ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    """The real thing: `python -m orchestrator provider=gce` runs roles on VMs of the fake (each
    a namespace host) and is SIGKILLed mid-run, once its servers serve; `python -m
    orchestrator.gc` (a subprocess, the CLI as documented) lists its VMs as orphans with
    `--dry-run` and deletes none, then deletes exactly those: the VMs of a live run (this
    process) and what runs on them are kept. A deleted VM takes its processes with it (the
    fake's `on_gone`), so afterwards no VM and no process is left on any host."""
    bed = ssh_testbed
    with fake_on_bed(bed, 3, project=PROJECT, zones=tuple(ZONES), provision_s=0.05,
                     staging_s=0.05, insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05,
                     wait_cap_s=0.2, on_gone=processes_die_with_vm(bed)) as fake:
        # A live run owned by this process: one VM with a role on it.
        cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"))
        live = GceProvider(cfg)
        live_cluster = live.acquire(ClusterRequest("live-run", [HostSpec(
            "ps-0", Role.PS, "n1-standard-4", None, ZONES[0])], tmp_path / "live"))
        live_role = live.runner(live_cluster.hosts[0]).start(
            ["sh", "-c", "echo up; exec sleep 3600"])
        assert live_role.readline().strip() == "up"
        run_dir = tmp_path / "killed"
        argv = [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "provider=gce",
                f"provider.api_endpoint={fake.endpoint}", "provider.credentials=anonymous",
                f"provider.project={PROJECT}", f"provider.zones=[{ZONES[0]}]",
                "provider.ssh_user=root", f"provider.ssh_key={bed.client_key}",
                f"provider.python={host_python()}", f"provider.remote_root={tmp_path / 'vms'}",
                "provider.ready_poll_s=0.1", "provider.host_key_poll_s=0.2",
                "cluster.workers=1", "job.train_steps=100000", "preflight=false",
                "progress=false", f"hydra.run.dir={run_dir}"]
        proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            # Its servers serve and the chief is starting: roles run on both of its VMs.
            while not any(e.get("kind") == "ready" for e in events(run_dir)):
                assert proc.poll() is None, (run_dir / "error.txt").read_text() \
                    if (run_dir / "error.txt").exists() else "orchestrator exited"
                assert time.monotonic() < deadline, "roles never ready"
                time.sleep(0.2)
        finally:
            proc.kill()  # SIGKILL: nothing is released
            proc.wait()  # reaped, so its pid is free (a zombie would look alive)
        killed = {i.ip for i in fake.live_instances()
                  if i.body["labels"]["run-id"] != "live-run"}
        assert len(killed) == 2, "the killed run's PS and worker VMs are still there"
        hosts = {h.address: h for h in bed.hosts}
        assert all(bed.role_pids(hosts[ip]) for ip in killed), "its roles still run"

        def gc(*extra: str) -> str:
            done = subprocess.run([sys.executable, "-m", "orchestrator.gc",
                                   *gc_args(fake, *extra)], cwd=REPO, env=ENV,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout

        out = gc("--dry-run")
        assert out.count("would delete") == 2 and out.count("keeping") == 1, out
        assert len(fake.live_instances()) == 3  # the dry run deleted nothing
        out = gc()
        assert out.count("deleting") == 2 and "2 deleted" in out, out
        assert [i.body["labels"]["run-id"] for i in fake.live_instances()] == ["live-run"]
        assert live_role.poll() is None, "the live run's role was stopped"
        deadline = time.monotonic() + 10
        while any(bed.role_pids(hosts[ip]) for ip in killed):
            assert time.monotonic() < deadline, "processes left on the orphans' hosts"
            time.sleep(0.2)
        live.release(live_cluster)
        assert fake.live_instances() == []
    for host in bed.hosts[:3]:
        assert bed.role_pids(host) == [], f"processes left on {host.name}"


def test_without_proc_a_live_owner_is_never_taken_for_gone(tmp_path: Path) -> None:
    """macOS has no /proc: liveness comes from os.kill(pid, 0), and a process that exists is
    the owner (start times cannot be compared), so gc never deletes a live run's VMs."""
    import socket

    from provisioning.gce.body import label_value
    from provisioning.gce.orphans import LIVE, ORPHAN, owner_status

    no_proc = tmp_path / "no-proc"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process now
    host = label_value(socket.gethostname())
    me = {"owner-host": host, "owner-pid": str(os.getpid()), "owner-start": "123"}
    gone = {"owner-host": host, "owner-pid": str(dead.pid), "owner-start": "123"}
    assert owner_status(me, proc_root=no_proc) == LIVE  # start time unknown: live
    assert owner_status(gone, proc_root=no_proc) == ORPHAN
    assert owner_status(me) == ORPHAN  # with /proc the wrong start time is a reused pid
    assert owner_status(gone) == ORPHAN
