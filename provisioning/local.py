"""The `local` backend: every host is 127.0.0.1 with its own reserved port and work dir.

Nothing survives the orchestrator: each started process leads its own process group
(`start_new_session`), gets SIGKILL when its parent dies (Linux `PR_SET_PDEATHSIG`), and
`stop_all` / `release` signal whole groups. With a journal, each group is recorded right after
it is forked (the parent-death signal covers the instant before), so `provisioning.journal`
can clean up after a crash.

Caveat: PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process.
So every process is forked by one long-lived launcher thread of this module, whichever thread
calls `HostRunner.start`: the quirk stays inside this backend.

Every host's work dir is `<request.workdir>/hosts/<machine id>/`; roles start there. The run's
interpreter is this one (or `LocalProviderConfig.python`) with this checkout on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioning.base import (
    PREEMPTION_NOTICE_FILE,
    STOP_GRACE_S,
    CleanUpResult,
    Cluster,
    ClusterRequest,
    Host,
    HostId,
    HostLostError,
    HostRunner,
    HostSpec,
    HostState,
    Provider,
    ProviderConfig,
    RemoteProcess,
    ResourceJournal,
)
from provisioning.checkout import PROJECT_ROOT, is_checkout
from provisioning.journal import (
    JournalEntry,
    ResourceKind,
    list_recorded_members,
    read_process_start_ticks,
    stop_local_group,
)
from provisioning.registry import register_provider

LOCAL_ADDRESS = "127.0.0.1"
#: How often wait(timeout_s) checks a process that has not exited yet (wait() blocks instead).
WAIT_POLL_INTERVAL_S = 0.02
#: Default delay before a replacement host is "ready" (GCE measured 66-78 s; tests use 0).
PROVISION_DELAY_S = 0.0
_PR_SET_PDEATHSIG = 1


@dataclass
class LocalProviderConfig(ProviderConfig):
    """`provider=local`: every role is an OS process on this machine."""

    name: str = "local"
    python: str | None = None  # interpreter for the roles; None = the orchestrator's
    provision_delay_s: float = PROVISION_DELAY_S  # how long replace() blocks (simulated)
    stop_grace_s: float = STOP_GRACE_S  # SIGTERM-to-SIGKILL grace of release and replace

# Ports handed to live hosts of every LocalProvider in this process, so two hosts never collide
# even though the trainer binds them only later.
_reserved_ports: set[int] = set()
_ports_lock = threading.Lock()
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def reserve_port() -> int:
    """A free TCP port on 127.0.0.1 that no other live local host holds."""
    with _ports_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOCAL_ADDRESS, 0))
                port = sock.getsockname()[1]
            if port not in _reserved_ports:
                _reserved_ports.add(port)
                return port


def free_port(port: int) -> None:
    """Return a port from reserve_port(); freeing an unknown port is a no-op."""
    with _ports_lock:
        _reserved_ports.discard(port)


def parent_death_preexec(parent_pid: int, sig: int = signal.SIGKILL):
    """preexec_fn for a child: get ``sig`` when the parent (the forking thread) dies; SIGTERM
    lets it clean up first. Loads nothing after fork (libc preloaded)."""

    def set_parent_death_signal() -> None:
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        # The parent may have died between fork and prctl; then nobody would signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return set_parent_death_signal


class _Launcher:
    """One long-lived thread that forks every child, so the parent-death signal (tied to the
    forking *thread*) fires only when the orchestrator process itself dies."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, job: Callable[[], Any]) -> Any:
        if threading.current_thread() is threading.main_thread():
            return job()  # the main thread lives as long as the process
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="local-launcher",
                                                daemon=True)
                self._thread.start()
        reply: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._jobs.put((job, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            job, reply = self._jobs.get()
            try:
                reply.put((True, job()))
            except BaseException as error:  # handed to the caller
                reply.put((False, error))


_launcher = _Launcher()


def _leader_exited(pid: int, block: bool = False) -> bool:
    """True once `pid` has exited, without reaping it: its zombie keeps the pgid from reuse.
    `block`: wait until it has (its exit seen when it happens, not a poll later)."""
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, pid, flags) is not None
    except ChildProcessError:  # already reaped by another thread
        return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class LocalProcess(RemoteProcess):
    """A child process leading its own process group. When the leader exits, the rest of its
    group is SIGKILLed before the leader is reaped, so a process and its helpers die together."""

    def __init__(
        self,
        popen: subprocess.Popen[str],
        host: Host,
        journal: ResourceJournal | None = None,
    ) -> None:
        self._popen = popen
        self._host = host
        self._journal = journal
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        with self._lock:
            if self._popen.returncode is not None:
                return self._popen.returncode
            if not _leader_exited(self.pid):
                return None
            _signal_group(self.pid, signal.SIGKILL)
            code = self._popen.wait()
        if self._journal is not None:
            self._journal.record_process_group_released(
                backend=LocalProvider.name, host_id=self._host.id, address=self._host.address,
                pgid=self.pid)
        return code

    def wait(self, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.poll()) is None:
            if deadline is None:  # until the leader exits, left unreaped for poll() to kill
                _leader_exited(self.pid, block=True)  # its group first
                continue
            if time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.pid} still running after {timeout_s} s")
            time.sleep(WAIT_POLL_INTERVAL_S)
        return code

    def terminate(self) -> None:
        if self.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.poll() is None:
            _signal_group(self.pid, signal.SIGKILL)

    def readline(self) -> str:
        assert self._popen.stdout is not None, "started without a stdout pipe"
        try:
            return self._popen.stdout.readline()
        except ValueError:  # pipe closed by stop_all
            return ""


def stop_processes(processes: Sequence[LocalProcess], grace_s: float) -> None:
    """SIGTERM every group at once, wait up to `grace_s` in total, SIGKILL the rest; reap all.
    `grace_s` 0 sends SIGKILL straight away."""
    for process in processes:
        if grace_s > 0:
            process.terminate()
        else:
            process.kill()
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            process.kill()
            process.wait()


class LocalHostRunner(HostRunner):
    """Runs processes for one local host and remembers them until they are stopped."""

    shares_orchestrator_fs = True

    def __init__(self, host: Host, journal: ResourceJournal | None = None,
                 python: str | None = None) -> None:
        self.host = host
        self._journal = journal
        self._python = python or sys.executable
        self._processes: list[LocalProcess] = []
        self._lock = threading.Lock()
        self._gone = False  # revoked or released

    @property
    def notice_path(self) -> Path:
        return self.host.workdir / PREEMPTION_NOTICE_FILE

    def trainer_command(self) -> list[str]:
        return [self._python, "-m", "trainer"]

    def trainer_env(self) -> dict[str, str]:
        # a checkout's packages may not be installed; an installed tool's already are, and its
        # site-packages on PYTHONPATH would go before the standard library
        return {"PYTHONPATH": str(PROJECT_ROOT)} if is_checkout() else {}

    def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path | None,
        log_path: Path | None,
    ) -> LocalProcess:
        with self._lock:
            if self._gone:
                raise HostLostError(self.host.id)
            full_env = {**os.environ, **env}
            with open(log_path or os.devnull, "ab") as stderr:
                popen = _launcher.run(lambda: subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    cwd=self._resolve(cwd) if cwd is not None else self.host.workdir,
                    env=full_env,
                    text=True,
                    bufsize=1,
                    start_new_session=True,
                    preexec_fn=parent_death_preexec(os.getpid()),
                ))
            if self._journal is not None:
                self._journal.record_process_group(
                    backend=LocalProvider.name, host_id=self.host.id, address=self.host.address,
                    pid=popen.pid, pgid=popen.pid, argv=list(argv),
                    start_ticks=read_process_start_ticks(popen.pid))
            process = LocalProcess(popen, self.host, self._journal)
            self._processes.append(process)
            return process

    def _resolve(self, remote: Path) -> Path:
        return self.host.workdir / remote  # an absolute `remote` stays as it is

    def copy(self, local: Path, remote: Path) -> None:
        if self._gone:
            raise HostLostError(self.host.id)
        target = self._resolve(remote)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(local).is_dir():
            shutil.copytree(local, target, dirs_exist_ok=True)
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copy2(local, tmp)
        tmp.replace(target)  # atomic: a polling role never reads half a file

    def fetch(self, remote: Path, local: Path) -> bool:
        source = self._resolve(remote)
        if not source.exists():
            return False
        local = Path(local)
        if source.resolve() == local.resolve():
            return True  # already where it was asked for (the orchestrator's own folder)
        local.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, local, dirs_exist_ok=True)
        else:
            shutil.copy2(source, local)
        return True

    def alive(self) -> bool:
        return not self._gone

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        stop_processes(self.take_processes(), grace_s)

    def take_processes(self) -> list[LocalProcess]:
        """Hand over every live process; the runner forgets them (the caller must stop them)."""
        with self._lock:
            processes, self._processes = self._processes, []
        return processes

    def mark_gone(self) -> None:
        self._gone = True


class LocalProvider(Provider):
    """Hosts are local process groups. Supports `revoke`, so revocation tests run in seconds.

    `config.provision_delay_s`: how long `replace` blocks before handing out replacement hosts
    (the provisioning delay to simulate); `config.stop_grace_s`: SIGTERM-to-SIGKILL grace of
    `release` and `replace`. `journal`: optional; every process group is recorded into it.
    A colocated host shares its machine's address and work dir; its machine's revocation and
    replacement take it too.
    """

    name = "local"
    can_revoke = True
    hosts_here = True
    runner_class: type[LocalHostRunner] = LocalHostRunner

    billed = False

    @classmethod
    def plan_note(cls, hosts: Sequence[HostSpec]) -> str:
        gpus = sorted({h.gpu for h in hosts if h.gpu})
        hosts_are = (f"GPUs ({', '.join(gpus)}) are simulated as CPU processes on this machine "
                     "(estimates assume real GPUs)"
                     if gpus else "every host is a process on this machine")
        unused = [what for what, asked in
                  (("machine types", any(h.machine_type != "local" for h in hosts)),
                   ("zones", any(h.zone for h in hosts))) if asked]
        return hosts_are + (f"; {' and '.join(unused)} are not used" if unused else "")

    def __init__(self, config: LocalProviderConfig | None = None, *,
                 journal: ResourceJournal | None = None,
                 provision_delay_s: float | None = None,
                 stop_grace_s: float | None = None) -> None:
        config = config or LocalProviderConfig()
        self.config = config
        self._journal = journal
        self._stop_grace_s = config.stop_grace_s if stop_grace_s is None else stop_grace_s
        self._provision_delay_s = (config.provision_delay_s if provision_delay_s is None
                                   else provision_delay_s)
        self._runners: dict[HostId, LocalHostRunner] = {}
        self._states: dict[HostId, HostState] = {}  # by machine id
        self._workdirs: dict[str, Path] = {}  # run_id -> request.workdir
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def acquire(self, request: ClusterRequest) -> Cluster:
        self._workdirs[request.run_id] = request.workdir
        hosts: list[Host] = []
        for spec in request.hosts:
            on = next((h for h in hosts if h.spec.name == spec.colocate_with), None)
            hosts.append(self._new_host(request.run_id, spec, machine=on))
        return Cluster(run_id=request.run_id, hosts=hosts)

    def runner(self, host: Host) -> LocalHostRunner:
        try:
            return self._runners[host.id]
        except KeyError:
            raise HostLostError(host.id, f"host {host.id} was not acquired here") from None

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        return {h.id: self._states.get(h.machine, HostState.REVOKED) for h in cluster.hosts}

    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        lost_ids = set(cluster.same_machine(list(lost)))  # KeyError for a stranger
        time.sleep(self._provision_delay_s)
        hosts: list[Host] = []
        new_machines: dict[HostId, Host] = {}  # old machine id -> its replacement host
        for host in cluster.hosts:
            if host.id in lost_ids:
                # The replacement takes over the lost host's endpoint: TensorFlow's cluster spec
                # is fixed for a coordinator's lifetime, and a worker restarted at the same
                # address rejoins the running job by itself (GCE: reuse the static internal IP).
                self._release_host(host, HostState.REVOKED, keep_port=keep_endpoints)
                host_new = self._new_host(cluster.run_id, host.spec,
                                          port=host.port if keep_endpoints else None,
                                          machine=new_machines.get(host.machine))
                if not host.colocated:
                    new_machines[host.id] = host_new
                host = host_new
            hosts.append(host)
        return Cluster(run_id=cluster.run_id, hosts=hosts)

    def release(self, cluster: Cluster) -> None:
        runners = [self._runners[h.id] for h in cluster.hosts if h.id in self._runners]
        for runner in runners:
            runner.mark_gone()
        # One grace period for the whole cluster, not one per host.
        stop_processes([p for r in runners for p in r.take_processes()], self._stop_grace_s)
        for host in cluster.hosts:
            self._release_host(host, HostState.TERMINATED)

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        runner = self.runner(host)
        if notice_s <= 0:
            self._kill_machine(host.machine)
            return
        notice = {"host_id": host.id, "deadline": time.time() + notice_s}
        tmp = runner.notice_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(notice) + "\n")
        tmp.replace(runner.notice_path)  # atomic: a reader never sees half a notice
        timer = threading.Timer(notice_s, self._kill_machine, args=(host.machine,))
        timer.daemon = True
        timer.start()

    def clean_up(self, entries: Sequence[JournalEntry],
                 grace_s: float = STOP_GRACE_S) -> list[CleanUpResult]:
        """Stop recorded process groups still alive on this machine (checked against their
        recorded start time, so a reused pid is left alone); never touch another machine's."""
        results = []
        for entry in entries:
            if entry.kind is not ResourceKind.PROCESS_GROUP or entry.pgid is None:
                results.append(CleanUpResult(entry, False, f"{entry.kind} {entry.resource_id} "
                                             f"(host {entry.host_id}): not a local process "
                                             f"group; left alone"))
            elif entry.address not in (None, LOCAL_ADDRESS):
                results.append(CleanUpResult(entry, False, f"process group {entry.pgid} on "
                                             f"{entry.address}: not on this machine; left alone"))
            elif members := list_recorded_members(entry):
                stop_local_group(entry.pgid, grace_s)
                results.append(CleanUpResult(entry, True, f"killed process group {entry.pgid} "
                                             f"(host {entry.host_id}, {len(members)} "
                                             f"process(es))"))
            else:
                results.append(CleanUpResult(entry, True))
        return results

    def _new_host(self, run_id: str, spec: HostSpec, port: int | None = None,
                  machine: Host | None = None) -> Host:
        with self._lock:
            host_id = f"{run_id}-{spec.name}-{next(self._ids)}"
        if machine is None:
            workdir = Path(self._workdirs.get(run_id, Path.cwd())) / "hosts" / host_id
            workdir.mkdir(parents=True, exist_ok=True)
            self._states[host_id] = HostState.RUNNING
        else:
            workdir = machine.workdir
        host = Host(
            id=host_id,
            spec=spec,
            address=LOCAL_ADDRESS,
            port=reserve_port() if port is None else port,
            workdir=workdir,
            state=HostState.RUNNING,
            machine=host_id if machine is None else machine.id,
        )
        self._runners[host_id] = self.runner_class(host, self._journal, self.config.python)
        return host

    def _kill_machine(self, machine: HostId) -> None:
        if self._states.get(machine) != HostState.RUNNING:
            return
        # REVOKED before the kill: whoever sees a process die then finds the cause in poll()
        self._states[machine] = HostState.REVOKED
        runners = [r for r in self._runners.values() if r.host.machine == machine]
        for runner in runners:
            runner.mark_gone()
        stop_processes([p for r in runners for p in r.take_processes()], grace_s=0.0)

    def _release_host(self, host: Host, final_state: HostState, keep_port: bool = False) -> None:
        runner = self._runners.get(host.id)
        if runner is None:
            return
        runner.mark_gone()
        runner.stop_all(self._stop_grace_s)
        if not keep_port:
            free_port(host.port)
        if not host.colocated and not self._states.get(host.id, HostState.REVOKED).is_terminal():
            self._states[host.id] = final_state


register_provider(LocalProvider.name, LocalProvider, LocalProviderConfig)
