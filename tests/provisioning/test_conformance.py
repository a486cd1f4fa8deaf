"""The provider conformance suite: the launch contract (provisioning/base.py) checked the same
way on every backend in tests/provisioning/backends.py (local; ssh and gce with the slow tests).

Only the contract's own verbs are used: nothing reaches into a backend's private state, and
every check looks at the host through the runner (its files, its processes' output).
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning.base import (
    DATA_DIR_FIELD,
    PREEMPTION_NOTICE_ENV,
    BadFieldError,
    Cluster,
    ClusterRequest,
    DatasetStore,
    HostLostError,
    HostRunner,
    HostSpec,
    HostState,
    Role,
)
from provisioning.journal import ResourceKind, clean_up, list_unreleased
from provisioning.registry import make_config, provider_class, provider_names
from tests.provisioning.backends import BACKEND_MARKS, BACKENDS, Bed
from tests.testbed.fixtures import ssh_testbed  # noqa: F401 (the gce bed's hosts)

WAIT_S = 10.0
#: Ignores SIGTERM, keeps a grandchild in its group; both bump a heartbeat file on the host.
STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    beat = sys.argv[1]
    code = ("import sys, time\\n"
            "while True:\\n"
            "    open(sys.argv[1], 'a').write('g')\\n"
            "    time.sleep(0.1)\\n")
    subprocess.Popen([sys.executable, "-c", code, beat + ".child"])
    while not os.path.exists(beat + ".child"):  # "up" once both beat (a loaded machine is slow)
        time.sleep(0.05)
    print("up", flush=True)
    while True:
        open(beat, "a").write("p")
        time.sleep(0.1)
    """
)
REPORT = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({"cwd": os.getcwd(), "notice": os.environ.get(sys.argv[1]),
                      "extra": os.environ.get("CONFORMANCE_EXTRA")}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    """
)


@pytest.fixture(params=[pytest.param(name, marks=[getattr(pytest.mark, mark)
                                                  for mark in BACKEND_MARKS[name]])
                        for name in sorted(BACKENDS)])
def bed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bed]:
    with BACKENDS[request.param](tmp_path, request) as made:
        yield made


@pytest.fixture
def cluster(bed: Bed) -> Iterator[Cluster]:
    """ps-0 with the chief colocated on its machine, two workers."""
    hosts = [HostSpec("ps-0", Role.PS), HostSpec("chief-0", Role.CHIEF, colocate_with="ps-0"),
             HostSpec("worker-0", Role.WORKER, transient=True),
             HostSpec("worker-1", Role.WORKER, transient=True)]
    made = bed.provider.acquire(ClusterRequest("conf", hosts, bed.workdir))
    yield made
    bed.provider.release(made)


def host(cluster: Cluster, name: str):
    return next(h for h in cluster.hosts if h.spec.name == name)


def run_python(bed: Bed, runner: HostRunner, code: str, *args: str, **start: object):
    return runner.start([bed.python, "-c", code, *args], **start)  # type: ignore[arg-type]


def read_host_file(runner: HostRunner, remote: str, into: Path) -> str | None:
    """The host file's text, fetched through the runner (None if it does not exist)."""
    into.unlink(missing_ok=True)
    return into.read_text() if runner.fetch(Path(remote), into) else None


def wait_until(check, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def assert_heartbeat_stopped(runner: HostRunner, beat: str, tmp: Path) -> None:
    """The process (and its grandchild) bumping `beat` on the host are gone."""
    for name in (beat, beat + ".child"):
        first = read_host_file(runner, name, tmp / "beat-a")
        time.sleep(0.6)
        second = read_host_file(runner, name, tmp / "beat-b")
        assert first is not None and first == second, f"{name} still growing: alive"


# --- acquire ----------------------------------------------------------------------------------


def test_acquire_gives_running_hosts_in_order_with_colocation(bed: Bed, cluster: Cluster):
    assert [h.spec.name for h in cluster.hosts] == ["ps-0", "chief-0", "worker-0", "worker-1"]
    assert len({h.id for h in cluster.hosts}) == 4
    assert set(bed.provider.poll(cluster).values()) == {HostState.RUNNING}
    ps, chief = host(cluster, "ps-0"), host(cluster, "chief-0")
    assert chief.machine == ps.id and chief.colocated and not ps.colocated
    assert (chief.address, chief.workdir) == (ps.address, ps.workdir)
    endpoints = [h.endpoint for h in cluster.hosts]
    assert len(set(endpoints)) == 4, "every role needs its own port"
    assert bed.provider.runner(ps) is bed.provider.runner(ps)


# --- start, stdout, stderr, notice, cwd --------------------------------------------------------


def test_start_pipes_stdout_appends_stderr_and_sets_the_notice_path(bed: Bed, cluster: Cluster):
    worker = host(cluster, "worker-0")
    runner = bed.provider.runner(worker)
    log = bed.workdir / "logs" / "report.log"
    process = run_python(bed, runner, REPORT, PREEMPTION_NOTICE_ENV,
                         env={"CONFORMANCE_EXTRA": "yes"}, log_path=log)
    report = json.loads(process.readline())
    assert process.wait(WAIT_S) == 0 and process.readline() == ""
    assert report["notice"] == str(runner.notice_path)
    assert Path(report["notice"]).is_absolute()
    assert report["cwd"] == str(worker.workdir)
    assert report["extra"] == "yes"
    wait_until(lambda: "to stderr" in (log.read_text() if log.exists() else ""), "stderr")


# --- copy and fetch ---------------------------------------------------------------------------


def test_copy_write_text_and_fetch_round_trip(bed: Bed, cluster: Cluster, tmp_path: Path):
    runner = bed.provider.runner(host(cluster, "worker-1"))
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "a.txt").write_text("alpha")
    runner.copy(source, Path("tree"))
    runner.write_text(Path("control.json"), '{"seq": 1}\n')
    runner.write_text(Path("control.json"), '{"seq": 2}\n')  # replaced, not appended
    process = run_python(bed, runner, "import pathlib; print(pathlib.Path('tree/sub/a.txt')"
                         ".read_text() + pathlib.Path('control.json').read_text(), end='')")
    assert process.readline() == 'alpha{"seq": 2}\n'
    assert process.wait(WAIT_S) == 0
    back = tmp_path / "back"
    assert runner.fetch(Path("tree"), back) and (back / "sub" / "a.txt").read_text() == "alpha"
    assert runner.fetch(Path("control.json"), tmp_path / "c.json")
    assert (tmp_path / "c.json").read_text() == '{"seq": 2}\n'
    assert runner.fetch(Path("no-such-file"), tmp_path / "nothing") is False
    assert runner.trainer_command(), "the host must say how the trainer starts there"


# --- stop_all ---------------------------------------------------------------------------------


def test_stop_all_kills_a_process_that_ignores_sigterm_and_its_group(bed: Bed, cluster: Cluster,
                                                                      tmp_path: Path):
    runner = bed.provider.runner(host(cluster, "worker-0"))
    process = run_python(bed, runner, STUBBORN, "beat")
    assert process.readline() == "up\n"
    wait_until(lambda: read_host_file(runner, "beat.child", tmp_path / "probe"), "grandchild")
    runner.stop_all(grace_s=0.5)
    assert process.poll() is not None
    assert_heartbeat_stopped(runner, "beat", tmp_path)
    runner.stop_all(grace_s=0.5)  # idempotent


# --- revoke, poll after a loss ----------------------------------------------------------------


def test_revoke_with_notice_then_poll_reports_the_machine_revoked(bed: Bed, cluster: Cluster):
    ps, chief = host(cluster, "ps-0"), host(cluster, "chief-0")
    runner = bed.provider.runner(chief)
    if not bed.provider.can_revoke:
        with pytest.raises(NotImplementedError, match="cannot revoke"):
            bed.provider.revoke(ps, 1.0)
        if bed.preempt is None:
            return
        victim = run_python(bed, runner, "import time; print('up', flush=True); time.sleep(60)")
        assert victim.readline() == "up\n"
        bed.preempt(ps)  # the cloud takes the machine away, from outside
        assert victim.wait(WAIT_S) != 0
        assert_machine_revoked(bed, cluster, runner)
        return
    watcher = run_python(bed, runner, textwrap.dedent("""
        import os, sys, time
        path = os.environ[sys.argv[1]]
        print("watching", flush=True)
        while not os.path.exists(path):
            time.sleep(0.05)
        print(open(path).read().strip(), flush=True)
        time.sleep(60)
        """), PREEMPTION_NOTICE_ENV)
    assert watcher.readline() == "watching\n"  # started (a remote host takes a moment)
    bed.provider.revoke(ps, notice_s=1.0)
    notice = json.loads(watcher.readline())
    assert notice["host_id"] == ps.id and notice["deadline"] > time.time() - 1.0
    assert watcher.wait(WAIT_S) != 0  # killed without a goodbye, with its machine
    assert_machine_revoked(bed, cluster, runner)


def assert_machine_revoked(bed: Bed, cluster: Cluster, chief_runner: HostRunner) -> None:
    """ps-0's machine is gone: poll says so for it and the chief on it, not for a worker, and
    the chief's runner runs nothing more."""
    ps, chief = host(cluster, "ps-0"), host(cluster, "chief-0")
    wait_until(lambda: bed.provider.poll(cluster)[ps.id] == HostState.REVOKED, "REVOKED")
    states = bed.provider.poll(cluster)
    assert states[chief.id] == HostState.REVOKED  # the colocated role went with the machine
    assert states[host(cluster, "worker-0").id] == HostState.RUNNING
    with pytest.raises(HostLostError):
        run_python(bed, chief_runner, "print(1)")


# --- release ----------------------------------------------------------------------------------


def test_release_is_idempotent_and_stops_everything(bed: Bed, cluster: Cluster, tmp_path: Path):
    processes = [run_python(bed, bed.provider.runner(h), STUBBORN, f"beat-{h.spec.name}")
                 for h in cluster.hosts]
    assert all(p.readline() == "up\n" for p in processes)
    bed.provider.release(cluster)
    bed.provider.release(cluster)
    assert all(p.poll() is not None for p in processes)
    assert all(s.is_terminal() for s in bed.provider.poll(cluster).values())
    with pytest.raises(HostLostError):
        run_python(bed, bed.provider.runner(cluster.hosts[0]), "print(1)")


# --- replace ----------------------------------------------------------------------------------


def test_replace_gives_a_fresh_host_in_the_same_slot(bed: Bed, cluster: Cluster):
    lost = host(cluster, "worker-0")
    new_cluster = bed.provider.replace(cluster, [lost.id])
    try:
        new = new_cluster.hosts_for(Role.WORKER)[0]
        assert new.id != lost.id and new.spec.name == "worker-0"
        assert new_cluster.index_of(new) == 0 and new.endpoint == lost.endpoint
        assert [h.id for h in new_cluster.hosts if h.spec.name != "worker-0"] == [
            h.id for h in cluster.hosts if h.spec.name != "worker-0"]
        states = bed.provider.poll(new_cluster)
        assert states[new.id] == HostState.RUNNING
        assert bed.provider.poll(cluster)[lost.id].is_terminal()
        process = run_python(bed, bed.provider.runner(new), "print('fresh')")
        assert process.readline() == "fresh\n" and process.wait(WAIT_S) == 0
        with pytest.raises(KeyError):
            bed.provider.replace(new_cluster, ["no-such-host"])
    finally:
        bed.provider.release(new_cluster)


def test_replacing_a_machine_replaces_the_roles_colocated_on_it(bed: Bed, cluster: Cluster):
    ps, chief = host(cluster, "ps-0"), host(cluster, "chief-0")
    new_cluster = bed.provider.replace(cluster, [ps.id], keep_endpoints=False)
    try:
        new_ps, new_chief = host(new_cluster, "ps-0"), host(new_cluster, "chief-0")
        assert {new_ps.id, new_chief.id}.isdisjoint({ps.id, chief.id})
        assert new_chief.machine == new_ps.id
        assert set(bed.provider.poll(new_cluster).values()) == {HostState.RUNNING}
    finally:
        bed.provider.release(new_cluster)


# --- the checkpoint store ---------------------------------------------------------------------

WRITE_CHECKPOINT = textwrap.dedent(
    """
    import pathlib, sys
    folder = pathlib.Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ckpt-1.index").write_text("step 1")
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"')
    """
)


def test_checkpoint_store_keeps_what_the_chief_wrote_for_a_chief_elsewhere(bed: Bed,
                                                                          cluster: Cluster):
    """The provider's store: what a chief writes at `location` survives `sync`, and after
    `before_start` a chief on another machine reads it at its own `location`."""
    store = bed.provider.checkpoint_store("conf", bed.workdir / "checkpoints")
    chief = bed.provider.runner(host(cluster, "chief-0"))
    store.before_start(chief)  # an empty store: nothing to seed, no error
    process = run_python(bed, chief, WRITE_CHECKPOINT, store.location(chief))
    assert process.wait(WAIT_S) == 0
    assert store.sync(chief)
    elsewhere = bed.provider.runner(host(cluster, "worker-1"))
    store.before_start(elsewhere)
    reader = run_python(bed, elsewhere, "import pathlib, sys; print(pathlib.Path(sys.argv[1], "
                        "'ckpt-1.index').read_text())", store.location(elsewhere))
    assert reader.readline() == "step 1\n" and reader.wait(WAIT_S) == 0
    store.finish(bed.workdir)


def test_dataset_store_serves_a_folder_staged_once(bed: Bed, cluster: Cluster,
                                                   tmp_path: Path) -> None:
    """The optional `dataset_store` verb: None (the deployer pushes), or a store that takes a
    folder once (staging it again uploads nothing) and from which a host fills a folder of its
    own with `python -m trainer data` and the store's `host_args`, each file as staged."""
    from trainer import data

    store = bed.provider.dataset_store()
    assert store is None or isinstance(store, DatasetStore)
    if store is None:
        return  # the default: nothing to stage in
    local = tmp_path / "mine"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "a.bin").write_bytes(bytes(range(256)) * 40)
    (local / "b.txt").write_text("b\n")
    files = data.digests(local)
    first = store.stage(local, files)
    assert (first.uploaded_files, first.uploaded_bytes) == (2, 256 * 40 + 2)
    assert store.stage(local, files) == type(first)(first.url, 0, 0)
    chief = bed.provider.runner(host(cluster, "chief-0"))
    chief.write_text(Path("manifest.json"), json.dumps(files))
    command = [*chief.trainer_command(), "data"]
    fill = chief.start([*command, *store.host_args(first.url, "manifest.json", "ds/mine",
                                                   "data/mine")], chief.trainer_env())
    said = list(fill.stdout_lines())
    assert fill.wait(60) == 0, said
    listing = chief.start([*command, "digests", "data/mine"], chief.trainer_env())
    report = [ln for ln in listing.stdout_lines() if ln.startswith(data.REPORT_PREFIX)]
    assert listing.wait(WAIT_S) == 0 and json.loads(report[0][len(data.REPORT_PREFIX):]) == {
        "files": files}


# --- clean-up from the journal ----------------------------------------------------------------


def test_clean_up_from_the_journal_after_a_crash(bed: Bed, cluster: Cluster, tmp_path: Path):
    """The orchestrator 'crashed' (it never released): the journal's clean-up, with a provider
    built afresh from the run's config, stops what it left on the hosts; a second pass finds
    nothing."""
    runner = bed.provider.runner(host(cluster, "worker-1"))
    process = run_python(bed, runner, STUBBORN, "left")
    assert process.readline() == "up\n"
    groups = [e for e in list_unreleased(bed.journal_path)
              if e.kind is ResourceKind.PROCESS_GROUP]
    worker = host(cluster, "worker-1")
    assert [(e.backend, e.host_id, e.pid) for e in groups] == [
        (bed.name, worker.id, process.pid)]
    report = clean_up(bed.journal_path, grace_s=0.5, configs={bed.name: bed.config})
    # It says what it stopped: the process group, or (a cloud backend) the worker's machine.
    assert any(str(process.pid) in line or f"host {worker.id}" in line for line in report)
    assert_heartbeat_stopped(runner, "left", tmp_path)
    assert clean_up(bed.journal_path, configs={bed.name: bed.config}) == []
    assert list_unreleased(bed.journal_path) == []


# --- class-level hooks: read from the class, no provider built, so every backend, fast --------


@pytest.mark.parametrize("name", provider_names())
def test_class_hooks_keep_the_contract_on_every_backend(name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`fetch_dataset`, `preview` and `check_credentials` as the orchestrator calls them: a
    local folder passes through, an unlisted URL scheme is a `job.data_dir` error, a listed one
    names a folder in the cache without transferring anything; a preview's rows fit its
    columns; a credentials problem names a field of the backend's config."""
    cls = provider_class(name)
    folder = tmp_path / "data"
    assert cls.fetch_dataset(str(folder), tmp_path / "cache") == folder.resolve()
    with pytest.raises(BadFieldError) as error:
        cls.fetch_dataset("nosuch://bucket/x", tmp_path / "cache")
    assert error.value.field == DATA_DIR_FIELD and "nosuch://" in error.value.problem
    for scheme in cls.dataset_schemes:
        where = cls.fetch_dataset(f"{scheme}://bucket/prefix", tmp_path / "cache", download=False)
        assert where.is_relative_to(tmp_path / "cache") and not (tmp_path / "cache").exists()

    for variable in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(variable, raising=False)  # no cloud credentials on this machine
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    config = make_config(name, {})

    hosts = [HostSpec("ps-0", Role.PS), HostSpec("chief-0", Role.CHIEF, colocate_with="ps-0"),
             HostSpec("worker-0", Role.WORKER, transient=True)]
    fitted = config.for_plan(3600.0)
    assert type(fitted) is type(config) and config.for_plan(None) is not None
    preview = cls.preview(hosts, fitted)  # without credentials: it still shows, and says so
    assert preview is None or (preview.rows and all(len(row) == len(preview.columns)
                                                    for row in preview.rows)
                               and all("\n" not in note for note in preview.notes))

    problem = cls.check_credentials(config)
    if problem is not None:
        field, why = problem
        section, _, key = field.partition(".")
        assert section == "provider" and hasattr(config, key) and why, problem
