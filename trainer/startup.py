"""Where a role's start-up goes: one `startup` event per process, with its phases.

`startup` `{"total_s", "phases": {name: seconds, ...}}`. The clock starts when the OS
created the process (Linux /proc; elsewhere when this module was imported), so
`phases.interpreter` is the Python start-up and our own light imports before TensorFlow.
Phases, in order, as a role passes them:

- every role: `interpreter`, `import_tf`;
- ps/worker: `server` (the gRPC server up and listening);
- chief: `data` (Keras import and dataset load, done while the servers start),
  `wait_servers` (until every ps/worker port accepts), `connect` (strategy and
  coordinator), `model` (per-worker datasets, variables on the PS, checkpoint restore, the
  ASP step's trace and instantiation on the workers), `first_step` (the first closures);
- evaluator: `model` (dataset and local model built).

The chief's `total_s` therefore runs from its process start to its first applied step.
"""

from __future__ import annotations

import os
import time

from trainer import events


def process_start_time() -> float:
    """Unix time at which the OS started this process (Linux), else now."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:  # not /proc/stat btime: whole seconds only
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class Startup:
    """Durations of consecutive start-up phases; `done()` emits them once."""

    def __init__(self) -> None:
        self.started = process_start_time()
        self.last = self.started
        self.phases: dict[str, float] = {}
        self.emitted = False

    def mark(self, phase: str) -> None:
        """The phase `phase` ends now (it began when the previous one ended)."""
        now = time.time()
        self.phases[phase] = round(now - self.last, 3)
        self.last = now

    def done(self, phase: str | None = None) -> None:
        """Mark the last phase and emit the `startup` event (once per process)."""
        if self.emitted:
            return
        if phase:
            self.mark(phase)
        self.emitted = True
        events.emit("startup", total_s=round(self.last - self.started, 3), phases=self.phases)


STARTUP = Startup()
