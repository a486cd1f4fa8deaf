"""Append-only journal of every resource a run creates, and the clean-up that reads it.

One JSON object per line, flushed per line, in `<run_dir>/journal.jsonl` (the caller picks the
path). A resource is recorded as it is created (`action: "create"`) and again when released
(`action: "release"`). Every entry names the backend and the host (id and address) it lives
on. `clean_up(path)` hands each backend's unreleased entries to that backend's
`Provider.clean_up` (the local backend reads this machine's /proc; a remote backend acts on the
entry's host), so a remote pid is never signalled here: run it after a crash.

Process groups are identified by (pid, pgid, start time). The start time (field 22 of
/proc/<pid>/stat on the process's host, clock ticks since boot) guards against PID reuse: a
live process with the recorded pid but another start time is a stranger and is left alone.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: Grace between SIGTERM and SIGKILL when clean_up stops a leftover process group.
CLEAN_UP_GRACE_S = 2.0
#: How often clean_up checks whether a terminated group has gone.
CLEAN_UP_POLL_INTERVAL_S = 0.05
JOURNAL_FILE = "journal.jsonl"


class ResourceKind(enum.StrEnum):
    PROCESS_GROUP = "process_group"
    VM = "vm"  # recorded by cloud backends; released through their provider, not here


class JournalAction(enum.StrEnum):
    CREATE = "create"
    RELEASE = "release"


@dataclass(frozen=True)
class JournalEntry:
    """One journal line. `pid`/`pgid`/`start_ticks` are set for process groups, else None."""

    action: JournalAction
    kind: ResourceKind
    resource_id: str  # process groups: str(pgid); VMs: the VM name
    host_id: str
    time: float
    backend: str = "local"  # the provider that created it (journals before it was recorded)
    address: str | None = None  # the host's address (where the pid lives)
    pid: int | None = None
    pgid: int | None = None
    start_ticks: int | None = None
    argv: list[str] | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @classmethod
    def from_json(cls, line: str) -> JournalEntry:
        raw = json.loads(line)
        return cls(
            **{**raw, "action": JournalAction(raw["action"]), "kind": ResourceKind(raw["kind"])}
        )


def read_process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None if no such process (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # exited, waiting to be reaped: nothing left to kill
        return None
    return int(fields[19])  # field 22 overall


#: Where process start times are read (absent on macOS: liveness then comes from `os.kill`).
PROC_ROOT = Path("/proc")


def process_is_live(pid: int, start_ticks: int | None, proc_root: Path = PROC_ROOT) -> bool:
    """Whether the process `pid` that started at `start_ticks` (0/None: unknown) still runs
    here. Without /proc (macOS) the start time cannot be compared: `os.kill(pid, 0)` decides,
    and a process that exists or cannot be asked counts as live (never delete a live run's
    resources on a guess)."""
    if proc_root.is_dir():
        ticks = read_process_start_ticks(pid)
        return ticks is not None and (not start_ticks or ticks == start_ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def list_group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class Journal:
    """Writer for one journal file. Implements `provisioning.base.ResourceJournal`.

    Thread-safe; each line is written with one O_APPEND write, so concurrent writers (even from
    several processes) never interleave within a line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def record_process_group(
        self, *, backend: str, host_id: str, address: str, pid: int, pgid: int,
        argv: Sequence[str], start_ticks: int | None = None,
    ) -> None:
        """Record a just-started process group (call right after it started, before anything
        else). `start_ticks` is its start time on its host, when the backend can read it."""
        self._append(
            JournalEntry(
                action=JournalAction.CREATE,
                kind=ResourceKind.PROCESS_GROUP,
                resource_id=str(pgid),
                host_id=host_id,
                time=time.time(),
                backend=backend,
                address=address,
                pid=pid,
                pgid=pgid,
                start_ticks=start_ticks,
                argv=list(argv),
            )
        )

    def record_process_group_released(
        self, *, backend: str, host_id: str, address: str, pgid: int
    ) -> None:
        """Record that a process group was stopped and reaped."""
        self._append(
            JournalEntry(
                action=JournalAction.RELEASE,
                kind=ResourceKind.PROCESS_GROUP,
                resource_id=str(pgid),
                host_id=host_id,
                time=time.time(),
                backend=backend,
                address=address,
                pgid=pgid,
            )
        )

    def record_vm(
        self, *, backend: str, host_id: str, name: str, address: str | None = None,
        released: bool = False,
    ) -> None:
        """Record a VM before it is created (`released=False`) or after it is deleted."""
        action = JournalAction.RELEASE if released else JournalAction.CREATE
        self._append(JournalEntry(action, ResourceKind.VM, name, host_id, time.time(),
                                  backend=backend, address=address))

    def record_released(self, entry: JournalEntry) -> None:
        """Record that the resource of a create entry is gone (clean-up's last step)."""
        self._append(JournalEntry(JournalAction.RELEASE, entry.kind, entry.resource_id,
                                  entry.host_id, time.time(), backend=entry.backend,
                                  address=entry.address, pgid=entry.pgid))

    def _append(self, entry: JournalEntry) -> None:
        data = (entry.to_json() + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def read_journal(path: Path) -> list[JournalEntry]:
    """Every entry in order; a missing file is an empty journal. A torn last line (the writer
    crashed mid-write) is skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(JournalEntry.from_json(line))
        except (ValueError, KeyError, TypeError):
            continue
    return entries


def list_unreleased(path: Path) -> list[JournalEntry]:
    """Create entries with no later release entry for the same (backend, host, kind, id)."""
    open_entries: dict[tuple[str, str, ResourceKind, str], JournalEntry] = {}
    for entry in read_journal(path):
        key = (entry.backend, entry.host_id, entry.kind, entry.resource_id)
        if entry.action is JournalAction.CREATE:
            open_entries[key] = entry
        else:
            open_entries.pop(key, None)
    return list(open_entries.values())


def clean_up(journal_path: Path, grace_s: float = CLEAN_UP_GRACE_S,
             configs: Mapping[str, object] | None = None) -> list[str]:
    """Stop every recorded, unreleased resource that still exists; return one line per
    resource acted on or left over (empty = nothing to do). Idempotent.

    Entries go to their own backend's `Provider.clean_up`, built by the registry with
    `configs[backend]` (the run's provider config; None = the backend's defaults). Each
    resource the backend stopped or found gone is then recorded as released; one it left
    alone stays listed (and reported again next time)."""
    from provisioning.registry import get_provider  # the registry imports backends lazily

    unreleased = list_unreleased(journal_path)
    report: list[str] = []
    journal = Journal(journal_path)
    for backend in sorted({e.backend for e in unreleased}):
        entries = [e for e in unreleased if e.backend == backend]
        provider = get_provider(backend, (configs or {}).get(backend))
        for result in provider.clean_up(entries, grace_s):
            if result.released:
                journal.record_released(result.entry)
            if result.note:
                report.append(result.note)
    return report


def list_recorded_members(entry: JournalEntry) -> list[int]:
    """Live members (on this machine) of the recorded group, unless its pgid now belongs to
    someone else. Only meaningful for an entry of a process on this machine."""
    assert entry.pgid is not None and entry.pid is not None
    leader_ticks = read_process_start_ticks(entry.pid)
    if leader_ticks is not None and leader_ticks != entry.start_ticks:
        return []  # the pid was reused: a different process now leads this pgid
    # Members started before the recorded leader cannot belong to its group.
    earliest = entry.start_ticks or 0
    return [
        pid
        for pid in list_group_members(entry.pgid)
        if (read_process_start_ticks(pid) or 0) >= earliest
    ]


def stop_local_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group on this machine, `grace_s`, then SIGKILL, until no member is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not list_group_members(pgid):
                return
            time.sleep(CLEAN_UP_POLL_INTERVAL_S)
