"""`provider=ssh` against real sshd hosts in network namespaces (tests/testbed).

What the provider conformance suite does not cover: host-key policy, key refusal, unreachable
hosts, loss detection without TCP's help (cut link, frozen host), environment setup and its
cache, clean-up from the journal after a crash, and the config checks.

On the shared-filesystem bed (hosts that share this machine's files and pid table, declaring
this venv's interpreter) on purpose: the subject is the provider's side of the protocol, which
such a host exercises in full in seconds. The same faults on hosts that share nothing, from the
CLI, are tests/orchestrator/test_ssh_e2e.py; bare hosts setting themselves up,
tests/provisioning/test_bare_hosts.py.
"""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import base64
import contextlib
import ensurepip
import hashlib
import os
import posixpath
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from provisioning.base import (
    BadRequestError,
    ClusterRequest,
    ContactLostError,
    HostSpec,
    HostState,
)
from provisioning.host_runtime import HostRuntime
from provisioning.journal import Journal, list_unreleased, read_process_start_ticks
from provisioning.registry import get_provider
from provisioning.ssh.config import SshHostConfig, SshProviderConfig
from provisioning.ssh.connection import HostKeyError, SshUnreachableError
from provisioning.ssh.provider import PINNED_KEYS_FILE
from provisioning.ssh.setup import HOST_DIST, WheelCache, ensure_environment
from tests.testbed import SshTestBed
from tests.testbed.fixtures import provider_options, ssh_testbed  # noqa: F401

#: Generous bound for "reported within about 10 s" (the benchmark measures the real figure).
LOSS_BOUND_S = 30.0


def one_host_request(tmp_path: Path, name: str = "worker-0") -> ClusterRequest:
    return ClusterRequest(run_id=f"t{time.monotonic_ns()}", hosts=[HostSpec(name, "worker")],
                          workdir=tmp_path / "run")


def wait_state(provider, cluster, host_id: str, state: HostState, bound_s: float) -> float:
    start = time.monotonic()
    while provider.poll(cluster)[host_id] != state:
        assert time.monotonic() - start < bound_s, f"{host_id} not {state} after {bound_s} s"
        time.sleep(0.1)
    return time.monotonic() - start


# --- config -----------------------------------------------------------------------------------


def test_config_check_names_the_field_as_typed(tmp_path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    key = tmp_path / "key"
    key.write_text("not shown")
    cfg = SshProviderConfig(
        known_hosts=str(known), placement={"ps-0": "nowhere"},
        hosts=[SshHostConfig(name="a", address="10.0.0.1", key_path=str(key), python="python3"),
               SshHostConfig(name="b", address="10.0.0.2", key_path=str(tmp_path / "missing"),
                             python="python3")])
    problems = dict(cfg.check())
    assert "no such key file" in problems["provider.hosts.1.key_path"]
    assert "provider.hosts.0.key_path" not in problems
    assert "nowhere" in problems["provider.placement.ps-0"]
    empty = dict(SshProviderConfig(known_hosts=str(known)).check())
    assert "inventory is empty" in empty["provider.hosts"]


def test_wrong_key_path_is_a_bad_request_before_any_connection(tmp_path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    provider = get_provider("ssh", {
        "known_hosts": str(known),
        "hosts": [{"name": "a", "address": "10.231.255.1", "key_path": str(tmp_path / "nope"),
                   "python": "python3"}]})
    with pytest.raises(BadRequestError, match=r"provider\.hosts\.0\.key_path: no such key"):
        provider.acquire(one_host_request(tmp_path))


# --- host keys and authentication --------------------------------------------------------------


def test_unknown_host_key_is_rejected_by_default(ssh_testbed: SshTestBed, tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    provider = get_provider("ssh", provider_options(ssh_testbed, ssh_testbed.hosts[:1],
                                                    known_hosts=str(empty)))
    with pytest.raises(HostKeyError) as info:
        provider.acquire(one_host_request(tmp_path))
    message = str(info.value)
    assert "not in" in message and "\n" not in message
    assert ssh_testbed.role_pids(ssh_testbed.hosts[0]) == []


def test_first_use_pinning_records_the_key(ssh_testbed: SshTestBed, tmp_path) -> None:
    known = tmp_path / "known_hosts"
    host = ssh_testbed.hosts[0]
    provider = get_provider("ssh", provider_options(
        ssh_testbed, [host], known_hosts=str(known), trust_on_first_use=True))
    request = one_host_request(tmp_path)
    cluster = provider.acquire(request)
    try:
        assert host.address in known.read_text()
        pinned = (request.workdir / PINNED_KEYS_FILE).read_text()
        assert "SHA256:" in pinned and host.address in pinned
    finally:
        provider.release(cluster)


def test_changed_host_key_is_refused_with_one_line(ssh_testbed: SshTestBed, tmp_path) -> None:
    host = ssh_testbed.add_host()
    ssh_testbed.change_host_key(host)  # known_hosts still pins the old key
    provider = get_provider("ssh", provider_options(ssh_testbed, [host]))
    with pytest.raises(HostKeyError, match="host key CHANGED") as info:
        provider.acquire(one_host_request(tmp_path))
    assert "\n" not in str(info.value)
    ssh_testbed.pin_host_key(host)  # the host is usable again for later tests


def test_a_key_the_host_does_not_accept_is_refused(ssh_testbed: SshTestBed, tmp_path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    options = provider_options(ssh_testbed, ssh_testbed.hosts[:1])
    options["hosts"][0]["key_path"] = str(other)
    provider = get_provider("ssh", options)
    with pytest.raises(BadRequestError, match="was refused") as info:
        provider.acquire(one_host_request(tmp_path))
    assert other.read_text().splitlines()[1] not in str(info.value)  # no key material


def test_unreachable_host_at_start_fails_and_leaves_nothing(ssh_testbed: SshTestBed,
                                                            tmp_path) -> None:
    options = provider_options(ssh_testbed, ssh_testbed.hosts[:2], connect_timeout_s=2.0)
    options["hosts"][1]["address"] = f"10.231.{ssh_testbed.octet}.250"  # nobody there
    provider = get_provider("ssh", options)
    request = ClusterRequest(run_id="unreach", workdir=tmp_path / "run",
                             hosts=[HostSpec("ps-0", "ps"), HostSpec("worker-0", "worker")])
    with pytest.raises(SshUnreachableError, match="unreachable") as info:
        provider.acquire(request)
    assert "\n" not in str(info.value)
    assert ssh_testbed.role_pids(ssh_testbed.hosts[0]) == []


def test_output_that_follows_the_exit_status_is_read(ssh_testbed: SshTestBed,
                                                     tmp_path) -> None:
    """sshd sends a command's exit status when it reaps the command and forwards what is still
    in the command's pipe after it. A reader that stopped at the status lost, now and then, a
    launch's process id and a role's last event (`train_end`) on a loaded machine. Here a
    background child holds the command's stdout for a second after the shell exited, so the
    status surely comes first: its lines are still part of the output."""
    provider = get_provider("ssh", provider_options(ssh_testbed, ssh_testbed.hosts[:1]))
    cluster = provider.acquire(one_host_request(tmp_path))
    try:
        connection = provider.runner(cluster.hosts[0]).machine.connection
        result = connection.run("(sleep 1; echo late; echo late-err >&2) & echo early")
    finally:
        provider.release(cluster)
    assert result.exit_code == 0
    assert result.stdout.split() == ["early", "late"]
    assert result.stderr.split() == ["late-err"]


# --- liveness ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["cut_link", "freeze"])
def test_lost_host_is_reported_without_tcp_noticing(ssh_testbed: SshTestBed, tmp_path,
                                                    fault: str) -> None:
    """A machine that stops answering while another still answers is lost after
    `unreachable_grace_s` (the heartbeat notices it, TCP does not), its roles' handles with it."""
    host, other = ssh_testbed.add_host(), ssh_testbed.add_host()
    journal = Journal(tmp_path / "journal.jsonl")
    provider = get_provider("ssh", provider_options(ssh_testbed, [host, other],
                                                    unreachable_grace_s=2.0), journal=journal)
    cluster = provider.acquire(ClusterRequest(
        run_id=f"t{time.monotonic_ns()}", workdir=tmp_path / "run",
        hosts=[HostSpec("worker-0", "worker"), HostSpec("worker-1", "worker")]))
    worker, survivor = cluster.hosts
    process = provider.runner(worker).start(["sleep", "600"])
    try:
        assert provider.poll(cluster)[worker.id] == HostState.RUNNING
        (ssh_testbed.cut if fault == "cut_link" else ssh_testbed.freeze)(host)
        wait_state(provider, cluster, worker.id, HostState.REVOKED, LOSS_BOUND_S)
        assert provider.poll(cluster)[survivor.id] == HostState.RUNNING
        assert process.wait(10) == -9  # the machine was lost with it
        assert not provider.runner(worker).alive()
    finally:
        (ssh_testbed.restore if fault == "cut_link" else ssh_testbed.thaw)(host)
        provider.release(cluster)  # reaches the machine again and stops the leftover
    assert ssh_testbed.processes_left([host, other]) == {host.name: [], other.name: []}
    assert list_unreleased(journal.path) == []


#: A role that counts for about 30 s, one numbered line to stdout and one to stderr each 0.1 s.
COUNTER = ("i=0; while [ $i -lt 300 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); "
           "sleep 0.1; done; exit 7")


@pytest.mark.slow
def test_a_dropped_connection_costs_nothing(ssh_testbed: SshTestBed, tmp_path) -> None:
    """The link to the only machine cut for longer than the heartbeat (our network, as far as
    we can tell): the machine stays RUNNING, its role runs on, and once the link is back the
    same handle reads on from where it was: every line once, in order, and the role's own
    exit code. Nothing is restarted or killed."""
    host = ssh_testbed.add_host()
    journal = Journal(tmp_path / "journal.jsonl")
    provider = get_provider("ssh", provider_options(ssh_testbed, [host]), journal=journal)
    cluster = provider.acquire(one_host_request(tmp_path))
    worker = cluster.hosts[0]
    log_path = tmp_path / "role.log"
    process = provider.runner(worker).start(["sh", "-c", COUNTER], log_path=log_path)
    machine = provider._host_machine[worker.id]
    try:
        assert process.readline() == "line-0\n"
        ssh_testbed.cut(host)
        try:
            deadline = time.monotonic() + LOSS_BOUND_S
            while machine.unreachable_since is None:  # the heartbeat notices the cut
                assert time.monotonic() < deadline, "the cut was not noticed"
                assert provider.poll(cluster)[worker.id] == HostState.RUNNING
                time.sleep(0.2)
            for _ in range(20):  # 4 s more, well past the heartbeat's verdict
                assert provider.poll(cluster)[worker.id] == HostState.RUNNING
                assert process.poll() is None
                time.sleep(0.2)
        finally:
            ssh_testbed.restore(host)
        lines = [process.readline() for _ in range(299)]
        assert process.wait(60) == 7
        assert process.readline() == ""
    finally:
        provider.release(cluster)
    assert lines == [f"line-{i}\n" for i in range(1, 300)]
    assert log_path.read_text().split() == [f"err-{i}" for i in range(300)]
    assert process.reattached >= 1 and machine.reconnects >= 1
    assert ssh_testbed.processes_left([host]) == {host.name: []}
    assert list_unreleased(journal.path) == []


def _children(pid: int) -> list[int]:
    """Local processes whose parent is `pid`."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            if int(text[text.rindex(")") + 2:].split()[1]) == pid:
                kids.append(int(text.split(" ", 1)[0]))
    return kids


def test_a_dropped_connections_host_session_is_ended_by_the_next(ssh_testbed: SshTestBed,
                                                                 tmp_path) -> None:
    """What a machine does once it reconnects after our network dropped (our side vanished
    without a goodbye, so the host's sshd would hold that session and its SFTP server for
    hours): the new connection ends the old one's sshd session, found by pid and start ticks,
    and with it the SFTP server; a process with that pid but another start time is left
    alone. (The drop itself, end to end: test_ssh_e2e's 120 s drop leaves no process.)"""
    from provisioning.ssh.connection import end_session_command

    host = ssh_testbed.add_host()
    provider = get_provider("ssh", provider_options(ssh_testbed, [host]))
    cluster = provider.acquire(one_host_request(tmp_path))
    machine = provider._host_machine[cluster.hosts[0].id]
    second = machine.connect()
    try:
        first = machine.connection
        session = first.session_process()
        assert session is not None and read_process_start_ticks(session[0]) == session[1]
        assert Path(f"/proc/{session[0]}/comm").read_text().startswith("sshd")
        # an SFTP server under it, unless sshd serves SFTP itself (this bed: internal-sftp)
        sftp_servers = _children(session[0])
        assert second.session_process() not in (None, session)
        second.run(end_session_command(session[0], session[1] + 1))
        assert read_process_start_ticks(session[0]) == session[1]  # another start time: not signalled
        second.run(end_session_command(*session))
        deadline = time.monotonic() + LOSS_BOUND_S
        while read_process_start_ticks(session[0]) == session[1] \
                or any(map(read_process_start_ticks, sftp_servers)):
            assert time.monotonic() < deadline, "the old session was not ended"
            time.sleep(0.1)
        assert second.run("echo ok").stdout == "ok\n"
    finally:
        second.close()
        provider.release(cluster)
    assert ssh_testbed.processes_left([host]) == {host.name: []}


@pytest.mark.slow
def test_no_machine_answering_past_the_outage_grace_stops_the_run_resumable(
        ssh_testbed: SshTestBed, tmp_path) -> None:
    """Every machine silent for `outage_grace_s`: they are lost, and poll says so as
    ContactLostError (the orchestrator's network: restarting elsewhere would not help).
    The release stops what runs there once the link is back."""
    host = ssh_testbed.add_host()
    journal = Journal(tmp_path / "journal.jsonl")
    provider = get_provider("ssh", provider_options(ssh_testbed, [host], outage_grace_s=3.0),
                            journal=journal)
    cluster = provider.acquire(one_host_request(tmp_path))
    worker = cluster.hosts[0]
    process = provider.runner(worker).start(["sleep", "600"])
    try:
        ssh_testbed.cut(host)
        try:
            deadline = time.monotonic() + LOSS_BOUND_S
            with pytest.raises(ContactLostError, match=r"provider\.outage_grace_s"):
                while True:
                    provider.poll(cluster)
                    assert time.monotonic() < deadline, "contact never declared lost"
                    time.sleep(0.2)
            assert process.wait(10) == -9
        finally:
            ssh_testbed.restore(host)
    finally:
        provider.release(cluster)
    assert ssh_testbed.processes_left([host], within_s=10.0) == {host.name: []}
    assert list_unreleased(journal.path) == []


# --- setup -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_setup_is_parallel_idempotent_and_cached(ssh_testbed: SshTestBed, tmp_path) -> None:
    hosts = ssh_testbed.hosts[:2]
    for host in hosts:  # a clean slate: no environment from an earlier test
        subprocess.run(["rm", "-rf", str(host.root / ".transient")], check=True)
    options = provider_options(ssh_testbed, hosts)
    for entry in options["hosts"]:
        entry["root"] = str(Path(entry["root"]) / ".transient")
    provider = get_provider("ssh", options)
    request = ClusterRequest(run_id="setup", workdir=tmp_path / "run",
                             hosts=[HostSpec("ps-0", "ps"), HostSpec("worker-0", "worker")])
    cluster = provider.acquire(request)
    try:
        runners = [provider.runner(h) for h in cluster.hosts]
        for runner in runners:
            runner.setup()
        assert all(r.machine.environment.installed for r in runners)
        command, env = runners[1].trainer_command(), runners[1].trainer_env()
        probe = runners[1].start([*command[:-2], "-c", "import trainer.layout, sys; "
                                  "print(trainer.layout.__file__)"], env)
        (line,) = list(probe.stdout_lines())
        assert line.startswith(str(hosts[1].root / ".transient" / "envs"))  # our wheel, not /work
        assert probe.wait(30) == 0
    finally:
        provider.release(cluster)
    again = get_provider("ssh", options)
    cluster = again.acquire(request)
    try:
        for host in cluster.hosts:
            again.runner(host).setup()
            assert not again.runner(host).machine.environment.installed  # nothing installed
    finally:
        again.release(cluster)


def write_wheel(folder: Path, name: str, version: str, files: dict[str, str],
                requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel written by hand (a zip with METADATA, WHEEL and RECORD)."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    members = {**files,
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
               + "".join(f"Requires-Dist: {r}\n" for r in requires),
               f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                "Tag: py3-none-any\n"}
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(c.encode())}\n" for n, c in members.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, content in {**members, f"{info}/RECORD": record}.items():
            z.writestr(member, content)
    return path


@pytest.mark.slow
def test_wheelhouse_host_gets_a_venv_filled_offline(ssh_testbed: SshTestBed, tmp_path) -> None:
    """A host without `python` and without an index gets a venv of the dependencies (no pip,
    no ensurepip needed) that pip, run from the wheelhouse's pip wheel, fills with no package
    index (the namespace has no route out) from wheels downloaded for the host's own Python
    and platform (here offline, from the user's flat wheelhouse folder) and copied once; our
    wheel is unpacked beside it, and new code reuses the venv. The trainer's real dependency
    set (TensorFlow and the rest, 320 MB of wheels, 2 GB installed) is too heavy for this test:
    a stand-in dependency set of one small package stands for it (the isolated-host tests
    install the real one); the code path is the real one, end to end."""
    pips = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not pips:
        pytest.skip("WHEELHOUSE PATH NOT RUN: this Python's ensurepip bundles no pip wheel "
                    "to put into the offline wheelhouse")
    house = tmp_path / "wheelhouse"
    house.mkdir()
    write_wheel(house, "tinydep", "1.0", {"tinydep/__init__.py": "VALUE = 42\n"})
    shutil.copy(pips[-1], house)
    tiny = HostRuntime("0.0.1", ("tinydep>=1",), {"cpu": ()}, 11, 13, "manylinux_2_17_x86_64")

    def stand_in(version: str) -> WheelCache:
        built = tmp_path / f"built-{version}"
        built.mkdir()
        write_wheel(built, HOST_DIST, version, {
            "trainer/__init__.py": "",
            "trainer/__main__.py": "import tinydep, trainer\n"
                                   "print(tinydep.__file__, tinydep.VALUE, trainer.__file__)\n",
        })
        return WheelCache(built, house, "cpu", runtime=tiny)

    first, second = stand_in("0.0.1"), stand_in("0.0.2")
    host = ssh_testbed.hosts[1]
    provider = get_provider("ssh", provider_options(ssh_testbed, [host]))
    cluster = provider.acquire(one_host_request(tmp_path))
    try:
        machine = provider.runner(cluster.hosts[0]).machine
        connection, root = machine.connection, machine.root
        env = ensure_environment(connection, root, None, first)
        assert env.installed and env.deps_installed and env.mode == "wheelhouse"
        (key,) = [p.name for p in house.iterdir() if p.is_dir()]  # one folder: this host's
        assert f"-cp3{env.version.split('.')[1]}-" in key
        python = env.command[0]
        assert python.startswith(posixpath.join(root, "envs", "venv-"))
        dep, value, trainer = connection.run(
            f"PYTHONPATH={shlex.quote(env.env['PYTHONPATH'])} {shlex.join(env.command)}"
        ).stdout.split()
        assert value == "42" and dep.startswith(posixpath.dirname(posixpath.dirname(python)))
        assert trainer.startswith(posixpath.join(env.path, "site"))  # not left in the venv
        again = ensure_environment(connection, root, None, first)
        assert (again.path, again.installed, again.deps_installed) == (env.path, False, False)
        newer = ensure_environment(connection, root, None, second)  # new code, same deps
        assert newer.path != env.path and newer.installed and not newer.deps_installed
        assert newer.command[0] == python  # the venv was reused, pip did not run
    finally:
        provider.release(cluster)


# --- clean-up after a crash --------------------------------------------------------------------


@pytest.mark.slow
def test_clean_up_from_the_journal_stops_what_a_crashed_run_left(ssh_testbed: SshTestBed,
                                                                 tmp_path) -> None:
    host = ssh_testbed.hosts[2]
    journal = Journal(tmp_path / "journal.jsonl")
    options = provider_options(ssh_testbed, [host])
    crashed = get_provider("ssh", options, journal=journal)
    cluster = crashed.acquire(one_host_request(tmp_path))
    runner = crashed.runner(cluster.hosts[0])
    runner.start(["sh", "-c", "trap '' TERM; sleep 600"])
    runner.start(["sleep", "600"])
    runner.machine.connection.close()  # the orchestrator "dies": no stop, no release
    leftovers = list_unreleased(journal.path)
    assert len(leftovers) == 2 and all(e.backend == "ssh" for e in leftovers)
    assert len(ssh_testbed.role_pids(host)) >= 2
    results = get_provider("ssh", options).clean_up(leftovers, grace_s=0.5)
    assert [r.released for r in results] == [True, True]
    assert all("stopped process group" in (r.note or "") for r in results), results
    assert ssh_testbed.processes_left([host]) == {host.name: []}


def test_no_key_material_in_errors_or_files(ssh_testbed: SshTestBed, tmp_path) -> None:
    """Nothing the provider writes or raises carries the private key's content."""
    key_text = ssh_testbed.client_key.read_text()
    secret_lines = [ln for ln in key_text.splitlines() if ln and not ln.startswith("-----")]
    journal = Journal(tmp_path / "journal.jsonl")
    provider = get_provider("ssh", provider_options(ssh_testbed, ssh_testbed.hosts[:1]),
                            journal=journal)
    cluster = provider.acquire(one_host_request(tmp_path))
    runner = provider.runner(cluster.hosts[0])
    process = runner.start(["sh", "-c", "env; echo done"], log_path=tmp_path / "run" / "err.log")
    output = "\n".join(process.stdout_lines())
    provider.release(cluster)
    written = output + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*")
                               if p.is_file())
    assert "done" in output
    for line in secret_lines:
        assert line not in written
    assert os.fspath(ssh_testbed.client_key) not in output  # the key path never reaches a host


def test_wrong_key_path_in_an_experiment_is_one_config_error_line(tmp_path, repo_root) -> None:
    """Through the CLI: exit 2, one line naming the field as the user types it, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=ssh_digits", "provider=ssh",
         f"provider.hosts.0.key_path={tmp_path / 'no_such_key'}", f"hydra.run.dir={tmp_path}"],
        cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert lines[-1].startswith("config error: provider.hosts.0.key_path: no such key file")
    assert "Traceback" not in proc.stderr


# --- data staged to the machines that read it ---------------------------------------------------


@pytest.mark.slow
def test_dataset_is_staged_only_to_the_machines_that_read_it(ssh_testbed: SshTestBed,
                                                            tmp_path) -> None:
    """The chief and evaluator read the dataset (they ship arrays to the workers): their
    machine gets a copy under its work dir, a worker-only machine none."""
    from orchestrator.runtime import data
    from orchestrator.runtime.deploy import Deployment

    dataset = tmp_path / "cifar10"
    (dataset / "cifar-10-batches-bin").mkdir(parents=True)
    (dataset / "cifar-10-batches-bin" / "data_batch_1.bin").write_bytes(os.urandom(4096))
    provider = get_provider("ssh", provider_options(ssh_testbed, ssh_testbed.hosts[:2]))
    request = ClusterRequest(run_id="stage", workdir=tmp_path / "run", hosts=[
        HostSpec("ps-0", "ps"), HostSpec("worker-0", "worker"),
        HostSpec("chief-0", "chief", colocate_with="ps-0"),
        HostSpec("evaluator-0", "evaluator", colocate_with="ps-0")])
    cluster = provider.acquire(request)
    try:
        Deployment(provider, cluster, tmp_path / "run", "{}", data_dir=dataset).prepare_all()
        ps, worker = cluster.hosts_for("ps")[0], cluster.hosts_for("worker")[0]
        staged = Path(ps.workdir) / data.staged_path(dataset) / "cifar-10-batches-bin"
        assert (staged / "data_batch_1.bin").read_bytes() == (
            dataset / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes()
        assert not (Path(worker.workdir) / data.staged_path(dataset)).exists()
    finally:
        provider.release(cluster)
