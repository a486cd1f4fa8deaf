"""Roles on an SSH machine: detached process groups whose output is streamed back.

A role starts detached (`setsid`, stdin from /dev/null, stdout and stderr into files beside its
pid file), so it survives a dropped connection and the exec channel can close at once
(gce-notes §F). A small follower, run on the host by its Python over one channel per role,
streams both files back (stdout on the channel's stdout, stderr on its stderr) from given byte
offsets and exits with the role's exit code once the role's process group is gone.

A dropped connection is not the role's end: the role runs on, its output lands in its files.
The process handle waits for its machine's link to connect again (`Link.await_connection`)
and starts a new follower from the offsets it had read, so no line is lost or read twice;
only a machine its provider declares lost ends the handle (exit -9). paramiko cannot send signals
(RFC 4254 §6.9 is unimplemented), so stop and kill are `kill -SIG -- -PGID` commands, guarded
by the leader's start time so a reused pid is never signalled.

Exit codes: the wrapper shell writes `$?` into `<proc>.rc`; 128+N becomes -N (a signal). A role
whose group vanished without an rc (killed together with its wrapper) reports the signal we
sent, else -9; a role whose machine was lost reports -9.
"""

from __future__ import annotations

import contextlib
import itertools
import posixpath
import queue
import shlex
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import paramiko

from provisioning.base import (
    STOP_GRACE_S,
    Host,
    HostLostError,
    ProvisionError,
    RemoteProcess,
    ResourceJournal,
)
from provisioning.ssh.connection import ChannelEnd, SshConnection

#: Directory below a machine's work dir holding each role's pid, out, err and rc files.
PROCS_DIR = ".procs"
#: Exit code the follower reports when the group vanished without writing an rc file.
_NO_RC = 255
_LOST_CODE = -9
_POLL_S = 0.05
#: Followers started again on a connection that is still alive before the role is given up.
MAX_IDLE_REATTACH = 3

# Runs on the host: `python -c FOLLOWER BASE LEADER TICKS OUT_OFFSET ERR_OFFSET`. Streams
# BASE.out / BASE.err from those byte offsets until the role's process group is gone, then exits
# with the role's exit code. Python 3.6+.
FOLLOWER = r"""
import os, sys, time
base, leader, ticks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parent = os.getppid()
srcs = [(open(base + ".out", "rb"), sys.stdout.buffer), (open(base + ".err", "rb"), sys.stderr.buffer)]
for (src, _), offset in zip(srcs, sys.argv[4:6]):
    src.seek(int(offset))
def fields(pid):
    try:
        s = open("/proc/%d/stat" % pid).read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()
def group_alive():
    f = fields(leader)
    if f is not None and f[0] != "Z" and f[19] == ticks:
        return True
    for p in os.listdir("/proc"):
        if p.isdigit():
            f = fields(int(p))
            if f is not None and f[0] != "Z" and int(f[2]) == leader:
                return True
    return False
def pump():
    moved = False
    for src, dst in srcs:
        data = src.read(65536)
        while data:
            dst.write(data); dst.flush(); moved = True
            data = src.read(65536)
    return moved
while True:
    if os.getppid() != parent:
        sys.exit(_NO_RC)
    if os.path.exists(base + ".rc") or not group_alive():
        time.sleep(0.05); pump()
        try:
            code = int(open(base + ".rc").read())
        except (OSError, ValueError):
            code = _NO_RC
        sys.exit(code if 0 <= code <= _NO_RC else _NO_RC - 1)
    if not pump():
        time.sleep(0.1)
""".replace("_NO_RC", str(_NO_RC))

# Signals a process group unless its leader's pid now belongs to another process (start time).
_KILL_GROUP = (
    'k() { if [ -r /proc/$2/stat ]; then '
    '[ "$(sed "s/^.*) //" /proc/$2/stat | cut -d" " -f20)" = "$3" ] || return 0; fi; '
    'kill -$1 -- -$2 2>/dev/null || true; }; ')


def kill_groups_command(signal_name: str, groups: Sequence[tuple[int, int | None]]) -> str:
    """Shell command sending `signal_name` to each (pgid, leader start ticks) group."""
    calls = " ".join(f"k {signal_name} {pgid} {ticks if ticks is not None else 'x'};"
                     for pgid, ticks in groups)
    return _KILL_GROUP + calls


def group_alive_command(groups: Sequence[int]) -> str:
    """Shell command printing the pgids among `groups` that still have a live member (shell
    builtins only: one fork per /proc entry would take seconds on a busy host)."""
    wanted = " ".join(str(g) for g in groups)
    return (f"for g in {wanted}; do for s in /proc/[0-9]*/stat; do "
            "read -r line < $s 2>/dev/null || continue; set -- ${line##*) }; "
            '[ "$1" != Z ] && [ "$3" = "$g" ] && { echo $g; break; }; done; done')


def launch_script(base: str, cwd: str, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Shell script that starts `argv` detached in its own session and prints `PID TICKS`."""
    q = shlex.quote
    env_args = " ".join(q(f"{k}={v}") for k, v in env.items())
    command = " ".join(q(a) for a in argv)
    inner = (f"echo $$ > {q(base + '.pid.tmp')} && mv {q(base + '.pid.tmp')} {q(base + '.pid')}; "
             f"env {env_args} {command} > {q(base + '.out')} 2> {q(base + '.err')} < /dev/null; "
             f"echo $? > {q(base + '.rc.tmp')}; mv {q(base + '.rc.tmp')} {q(base + '.rc')}")
    return (f"set -e; mkdir -p {q(posixpath.dirname(base))} {q(cwd)}; cd {q(cwd)}; "
            f"rm -f {q(base + '.rc')} {q(base + '.pid')}; : > {q(base + '.out')}; "
            f": > {q(base + '.err')}; "
            f"setsid sh -c {q(inner)} < /dev/null > /dev/null 2>&1 & "
            f"i=0; while [ ! -s {q(base + '.pid')} ]; do i=$((i+1)); "
            f"[ $i -gt 1000 ] && exit 98; sleep 0.01; done; "
            f"P=$(cat {q(base + '.pid')}); "
            "echo $P $(sed 's/^.*) //' /proc/$P/stat | cut -d' ' -f20)")


class Link(Protocol):
    """A machine's connection as its roles see it: the current one, and a way to wait for the
    next after a drop (`provisioning.ssh.machine.Machine`)."""

    @property
    def connection(self) -> SshConnection | None: ...

    def await_connection(self, old: SshConnection | None,
                         timeout_s: float | None = None) -> SshConnection | None:
        """A live connection other than `old`: None once the machine is lost or released;
        SshUnreachableError after `timeout_s` (None: no limit) without one."""
        ...

    def reachable(self) -> bool:
        """Whether the current connection answers (no drop being waited out)."""
        ...


def follower_command(python: str, base: str, pgid: int, ticks: int | None,
                     offsets: tuple[int, int] = (0, 0)) -> str:
    """The exec command of a role's follower, reading its files from `offsets` (out, err)."""
    return "exec " + " ".join(shlex.quote(a) for a in (
        python, "-u", "-c", FOLLOWER, base, str(pgid), str(ticks), *map(str, offsets)))


class SshProcess(RemoteProcess):
    """A role on an SSH machine. A reader thread moves the follower's stdout into lines and
    its stderr into `log_path`; the follower's exit status is the role's exit code. A follower
    cut off with its connection is started again, from the bytes already read, once the
    machine's link is back (module docstring)."""

    def __init__(self, link: Link, host_id: str, pgid: int, ticks: int | None,
                 channel: paramiko.Channel, log_path: Path | None,
                 on_exit: callable | None = None, python: str = "python3",  # type: ignore[valid-type]
                 base: str = "") -> None:
        self._link = link
        self._connection = link.connection
        self._host_id = host_id
        self._pgid = pgid
        self.ticks = ticks
        self._channel = channel
        self._log_path = log_path
        self._python = python
        self._base = base
        self._lines: queue.Queue[str] = queue.Queue()
        self._code: int | None = None
        self._done = threading.Event()
        self._signal_sent: int | None = None
        self._on_exit = on_exit
        self.observed = False  # the exit was seen on the host (not a lost connection)
        self.reattached = 0  # followers started again after a dropped connection
        self._idle_reattaches = 0
        self._offsets = [0, 0]  # bytes of the role's stdout and stderr files read so far
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"ssh-role-{host_id}-{pgid}")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._pgid

    def _read(self) -> None:
        pending = b""
        log = open(self._log_path, "ab") if self._log_path is not None else None  # noqa: SIM115
        try:
            while True:
                status = -1
                if self._channel is not None:
                    status, pending = self._follow(self._channel, pending, log)
                if status >= 0 or not self._base or not self._reattach():
                    break
        finally:
            if log is not None:
                log.close()
        if pending:
            self._lines.put(pending.decode(errors="replace") + "\n")
        self._code = self._exit_code(status)
        self.observed = status >= 0
        self._done.set()
        self._lines.put("")
        if self._on_exit is not None:
            self._on_exit(self, status >= 0)

    def _follow(self, channel: paramiko.Channel, pending: bytes,
                log: Any) -> tuple[int, bytes]:
        """Read one follower to its end: (its exit status, or -1 if the connection ended
        first; the partial last line)."""
        end = ChannelEnd(channel)
        try:
            while True:
                moved = False
                if channel.recv_ready():
                    data = channel.recv(65536)
                    moved = bool(data)
                    self._offsets[0] += len(data)
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._lines.put(line.decode(errors="replace") + "\n")
                if channel.recv_stderr_ready():
                    data = channel.recv_stderr(65536)
                    moved = moved or bool(data)
                    self._offsets[1] += len(data)
                    if log is not None:
                        log.write(data)
                        log.flush()
                if not moved:
                    if end.reached():
                        break
                    end.wait(_POLL_S)
            status = channel.exit_status if channel.status_event.is_set() else -1
        except (OSError, EOFError, paramiko.SSHException):
            status = -1
        finally:
            with contextlib.suppress(Exception):
                channel.close()
        if status < 0 and self._connection is not None:
            self._connection.check_alive()  # a dead transport tells the machine at once
        return status, pending

    def _reattach(self) -> bool:
        """After a dropped connection: wait for the machine's next one and follow the role's
        files again from the offsets read. False once the machine is lost or released."""
        old = self._connection
        if old is not None and self._link.connection is old and old.check_alive():
            # The follower's channel ended but its connection lives (sshd ended the session):
            # follow again on it, a few times; more would mean the host refuses followers.
            self._idle_reattaches += 1
            if self._idle_reattaches > MAX_IDLE_REATTACH:
                return False
            old = None
        while True:
            try:
                connection = self._link.await_connection(old)
            except ProvisionError:
                return False
            if connection is None:
                return False
            self._connection = old = connection
            try:
                self._channel = connection.open_channel(follower_command(
                    self._python, self._base, self._pgid, self.ticks, tuple(self._offsets)))
            except ProvisionError:
                continue  # that connection dropped too: wait for the next
            self.reattached += 1
            return True

    def _exit_code(self, status: int) -> int:
        if status < 0:  # the machine was lost: the connection ended without a status
            return _LOST_CODE
        if status == _NO_RC:
            return -(self._signal_sent or 9)
        if status > 128:
            return -(status - 128)
        return status

    def poll(self) -> int | None:
        return self._code if self._done.is_set() else None

    def wait(self, timeout_s: float | None = None) -> int:
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"process {self._pgid} on {self._host_id} still running after "
                               f"{timeout_s} s")
        assert self._code is not None
        return self._code

    def terminate(self) -> None:
        self._signal("TERM", 15)

    def kill(self) -> None:
        self._signal("KILL", 9)

    def _signal(self, name: str, number: int) -> None:
        connection = self._link.connection
        if self._done.is_set() or connection is None or not self._link.reachable():
            return  # out of contact: the group is still recorded, stopped when back or released
        self._signal_sent = self._signal_sent or number
        if number == 9:
            self._signal_sent = 9
        with contextlib.suppress(ProvisionError):
            connection.run(kill_groups_command(name, [(self._pgid, self.ticks)]), check=False)

    def readline(self) -> str:
        if self._done.is_set() and self._lines.empty():
            return ""
        return self._lines.get()


def _ticks(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


class RoleLauncher:
    """Starts, stops and tracks the roles one host (runner) started on its machine."""

    def __init__(self, link: Link, host: Host, python: str,
                 journal: ResourceJournal | None, backend: str,
                 wait_s: float | None = None) -> None:
        self.link = link
        self.host = host
        self.python = python  # runs the follower; any Python 3 on the host
        self._journal = journal
        self._backend = backend
        self._wait_s = wait_s  # how long a launch waits out a dropped connection
        self._processes: list[SshProcess] = []  # not yet stopped by stop_all
        self._started: list[SshProcess] = []  # every process, for leftovers on lost machines
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def _connection(self) -> SshConnection:
        """The machine's live connection, waiting out a drop (at most `wait_s`)."""
        connection = self.link.connection
        if connection is not None and self.link.reachable():
            return connection
        found = self.link.await_connection(None if connection is None else connection,
                                           self._wait_s)
        if found is None:
            raise HostLostError(self.host.id, f"ssh host {self.host.id}: its machine is lost")
        return found

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: str,
               log_path: Path | None) -> SshProcess:
        base = posixpath.join(str(self.host.workdir), PROCS_DIR,
                              f"{self.host.id}-{next(self._seq)}-{int(time.time() * 1000)}")
        connection = self._connection()
        try:
            result = connection.run(launch_script(base, cwd, argv, env))
        except ProvisionError as error:
            if connection.lost.is_set() and self.link.connection in (None, connection) \
                    and not self.link.reachable():
                raise HostLostError(self.host.id, str(error)) from None
            raise
        pid_text, ticks_text = [*result.stdout.split(), "", ""][:2]
        if not pid_text.isdigit():  # the script always prints it: a broken channel or shell
            raise ProvisionError(
                f"ssh host {self.host.id}: starting {posixpath.basename(argv[0])} printed no "
                f"process id (exit code {result.exit_code}, output "
                f"{result.stdout.strip()[:200]!r}, errors {result.stderr.strip()[-300:]!r})")
        pgid = int(pid_text)
        ticks = _ticks(ticks_text)
        if self._journal is not None:
            self._journal.record_process_group(
                backend=self._backend, host_id=self.host.id, address=self.host.address,
                pid=pgid, pgid=pgid, argv=list(argv), start_ticks=ticks)
        try:
            channel = connection.open_channel(follower_command(self.python, base, pgid, ticks))
        except ProvisionError:
            channel = None  # dropped right after the launch: the role runs; follow it when back
        process = SshProcess(self.link, self.host.id, pgid, ticks, channel, log_path,
                             on_exit=self._exited, python=self.python, base=base)
        with self._lock:
            self._processes.append(process)
            self._started.append(process)
        return process

    def maybe_running(self) -> list[tuple[int, int | None]]:
        """(pgid, ticks) of every group whose end was not seen on the host, whether or not its
        handle has noticed the loss yet (a connection replaced after a cut link)."""
        with self._lock:
            return [(p.pid, p.ticks) for p in self._started if not p.observed]

    def forget(self, pgids: Sequence[int]) -> None:
        """These groups were stopped out of band; record them released."""
        with self._lock:
            gone = [p for p in self._started if p.pid in pgids]
            self._started = [p for p in self._started if p.pid not in pgids]
        for process in gone:
            process.observed = True
            self._exited(process, True)

    def _exited(self, process: SshProcess, observed: bool) -> None:
        """The group is gone (observed on the host): record it released in the journal."""
        if observed and self._journal is not None:
            self._journal.record_process_group_released(
                backend=self._backend, host_id=self.host.id, address=self.host.address,
                pgid=process.pid)

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        """TERM every live group at once, wait up to `grace_s`, KILL the rest, wait for the
        followers to report. A lost machine is skipped (its groups stay in the journal)."""
        with self._lock:
            processes, self._processes = self._processes, []
        live = [p for p in processes if p.poll() is None]
        connection = self.link.connection
        if not live or connection is None or not self.link.reachable():
            return  # out of contact: the groups stay recorded (the provider's release)
        groups = [(p.pid, p.ticks) for p in live]
        for p in live:
            p._signal_sent = 15 if grace_s > 0 else 9
        with contextlib.suppress(ProvisionError):
            connection.run(kill_groups_command("TERM" if grace_s > 0 else "KILL", groups),
                           check=False)
        deadline = time.monotonic() + grace_s
        for p in live:
            with contextlib.suppress(TimeoutError):
                p.wait(max(0.0, deadline - time.monotonic()))
        rest = [p for p in live if p.poll() is None]
        connection = self.link.connection
        if rest and connection is not None and self.link.reachable():
            for p in rest:
                p._signal_sent = 9
            with contextlib.suppress(ProvisionError):
                connection.run(kill_groups_command("KILL", [(p.pid, p.ticks) for p in rest]),
                               check=False)
            for p in rest:
                with contextlib.suppress(TimeoutError):
                    p.wait(max(2.0, grace_s))


# --- files --------------------------------------------------------------------------------------


def sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """`mkdir -p` over SFTP, from the deepest folder up: a folder that exists (the common
    case: every copy of a run lands in the same few) costs one round trip, not one per
    component of the path."""
    try:
        sftp.stat(path)
        return
    except FileNotFoundError:
        pass
    parent = posixpath.dirname(path.rstrip("/"))
    if parent and parent != path:
        sftp_makedirs(sftp, parent)
    with contextlib.suppress(OSError):  # made meanwhile by a concurrent copy
        sftp.mkdir(path)


def sftp_put(sftp: paramiko.SFTPClient, local: Path, remote: str) -> None:
    """Copy a file or a directory tree onto the host; each file lands atomically (a temporary
    name beside it, then an atomic POSIX rename over the target)."""
    local = Path(local)
    if local.is_dir():
        sftp_makedirs(sftp, remote)
        for child in sorted(local.iterdir()):
            sftp_put(sftp, child, posixpath.join(remote, child.name))
        return
    sftp_makedirs(sftp, posixpath.dirname(remote))
    tmp = f"{remote}.tmp-{time.monotonic_ns()}"
    sftp.put(str(local), tmp)
    sftp.chmod(tmp, stat.S_IMODE(local.stat().st_mode))
    sftp.posix_rename(tmp, remote)


def sftp_get(sftp: paramiko.SFTPClient, remote: str, local: Path) -> bool:
    """Copy a host file or directory tree to `local` (merging); False if `remote` is missing.

    A directory is fetched whole into a staging folder first and only then moved into place,
    file by file: a fetch cut short by a lost host leaves `local` as it was, never an index
    (TF's `checkpoint` file) without the data it names."""
    try:
        attributes = sftp.stat(remote)
    except FileNotFoundError:
        return False
    local = Path(local)
    if not stat.S_ISDIR(attributes.st_mode or 0):
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.fetch-tmp")
        sftp.get(remote, str(tmp))
        tmp.replace(local)
        return True
    local.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{local.name}.fetch-", dir=local.parent))
    try:
        _get_tree(sftp, remote, staging)
        for path in sorted(staging.rglob("*")):
            target = local / path.relative_to(staging)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
        local.mkdir(parents=True, exist_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _get_tree(sftp: paramiko.SFTPClient, remote: str, local: Path) -> None:
    local.mkdir(parents=True, exist_ok=True)
    for entry in sftp.listdir_attr(remote):
        path = posixpath.join(remote, entry.filename)
        if stat.S_ISDIR(entry.st_mode or 0):
            _get_tree(sftp, path, local / entry.filename)
        else:
            sftp.get(path, str(local / entry.filename))
