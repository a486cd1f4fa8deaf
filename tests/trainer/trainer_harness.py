"""Launch trainer roles as real processes (each in its own process group) for slow tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.events import parse_event
from trainer.spec import JobSpec, PhaseSpec, TrainerSpec

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """Ports the OS just handed out; bound together so they are distinct."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def make_spec(run_dir: Path, workers: int, phases: list[PhaseSpec], ps: int = 1,
              **job: Any) -> TrainerSpec:
    ports = free_ports(ps + workers + 1)
    addr = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"ps": addr[:ps], "worker": addr[ps:ps + workers], "chief": addr[ps + workers:]}
    job.setdefault("train_steps", phases[-1].end_step)
    return TrainerSpec(run_id=run_dir.name, cluster=cluster, job=JobSpec(**job), phases=phases,
                       run_dir=str(run_dir), report_every_s=1.0)


class Role:
    """One `python -m trainer` process; its events are collected by a reader thread."""

    def __init__(self, spec_path: Path, role: str, index: int, log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name = f"{role}{index}"
        self.events: list[dict[str, Any]] = []
        self.log_path = log_dir / f"{self.name}.log"
        attempt = 1
        while self.log_path.exists():  # a role restarted on shared servers keeps both logs
            attempt += 1
            self.log_path = log_dir / f"{self.name}.{attempt}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", "--role", role, "--index", str(index),
             "--spec", str(spec_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                event = parse_event(line)
                if event:
                    self.events.append(event)

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in self.events:
                if e["kind"] == kind:
                    return e
            if self.proc.poll() is not None:
                time.sleep(0.2)
                break
            time.sleep(0.1)
        for e in self.events:
            if e["kind"] == kind:
                return e
        raise AssertionError(f"{self.name}: no {kind!r} event; log tail:\n{self.tail()}")

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class LocalCluster:
    """ps + workers started at once; chief and evaluator started by the test."""

    def __init__(self, spec: TrainerSpec, spec_path: Path) -> None:
        self.spec, self.spec_path = spec, spec_path
        self.log_dir = Path(spec.run_dir) / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        spec.to_json(spec_path)
        self.roles: list[Role] = []
        self.servers = [self.start(r, i) for r in ("ps", "worker")
                        for i in range(len(spec.cluster[r]))]

    def start(self, role: str, index: int = 0, spec_path: Path | None = None,
              env: dict[str, str] | None = None) -> Role:
        r = Role(spec_path or self.spec_path, role, index, self.log_dir, env)
        self.roles.append(r)
        return r

    def train(self, timeout: float = 120, evaluator: bool = True,
              spec_path: Path | None = None) -> tuple[Role, Role | None]:
        """Start the chief (and evaluator), wait for both to exit 0."""
        chief = self.start("chief", 0, spec_path)
        ev = self.start("evaluator", 0, spec_path) if evaluator else None
        return self.finish(chief, ev, timeout)

    def finish(self, chief: Role, ev: Role | None,
               timeout: float = 120) -> tuple[Role, Role | None]:
        """Wait for a started chief (and evaluator) to exit 0."""
        rc = chief.wait(timeout)
        assert rc == 0, f"chief exited {rc}:\n{chief.tail()}"
        if ev is not None:
            rc = ev.wait(60)
            assert rc == 0, f"evaluator exited {rc}:\n{ev.tail()}"
        return chief, ev

    def stop(self) -> None:
        for r in self.roles:
            r.kill()


#: How long a test keeps a worker hung after the chief named it: past the heartbeat's naming
#: (~5 s) and every wait of the chief's own (a report's fetch, a drain's poll, a checkpoint),
#: several times over. Not past gRPC keepalive (time + timeout ~5.5 min, trainer/keepalive.py):
#: a worker hung that long has its calls failed and is then treated as killed, which the
#: killed-worker tests cover.
HUNG_S = 12.0


@contextlib.contextmanager
def serving_cluster(root: Path, workers: int, ready_s: float = 90) -> Iterator[LocalCluster]:
    """The ps and `workers` worker processes of a module's tests, started and ready; each
    test starts its own chief against them. Killed on exit."""
    local = LocalCluster(make_spec(root, workers, [PhaseSpec("asp", 10)]),
                         root / "trainer_spec.json")
    try:
        for server in local.servers:
            server.wait_event("ready", timeout=ready_s)
        yield local
    finally:
        local.stop()


def wait_for_step(chief: Role, step: int, timeout: float = 90) -> None:
    """Until the chief has reported global step `step` or later."""
    deadline = time.time() + timeout
    while not any(e["step"] >= step for e in chief.of_kind("step")):
        assert time.time() < deadline and chief.proc.poll() is None, chief.tail()
        time.sleep(0.1)


def wait_for_closures_settled(chief: Role, protocol: str, timeout: float = 180) -> None:
    """Until the chief has chosen `protocol`'s steps per closure and, if more than one,
    traced that closure (`closure_unrolled`, in the background). A worker that hangs before
    that trace is registered holds the whole chief until it resumes (trainer/closures.py
    `prepare_unrolled`): a limit of its own, not what the hang tests inject into."""
    deadline = time.time() + timeout

    def first(kind: str) -> dict[str, Any] | None:
        return next((e for e in chief.events
                     if e["kind"] == kind and e.get("protocol") == protocol), None)

    while time.time() < deadline and chief.proc.poll() is None:
        chosen = first("steps_per_closure")
        if chosen is not None and (chosen["steps"] <= 1 or first("closure_unrolled")):
            return
        time.sleep(0.1)
    raise AssertionError(f"{protocol}: closures not settled; log tail:\n{chief.tail()}")


def hang(chief: Role, victim: Role, index: int, hold_s: float,
         timeout: float = 60) -> tuple[dict[str, Any], float, float]:
    """SIGSTOP worker `victim` (task `index`) until `hold_s` after the chief names it hung
    (its `worker_unresponsive`), then SIGCONT. Returns (that event, when it was stopped, when
    it was resumed: taken before SIGCONT, as the worker may answer before this returns)."""
    os.kill(victim.proc.pid, signal.SIGSTOP)
    stopped = time.time()
    try:
        deadline = stopped + timeout
        while True:
            named = [e for e in chief.of_kind("worker_unresponsive")
                     if e["worker"] == index and e["time"] >= stopped - 1]
            if named:
                break
            assert time.time() < deadline and chief.proc.poll() is None, chief.tail()
            time.sleep(0.1)
        time.sleep(max(0.0, named[0]["time"] + hold_s - time.time()))
    finally:
        resumed = round(time.time(), 3)  # event times are rounded to the millisecond
        os.kill(victim.proc.pid, signal.SIGCONT)
    return named[0], stopped, resumed


def reported_between(chief: Role, start: float, end: float,
                     kinds: tuple[str, ...] = ("step", "checkpoint")) -> list[tuple[str, int]]:
    """(kind, step) of the chief's `kinds` events between `start` and `end` (role clock)."""
    return [(e["kind"], e["step"]) for e in chief.events
            if start < e["time"] < end and e["kind"] in kinds]
