"""The local backend with real subprocesses: ports, start/stop, revoke, release, parent death."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provisioning import (
    PREEMPTION_NOTICE_ENV,
    BadRequestError,
    ClusterRequest,
    HostLostError,
    HostSpec,
    HostState,
    Role,
    get_provider,
    provider_names,
)
from provisioning.journal import Journal, list_group_members, list_unreleased
from provisioning.local import LocalProvider

REPO_ROOT = Path(__file__).resolve().parents[2]
GONE_TIMEOUT_S = 5.0
SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
# Ignores SIGTERM and keeps a grandchild in its process group: only a group SIGKILL ends both.
STUBBORN = [
    sys.executable,
    "-c",
    textwrap.dedent(
        """
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("up", flush=True)
        time.sleep(60)
        """
    ),
]


def make_request(tmp_path: Path, workers: int = 2) -> ClusterRequest:
    hosts = [HostSpec("ps0", Role.PS), HostSpec("chief", Role.CHIEF)]
    hosts += [HostSpec(f"w{i}", Role.WORKER, transient=True) for i in range(workers)]
    return ClusterRequest(run_id="run1", hosts=hosts, workdir=tmp_path)


def wait_gone(pgids: list[int], timeout_s: float = GONE_TIMEOUT_S) -> list[int]:
    """Pgids that still have live members after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [g for g in pgids if list_group_members(g)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.fixture
def provider():
    p = LocalProvider()
    yield p
    for runner in p._runners.values():  # whatever a failing test left behind
        runner.stop_all(grace_s=0.1)


def test_acquire_gives_distinct_free_ports_and_workdirs(provider, tmp_path):
    cluster = provider.acquire(make_request(tmp_path, workers=3))
    other = provider.acquire(ClusterRequest("run2", [HostSpec("w0", "worker")], tmp_path / "other"))
    hosts = cluster.hosts + other.hosts
    ports = [h.port for h in hosts]
    assert len(set(ports)) == len(ports)
    assert len({h.id for h in hosts}) == len(hosts)
    for host in hosts:
        assert host.address == "127.0.0.1" and host.state is HostState.RUNNING
        assert host.workdir.is_dir()
        with socket.socket() as sock:
            sock.bind((host.address, host.port))  # free: the trainer will be able to bind it
    assert [cluster.index_of(h) for h in cluster.hosts_for(Role.WORKER)] == [0, 1, 2]
    assert cluster.endpoints("ps") == [f"127.0.0.1:{cluster.hosts[0].port}"]


def test_start_pipes_stdout_logs_stderr_and_stop_all_reaps(provider, tmp_path):
    cluster = provider.acquire(make_request(tmp_path))
    runner = provider.runner(cluster.hosts[0])
    log = tmp_path / "logs" / "ps-0.log"
    argv = [
        sys.executable,
        "-c",
        "import os, sys, time; print('oops', file=sys.stderr, flush=True);"
        "print(os.getcwd(), os.environ['X'], flush=True); time.sleep(60)",
    ]
    process = runner.start(argv, env={"X": "42"}, log_path=log)
    assert process.readline().split() == [str(cluster.hosts[0].workdir), "42"]
    assert process.poll() is None
    assert os.getpgid(process.pid) == process.pid  # its own process group
    runner.stop_all(grace_s=2)
    assert process.poll() == -signal.SIGTERM
    assert "oops" in log.read_text()
    assert not list_group_members(process.pid)
    runner.stop_all()  # idempotent
    with pytest.raises(TimeoutError):
        runner.start(SLEEPER).wait(0.05)


def test_stop_all_kills_what_ignores_sigterm_and_its_group(provider, tmp_path):
    cluster = provider.acquire(make_request(tmp_path))
    runner = provider.runner(cluster.hosts[0])
    process = runner.start(STUBBORN)
    assert process.readline() == "up\n"
    runner.stop_all(grace_s=0.3)
    assert process.poll() == -signal.SIGKILL
    assert wait_gone([process.pid]) == []


def test_revoke_sigkills_and_poll_reports_revoked(provider, tmp_path):
    cluster = provider.acquire(make_request(tmp_path))
    worker = cluster.hosts_for(Role.WORKER)[1]
    runner = provider.runner(worker)
    process = runner.start(STUBBORN)
    assert process.readline() == "up\n"
    provider.revoke(worker)
    assert process.poll() == -signal.SIGKILL
    assert wait_gone([process.pid]) == []
    states = provider.poll(cluster)
    assert states[worker.id] is HostState.REVOKED
    assert [s for h, s in states.items() if h != worker.id] == [HostState.RUNNING] * 3
    assert not runner.alive()
    with pytest.raises(HostLostError):
        runner.start(SLEEPER)


def test_revoke_with_notice_writes_notice_then_kills(provider, tmp_path):
    cluster = provider.acquire(make_request(tmp_path))
    worker = cluster.hosts_for(Role.WORKER)[0]
    runner = provider.runner(worker)
    reader = "import os, time; print(os.environ[%r], flush=True); time.sleep(60)"
    process = runner.start([sys.executable, "-c", reader % PREEMPTION_NOTICE_ENV])
    notice_path = Path(process.readline().strip())
    before = time.time()
    provider.revoke(worker, notice_s=0.5)
    notice = json.loads(notice_path.read_text())
    assert notice["host_id"] == worker.id
    assert before + 0.4 < notice["deadline"] < before + 1.5
    assert provider.poll(cluster)[worker.id] is HostState.RUNNING
    assert process.wait(3) == -signal.SIGKILL
    time.sleep(0.1)
    assert provider.poll(cluster)[worker.id] is HostState.REVOKED


def test_release_is_idempotent_and_leaves_no_process(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    provider = LocalProvider(journal=journal, stop_grace_s=0.3)
    cluster = provider.acquire(make_request(tmp_path))
    processes = [provider.runner(h).start(STUBBORN) for h in cluster.hosts]
    for process in processes:
        assert process.readline() == "up\n"
    pgids = [p.pid for p in processes]
    assert all(list_group_members(g) for g in pgids)
    provider.release(cluster)
    provider.release(cluster)
    assert wait_gone(pgids, timeout_s=0.5) == []
    assert set(provider.poll(cluster).values()) == {HostState.TERMINATED}
    assert list_unreleased(journal.path) == []


def test_replace_gives_new_host_in_the_same_slot(tmp_path):
    provider = LocalProvider(provision_delay_s=0.2)
    cluster = provider.acquire(make_request(tmp_path))
    lost = cluster.hosts_for(Role.WORKER)[0]
    process = provider.runner(lost).start(SLEEPER)
    provider.revoke(lost)
    started = time.monotonic()
    new_cluster = provider.replace(cluster, [lost.id])
    assert time.monotonic() - started >= 0.2
    new = new_cluster.hosts_for(Role.WORKER)[0]
    # same endpoint: TF's cluster spec is fixed, a worker rejoins at its old address
    assert new.id != lost.id and new.endpoint == lost.endpoint and new.spec == lost.spec
    assert new_cluster.index_of(new) == 0
    assert [h.id for h in new_cluster.hosts if h.id != new.id] == [
        h.id for h in cluster.hosts if h.id != lost.id
    ]
    assert provider.poll(cluster)[lost.id] is HostState.REVOKED
    assert set(provider.poll(new_cluster).values()) == {HostState.RUNNING}
    assert process.poll() == -signal.SIGKILL
    assert provider.runner(new).start(SLEEPER).poll() is None
    with pytest.raises(KeyError):
        provider.replace(new_cluster, ["no-such-host"])
    provider.release(new_cluster)


PARENT_SCRIPT = """
import json, sys, time
from pathlib import Path
from provisioning import ClusterRequest, HostSpec, get_provider
provider = get_provider("local")
request = ClusterRequest("orphans", [HostSpec("ps0", "ps"), HostSpec("w0", "worker")],
                         Path(sys.argv[1]))
cluster = provider.acquire(request)
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
pids = [provider.runner(h).start(sleeper).pid for h in cluster.hosts]
print(json.dumps(pids), flush=True)
time.sleep(60)
"""


def test_grandchildren_die_when_the_orchestrator_is_sigkilled(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        pids = json.loads(parent.stdout.readline())
        assert len(pids) == 2 and all(list_group_members(p) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone(pids) == []


def test_registry_selects_by_name_and_lists_valid_names():
    assert "local" in provider_names()
    provider = get_provider("local", provision_delay_s=1.0)
    assert isinstance(provider, LocalProvider) and provider.name == "local"
    with pytest.raises(BadRequestError, match=r"unknown provider 'gcp' \(.*local.*\)"):
        get_provider("gcp")
    with pytest.raises(BadRequestError, match=r"provider\.zone: not an option of provider .local."):
        get_provider("local", zone="us-west1-b")


def test_bad_requests_name_the_field(tmp_path):
    with pytest.raises(BadRequestError, match="role: unknown role 'boss'"):
        HostSpec("x", "boss")
    with pytest.raises(BadRequestError, match="hosts: duplicate names"):
        ClusterRequest("r", [HostSpec("a", "ps"), HostSpec("a", "worker")], tmp_path)
    with pytest.raises(BadRequestError, match="hosts: must name at least one host"):
        ClusterRequest("r", [], tmp_path)
    assert not HostState.RUNNING.is_terminal() and HostState.REVOKED.is_terminal()
