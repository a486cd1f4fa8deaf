"""Trainer events (Contract 2): one `@event {json}` line on stdout per event, flushed at once."""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from trainer.layout import EVENT_PREFIX

# One constant per kind, so the trainer, the orchestrator, the simulator and analysis name each
# kind once (the orchestrator's own kinds live beside their owners: orchestrator/rundir/results.py).
EVENT_READY = "ready"
EVENT_TRAIN_START = "train_start"
EVENT_PHASE_START = "phase_start"
EVENT_PHASE_END = "phase_end"
EVENT_STEP = "step"
EVENT_CHECKPOINT = "checkpoint"
EVENT_EVAL = "eval"
EVENT_WORKER_FAILURE = "worker_failure"
EVENT_FAILURE = "failure"
EVENT_TRAIN_END = "train_end"
# transient servers (issue 4): see trainer/loop.py and trainer/control.py for the fields
EVENT_WORKER_STEPS = "worker_steps"
EVENT_WORKER_REJOINED = "worker_rejoined"
EVENT_PROTOCOL_SWITCH = "protocol_switch"
EVENT_PREEMPTION_NOTICE = "preemption_notice"
# performance and recovery (issues 11, 12): trainer/loop.py, trainer/startup.py
EVENT_STEPS_PER_CLOSURE = "steps_per_closure"
EVENT_CLOSURE_UNROLLED = "closure_unrolled"
EVENT_STARTUP = "startup"
EVENT_CHECKPOINT_SKIPPED = "checkpoint_skipped"
EVENT_WORKER_UNRESPONSIVE = "worker_unresponsive"
EVENT_WORKER_RESPONSIVE = "worker_responsive"
EVENT_PS_UNRESPONSIVE = "ps_unresponsive"
EVENT_PS_RESPONSIVE = "ps_responsive"
EVENT_EVAL_SKIPPED = "eval_skipped"
# held-out faults (issue 22): trainer/control.py `watch_lease`
EVENT_LEASE_LOST = "lease_lost"

KINDS = frozenset({
    EVENT_READY, EVENT_TRAIN_START, EVENT_PHASE_START, EVENT_PHASE_END, EVENT_STEP,
    EVENT_CHECKPOINT, EVENT_EVAL, EVENT_WORKER_FAILURE, EVENT_FAILURE, EVENT_TRAIN_END,
    EVENT_WORKER_STEPS, EVENT_WORKER_REJOINED, EVENT_PROTOCOL_SWITCH, EVENT_PREEMPTION_NOTICE,
    EVENT_STEPS_PER_CLOSURE, EVENT_CLOSURE_UNROLLED, EVENT_STARTUP, EVENT_CHECKPOINT_SKIPPED,
    EVENT_WORKER_UNRESPONSIVE, EVENT_WORKER_RESPONSIVE, EVENT_PS_UNRESPONSIVE,
    EVENT_PS_RESPONSIVE, EVENT_EVAL_SKIPPED, EVENT_LEASE_LOST,
})

_identity: dict[str, Any] = {"role": "unknown", "index": 0}
_lock = threading.Lock()  # TF logs from other threads must not split an event line


def set_identity(role: str, index: int) -> None:
    """Record who this process is; every later event carries `role` and `index`."""
    _identity["role"] = role
    _identity["index"] = int(index)


def role() -> str:
    """The role set by `set_identity` (for log prefixes)."""
    return str(_identity["role"])


def emit(kind: str, **fields: Any) -> dict[str, Any]:
    """Print one event line and return the record (handy for tests).

    `time`, `role` and `index` are filled in here; callers pass only their own fields.
    Unknown kinds are rejected so a typo cannot silently create a new event type.
    """
    assert kind in KINDS, f"unknown event kind {kind!r}; valid: {sorted(KINDS)}"
    record: dict[str, Any] = {"kind": kind, "time": round(time.time(), 3), **_identity, **fields}
    line = EVENT_PREFIX + json.dumps(record, default=_jsonable, sort_keys=False)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    return record


def parse_event(line: str) -> dict[str, Any] | None:
    """Return the event in a stdout line, or None when the line is plain log text."""
    if not line.startswith(EVENT_PREFIX):
        return None
    return json.loads(line[len(EVENT_PREFIX):])


def _jsonable(value: Any) -> Any:
    # numpy scalars and tensors reach here; anything else is a bug worth seeing as text
    if hasattr(value, "item"):
        return value.item()
    return str(value)


#: ``error_kind`` of a ``failure`` event whose cause is a full disk: the run ends at once, since
#: a restart on the same disk fails the same way (orchestrator/runtime/supervisor.py).
DISK_FULL = "disk_full"
_ENOSPC_TEXT = "No space left on device"  # TensorFlow's file errors carry only the text


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is ENOSPC: an OSError errno 28, or a TensorFlow file
    error saying so."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        if _ENOSPC_TEXT in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def disk_full_fields(exc: BaseException, folders: Iterable[str]) -> dict[str, Any]:
    """The ``failure`` event's extra fields for a full disk (``{}`` for any other error):
    ``error_kind`` and ``path``, the folder that is full: the failed file's own when the error
    names it, else the one of `folders` (where this role writes) with the least free space,
    since Python's ENOSPC from a write or close names no file."""
    if not is_disk_full(exc):
        return {}
    named = getattr(exc, "filename", None)
    candidates = [os.path.dirname(os.path.abspath(named))] if named else []
    free: list[tuple[int, str]] = []
    for folder in [*candidates, *folders]:
        try:
            stat = os.statvfs(folder)
        except OSError:
            continue
        free.append((stat.f_bavail * stat.f_frsize, os.path.abspath(folder)))
    fields: dict[str, Any] = {"error_kind": DISK_FULL}
    if candidates:
        fields["path"] = candidates[0]
    elif free:
        fields["path"] = min(free)[1]
    if free:
        fields["free_bytes"] = next((b for b, f in free if f == fields.get("path")), min(free)[0])
    return fields


def disk_full_line(who: str, folder: str | None, free_bytes: int | None = None) -> str:
    """The run's error when a disk filled up: who could not write, where, and why no restart
    was tried (another attempt writes to the same disk)."""
    where = f" in {folder}" if folder else ""
    free = f" ({free_bytes / 1e6:.1f} MB free)" if isinstance(free_bytes, int) else ""
    return (f"disk full: {who} could not write{where}{free}: No space left on device; "
            f"stopped without a restart (it would write to the same disk): free space there "
            f"and run again")
