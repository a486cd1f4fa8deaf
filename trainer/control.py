"""Side channels of a run: the orchestrator's control file, preemption notices, PS loss.

Control file (orchestrator -> chief), `spec.control_path` (default `<run_dir>/control.json`),
written atomically by the orchestrator (write a temp file, then rename):

    {"seq": int, "protocol": "asp" | "bsp" | null, "checkpoint": int}

- The chief polls it between chunks/steps at most every CONTROL_POLL_S (a `stat` first; the
  JSON is read only when mtime or size changed) and acts only on a higher `seq`.
- `protocol` non-null overrides the protocol in place (the same switch as at a phase
  boundary, no restart) and stays in force, across phase boundaries too, until a control
  with `protocol: null` hands it back to the schedule. Emits `protocol_switch`
  `{"from", "to", "step", "switch_s", "detect_s", "reason": "control"}` when the protocol
  actually changes; `switch_s` runs from the poll that saw the file (or from the end of a
  checkpoint requested in the same control) to the first step the new protocol applied:
  draining the old protocol's closures plus one step; `detect_s` from the file's mtime to
  that poll.
- `checkpoint` higher than at the last poll: save a checkpoint now (`checkpoint` event with
  `"reason": "control"`). The value the chief finds at train start is the baseline.

Preemption notice: every role watches the file named by env TRANSIENT_PREEMPTION_NOTICE
(provisioning/base.py: JSON `{"host_id", "deadline"}`) in a daemon thread every
NOTICE_POLL_S and emits `preemption_notice` `{"deadline", "host_id"}` once when it appears;
the chief then saves a checkpoint (`"reason": "notice"`).

Lease: a role started by the orchestrator gets a lease file (env TRANSIENT_LEASE), the
generation it was started under (TRANSIENT_LEASE_TOKEN) and a term (TRANSIENT_LEASE_S); the
orchestrator rewrites the file (its token) every few seconds while it wants the roles of that
work dir (orchestrator/runtime/deploy.py). `watch_lease` checks it every LEASE_POLL_S and ends
the role (`lease_lost` `{"reason"}`, exit EXIT_LEASE_LOST) when the file is gone, names another
generation (a newer deployment replaced this one), or was not renewed for the term (the
orchestrator is gone, or dropped this machine: a frozen machine that thaws after the run went
on without it). Without the variable (a role started by hand) there is no lease.

Parameter-server loss: the chief probes every PS port each PS_PROBE_S; after
PS_PROBE_FAILURES failed probes in a row, or when the coordinator raises for a PS, it emits
`failure` `{"error", "error_kind": "ps_unavailable"}` and exits with EXIT_PS_UNAVAILABLE (3)
at once (os._exit: the coordinator's threads may be blocked on the dead PS). The
orchestrator restarts the cluster; the new chief resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from trainer import events, layout

CONTROL_POLL_S = 0.25
NOTICE_POLL_S = 0.5
NOTICE_ENV = layout.NOTICE_ENV
PS_PROBE_S = 1.0
LEASE_POLL_S = 1.0
LEASE_ENV, LEASE_TOKEN_ENV, LEASE_S_ENV = layout.LEASE_ENV, layout.LEASE_TOKEN_ENV, layout.LEASE_S_ENV
EXIT_LEASE_LOST = layout.EXIT_LEASE_LOST
PS_PROBE_FAILURES = 2
EXIT_PS_UNAVAILABLE = layout.EXIT_PS_UNAVAILABLE


@dataclass
class Control:
    seq: int = 0
    protocol: str | None = None
    checkpoint: int = 0


class ControlChannel:
    """The chief's view of the control file; `poll()` is cheap enough to call every step."""

    def __init__(self, path: str | Path, poll_s: float = CONTROL_POLL_S) -> None:
        self.path, self.poll_s = Path(path), poll_s
        self.state = Control()
        self.mtime = 0.0  # the file's mtime when the current state was read
        self.seen_at = 0.0  # when the poll read it
        self._stamp: tuple[float, int] | None = None
        self._last_poll = 0.0
        self._checkpoint_seen = 0

    def start(self) -> Control:
        """Read the file as it is at train start: its protocol applies, its checkpoint
        counter is the baseline (a request made to an earlier chief is not repeated)."""
        self._last_poll = 0.0
        self.poll(force=True)
        self._checkpoint_seen = self.state.checkpoint
        return self.state

    def poll(self, force: bool = False) -> Control | None:
        """The new control when the file changed to a higher seq, else None."""
        now = time.time()
        if not force and now - self._last_poll < self.poll_s:
            return None
        self._last_poll = now
        try:
            st = self.path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return None
        try:
            data = json.loads(self.path.read_text())
            control = Control(seq=int(data.get("seq", 0)), protocol=data.get("protocol"),
                              checkpoint=int(data.get("checkpoint", 0)))
            assert control.protocol in (None, "asp", "bsp"), control.protocol
        except (OSError, ValueError, AssertionError, AttributeError) as exc:
            print(f"[chief] ignoring control file {self.path}: {exc!r}", flush=True)
            return None  # not recorded in _stamp: a rewrite is read again
        self._stamp = stamp
        if control.seq <= self.state.seq and self.state.seq:
            return None
        self.state, self.mtime, self.seen_at = control, st.st_mtime, now
        return control

    def take_checkpoint_request(self) -> bool:
        """True once per increase of the `checkpoint` counter."""
        if self.state.checkpoint > self._checkpoint_seen:
            self._checkpoint_seen = self.state.checkpoint
            return True
        return False


class NoticeWatcher:
    """Polls the preemption-notice file in a daemon thread; `received` is set once seen."""

    def __init__(self, path: str | None, poll_s: float = NOTICE_POLL_S) -> None:
        self.path = Path(path) if path else None
        self.poll_s = poll_s
        self.received = threading.Event()
        self.notice: dict[str, Any] = {}
        self._handled = False

    def start(self) -> NoticeWatcher:
        if self.path is not None:
            threading.Thread(target=self._run, name="preemption-notice", daemon=True).start()
        return self

    def _run(self) -> None:
        tries = 0
        while True:
            if self.path.exists():
                tries += 1
                try:
                    self.notice = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    if tries < 3:  # caught mid-write: read it again at the next poll
                        time.sleep(self.poll_s)
                        continue
                    self.notice = {}
                events.emit(events.EVENT_PREEMPTION_NOTICE, deadline=self.notice.get("deadline"),
                            host_id=self.notice.get("host_id"))
                self.received.set()
                return
            time.sleep(self.poll_s)

    def take(self) -> bool:
        """True once, after the notice arrived (the chief's checkpoint trigger)."""
        if self.received.is_set() and not self._handled:
            self._handled = True
            return True
        return False


_watcher: NoticeWatcher | None = None


def watch_preemption_notice() -> NoticeWatcher:
    """Start (once per process) the watcher of the file named by TRANSIENT_PREEMPTION_NOTICE;
    a no-op watcher when the variable is unset."""
    global _watcher
    if _watcher is None:
        _watcher = NoticeWatcher(os.environ.get(NOTICE_ENV)).start()
    return _watcher


def lease_lapsed(path: Path, token: str, term_s: float, now: float | None = None) -> str | None:
    """Why the lease at `path` no longer holds for generation `token` (None while it holds).
    The file's mtime and `now` are both this host's clock, so the orchestrator's clock
    does not matter."""
    try:
        renewed = path.stat().st_mtime
        holder = path.read_text().strip()
    except OSError:
        return f"lease file {path} is gone"
    if holder != token:
        return f"replaced: the lease names generation {holder!r}, this role is {token!r}"
    silent = (time.time() if now is None else now) - renewed
    if silent > term_s:
        return f"the orchestrator has not renewed the lease for {silent:.0f} s (term {term_s:g} s)"
    return None


def watch_lease(environ: dict[str, str] | None = None,
                poll_s: float = LEASE_POLL_S) -> threading.Thread | None:
    """End this role (os._exit(EXIT_LEASE_LOST), after a `lease_lost` event) once its lease
    lapses (module docstring); None, and nothing watched, without TRANSIENT_LEASE."""
    env = os.environ if environ is None else environ
    if not env.get(LEASE_ENV):
        return None
    path, token = Path(env[LEASE_ENV]), env.get(LEASE_TOKEN_ENV, "")
    term_s = float(env.get(LEASE_S_ENV) or 60.0)

    def run() -> None:
        while True:
            time.sleep(poll_s)
            reason = lease_lapsed(path, token, term_s)
            if reason is not None:
                try:
                    events.emit(events.EVENT_LEASE_LOST, reason=reason)
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:  # a closed stdout (its reader gone) must not keep the role alive
                    os._exit(EXIT_LEASE_LOST)

    thread = threading.Thread(target=run, name="lease", daemon=True)
    thread.start()
    return thread


_ps_lost_lock = threading.Lock()


def ps_lost(error: str) -> NoReturn:
    """Emit the `ps_unavailable` failure once and leave with exit code 3, now."""
    with _ps_lost_lock:
        events.emit(events.EVENT_FAILURE, error=error[:500], error_kind="ps_unavailable")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_PS_UNAVAILABLE)


def unreachable(addresses: list[str], timeout_s: float = 1.0) -> list[str]:
    """The addresses that refuse (or time out) a TCP connection."""
    dead = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
        except OSError:
            dead.append(address)
    return dead


def start_ps_watchdog(ps_addresses: list[str], period_s: float = PS_PROBE_S,
                      failures: int = PS_PROBE_FAILURES) -> threading.Thread:
    """A daemon thread that calls `ps_lost` after `failures` failed probes in a row, so the
    chief leaves promptly wherever its main thread is blocked."""

    def run() -> None:
        strikes = 0
        while True:
            time.sleep(period_s)
            dead = unreachable(ps_addresses)
            strikes = strikes + 1 if dead else 0
            if strikes >= failures:
                ps_lost(f"parameter server unreachable: {', '.join(dead)}")

    thread = threading.Thread(target=run, name="ps-watchdog", daemon=True)
    thread.start()
    return thread


class Budget:
    """Phase budgets in BSP-equivalent steps, counted in units of 1/N BSP step (integers).

    A BSP global step uses N units, an ASP global step 1 unit (N = workers in the spec).
    Phase i ends when the units used reach `ends[i]`; without overrides that is exactly at
    the phase's global-step target `spec.phases[i].end_step`.
    """

    def __init__(self, phases: list[Any], workers: int) -> None:
        self.workers = workers
        self.ends: list[int] = []
        previous_step, total = 0, 0
        for phase in phases:
            total += (phase.end_step - previous_step) * self.weight(phase.protocol)
            self.ends.append(total)
            previous_step = phase.end_step
        self._phases = phases

    def weight(self, protocol: str) -> int:
        return self.workers if protocol == "bsp" else 1

    def steps_left(self, used: int, phase: int, protocol: str) -> int:
        """Global steps of `protocol` that use up phase `phase`'s budget (rounded up)."""
        left = max(0, self.ends[phase] - used)
        return -(-left // self.weight(protocol))

    def units_at_step(self, step: int) -> int:
        """Units used at a global step when the schedule was followed (old checkpoints)."""
        used, previous_step = 0, 0
        for phase in self._phases:
            span = max(0, min(step, phase.end_step) - previous_step)
            used += span * self.weight(phase.protocol)
            previous_step = phase.end_step
        return used + max(0, step - previous_step) * self.weight(self._phases[-1].protocol)
