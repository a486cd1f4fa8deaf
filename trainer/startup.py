"""Where a role's start-up goes: one `startup` event per process, with its phases.

`startup` `{"total_s", "phases": {name: seconds, ...}, "cpu_s": {name: seconds, ...}}`. The
clock starts when the OS created the process (Linux /proc; elsewhere when this module was
imported), so `phases.interpreter` is the Python start-up and our own light imports before
TensorFlow. `cpu_s` is the CPU time the process used in each phase (user + system, every
thread): on a shared host the wall times depend on the neighbours, the CPU times much less.
Phases, in order, as a role passes them:

- every role: `interpreter`, `import_tf`;
- ps/worker: `server` (the gRPC server up and listening);
- chief: `data` (dataset load, done while the servers start),
  `wait_servers` (until every ps/worker port accepts), `connect` (strategy and
  coordinator), `model` (per-worker datasets, the model's and counters' variables created on
  the PS), `restore` (the newest checkpoint, if any), `trace` (the steps' traces and their
  instantiation on the workers), `first_step` (the first closures);
- evaluator: `model` (dataset and local model built).

The chief's `total_s` therefore runs from its process start to its first applied step.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import time
import types
from typing import Any

from trainer import events

# `import tensorflow` ends by importing Keras eagerly (for its SavedModel registrations), and
# Keras pulls in scikit-learn (for an optional wrapper), SciPy and pandas. The chief and the
# evaluator build the Keras model but never use its scikit-learn wrapper, which Keras imports
# inside try/except: 7.2 -> 5.6 CPU s. The entry is removed once TensorFlow is in, so a later
# import of the real module (the digits problem's first split) still works.
SKIPPED_AT_IMPORT = ("sklearn", "pandas", "matplotlib")


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


def process_cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Startup:
    """Durations of consecutive start-up phases; `done()` emits them once."""

    def __init__(self) -> None:
        self.started = process_start_time()
        self.last = self.started
        self.last_cpu = 0.0
        self.phases: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.emitted = False

    def mark(self, phase: str) -> None:
        """The phase `phase` ends now (it began when the previous one ended)."""
        now, cpu = time.time(), process_cpu_s()
        self.phases[phase] = round(now - self.last, 3)
        self.cpu[phase] = round(cpu - self.last_cpu, 3)
        self.last, self.last_cpu = now, cpu

    def done(self, phase: str | None = None) -> None:
        """Mark the last phase and emit the `startup` event (once per process)."""
        if self.emitted:
            return
        if phase:
            self.mark(phase)
        self.emitted = True
        events.emit(events.EVENT_STARTUP, total_s=round(self.last - self.started, 3),
                    phases=self.phases, cpu_s=self.cpu)


STARTUP = Startup()


def import_tensorflow() -> Any:
    """`import tensorflow` and Keras for the chief and the evaluator, without what they never
    use (SKIPPED_AT_IMPORT); marks the `import_tf` phase. Returns the module."""
    for name in SKIPPED_AT_IMPORT:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    try:
        import keras  # noqa: F401  (imported by TF already; here while the skip holds)
        import tensorflow as tf
    finally:
        for name in SKIPPED_AT_IMPORT:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    STARTUP.mark("import_tf")
    return tf


def import_server_lib() -> tuple[Any, Any]:
    """(server_lib, config_pb2): what a ps or worker needs to serve, without `import
    tensorflow`; marks the `import_tf` phase.

    A server only runs the functions the chief sends it: the kernels live in the shared
    libraries that `server_lib` loads, not in TensorFlow's Python API, whose import (the
    `tf.*` tree, tf.data, distribution strategies, Keras) is 90 % of a server's start-up CPU:
    measured 3.9 -> 0.7 CPU s. So the `tensorflow` package is entered without running its
    `__init__`: a bare package module whose path lets its submodules import. Falls back to
    the full import if that fails (a TensorFlow whose layout moved).
    """
    try:
        spec = importlib.util.find_spec("tensorflow")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("tensorflow is not a package here")
        if "tensorflow" not in sys.modules:
            package = types.ModuleType("tensorflow")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__, package.__file__ = spec, spec.origin
            sys.modules["tensorflow"] = package
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.training import server_lib
    except Exception as exc:  # the full import below works wherever TensorFlow does
        print(f"[server] light TensorFlow import failed ({exc!r}); importing all of it",
              flush=True)
        for name in [m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.")]:
            del sys.modules[name]
        import tensorflow as tf

        config_pb2 = tf.compat.v1  # has ConfigProto
        server_lib = types.SimpleNamespace(Server=tf.distribute.Server,
                                           ClusterSpec=tf.train.ClusterSpec)
    STARTUP.mark("import_tf")
    return server_lib, config_pb2
