"""The resource journal: records, torn lines, and clean-up of leftover process groups."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from provisioning import ClusterRequest, HostSpec
from provisioning.journal import (
    Journal,
    JournalAction,
    ResourceKind,
    clean_up,
    list_group_members,
    list_unreleased,
    read_journal,
    read_process_start_ticks,
)
from provisioning.local import LocalProvider

# A leftover of a crashed run: its own group, no parent-death signal, a grandchild in the group.
ORPHAN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("up", flush=True)
    time.sleep(60)
    """
)


def start_orphan() -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout.readline() == "up\n"
    return process


def record_local(journal: Journal, host_id: str, pid: int, argv: list[str],
                 address: str = "127.0.0.1") -> None:
    """What the local backend records for a process group it started."""
    journal.record_process_group(backend="local", host_id=host_id, address=address, pid=pid,
                                 pgid=pid, argv=argv, start_ticks=read_process_start_ticks(pid))


def test_entries_round_trip_and_releases_pair_up(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    record_local(journal, "h1", os.getpid(), ["x"])
    record_local(journal, "h2", 1, ["y"])
    journal.record_process_group_released(backend="local", host_id="h2", address="127.0.0.1",
                                          pgid=1)
    journal.record_vm(backend="gce", host_id="h3", name="vm-a")
    entries = read_journal(journal.path)
    assert [e.action for e in entries] == [JournalAction.CREATE] * 2 + [
        JournalAction.RELEASE,
        JournalAction.CREATE,
    ]
    assert entries[0].start_ticks == read_process_start_ticks(os.getpid())
    assert entries[0].argv == ["x"] and entries[3].kind is ResourceKind.VM
    assert (entries[0].backend, entries[0].address, entries[3].backend) == (
        "local", "127.0.0.1", "gce")
    assert [(e.host_id, e.kind) for e in list_unreleased(journal.path)] == [
        ("h1", ResourceKind.PROCESS_GROUP),
        ("h3", ResourceKind.VM),
    ]


def test_missing_journal_and_torn_last_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    assert read_journal(path) == [] and clean_up(path) == []
    Journal(path).record_vm(backend="local", host_id="h", name="vm-a")
    with open(path, "a") as f:
        f.write('{"action": "create", "kind": "proc')  # the writer died mid-line
    assert len(read_journal(path)) == 1


def test_clean_up_kills_live_groups_once(tmp_path):
    path = tmp_path / "journal.jsonl"
    orphan = start_orphan()
    record_local(Journal(path), "w0", orphan.pid, ["orphan"])
    assert len(list_group_members(orphan.pid)) == 2
    report = clean_up(path, grace_s=0.3)
    assert report == [f"killed process group {orphan.pid} (host w0, 2 process(es))"]
    orphan.wait(5)
    assert list_group_members(orphan.pid) == []
    assert clean_up(path) == []  # idempotent: the group is now recorded as released


def test_clean_up_spares_a_reused_pid(tmp_path):
    path = tmp_path / "journal.jsonl"
    stranger = start_orphan()
    try:
        record_local(Journal(path), "w0", stranger.pid, ["old"])
        lines = path.read_text().replace('"start_ticks": ', '"start_ticks": 1').splitlines()
        path.write_text("\n".join(lines) + "\n")  # recorded start time != the live process's
        assert clean_up(path) == []
        assert stranger.poll() is None
    finally:
        os.killpg(stranger.pid, 9)
        stranger.wait()


def test_clean_up_never_signals_a_local_process_for_a_remote_pid(tmp_path):
    """An entry of another machine whose pid happens to be alive here is left alone."""
    path = tmp_path / "journal.jsonl"
    bystander = start_orphan()
    try:
        record_local(Journal(path), "remote-w0", bystander.pid, ["remote"], address="10.9.8.7")
        report = clean_up(path, grace_s=0.3)
        assert report == [f"process group {bystander.pid} on 10.9.8.7: not on this machine; "
                          f"left alone"]
        assert bystander.poll() is None and len(list_group_members(bystander.pid)) == 2
    finally:
        os.killpg(bystander.pid, 9)
        bystander.wait()


def test_local_provider_records_into_the_journal(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    provider = LocalProvider(journal=journal, stop_grace_s=0.2)
    cluster = provider.acquire(ClusterRequest("r", [HostSpec("w0", "worker")], tmp_path))
    process = provider.runner(cluster.hosts[0]).start([sys.executable, "-c", ORPHAN])
    (entry,) = list_unreleased(journal.path)
    assert (entry.pid, entry.pgid, entry.host_id) == (process.pid, process.pid, cluster.hosts[0].id)
    assert (entry.backend, entry.address) == ("local", cluster.hosts[0].address)
    assert entry.start_ticks == read_process_start_ticks(process.pid)
    provider.release(cluster)
    assert list_unreleased(journal.path) == []


def test_release_command_stops_what_a_crashed_run_left(tmp_path):
    """A journal that still records a live process group: the release command stops it."""
    import subprocess
    import sys

    from orchestrator.release import main
    from provisioning.journal import JOURNAL_FILE, Journal

    run_dir = tmp_path / "outputs" / "run1"
    run_dir.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        record_local(Journal(run_dir / JOURNAL_FILE), "h1", child.pid, ["sleep"])
        assert main([str(tmp_path / "outputs")]) == 0
        assert child.wait(timeout=10) is not None
        assert main([str(tmp_path / "outputs")]) == 0  # idempotent
    finally:
        if child.poll() is None:
            child.kill()
