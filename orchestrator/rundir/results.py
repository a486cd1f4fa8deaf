"""The results schema (every file and field name) and the writers of one run directory.

``analysis/`` depends on these names only. Bump SCHEMA_VERSION when a field changes meaning.

Run directory::

    config.yaml        resolved config, sorted keys, written before anything starts
    plan.json          the RunPlan (hosts, prices, phases, estimates)
    trainer_spec.json  what every trainer role was started with
    events.jsonl       append-only, one JSON object per line, flushed per line
    metrics.csv        wall_time_s, global_step, steps_per_sec, loss, eval_accuracy
    summary.json       written atomically at the end (SUMMARY_FIELDS)
    error.txt          only on failure
    run.lock           the owner (host, pid) of a run in progress; locked while it lives
    tensorboard/       TensorFlow event files (train/, eval/)
    checkpoints/       tf.train.CheckpointManager output
    logs/              one log per role process
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

# The run layout's names, re-exported: results and hosts use the same ones (trainer/layout.py).
from trainer.layout import CHECKPOINT_DIR, LOGS_DIR, SPEC_FILE, TENSORBOARD_DIR  # noqa: F401

SCHEMA_VERSION = 1
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
EVENTS_FILE = "events.jsonl"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
ERROR_FILE = "error.txt"
LOCK_FILE = "run.lock"
#: How often (at most) events check that the whole-file results are still there.
CHECK_FILES_EVERY_S = 2.0

# Event fields filled by the framework (auto): time (unix s), kind, role; the rest is reported.
EVENT_TIME = "time"  # auto, unix seconds
EVENT_KIND = "kind"  # auto: provision, provisioned, start, ready, train_start, phase_start,
#                      phase_end, step, checkpoint, eval, failure, train_end, teardown,
#                      result_file_lost (a result file was removed or truncated during the run
#                      and recreated), resumed, killed; the trainer's kinds are trainer/events.py
#                      EVENT_*, recovery's orchestrator/transient/recovery.py, stragglers'
#                      transient/stragglers.py, deployment's runtime/deploy.py
EVENT_ROLE = "role"  # auto: orchestrator | ps | worker | chief | evaluator
#: The role of the events the orchestrator itself records (the others: trainer/layout.py ROLES).
ROLE_ORCHESTRATOR = "orchestrator"

# The orchestrator's own kinds, the same for a real and a simulated run.
EVENT_PROVISION = "provision"  # hosts, provider: acquiring the hosts starts
EVENT_PROVISIONED = "provisioned"  # hosts: every host is up
EVENT_START = "start"  # roles: the trainer roles are being started
EVENT_TEARDOWN = "teardown"  # the hosts are being released
EVENT_RESULT_FILE_LOST = "result_file_lost"  # file, reason, lost_bytes
EVENT_RESUMED = "resumed"  # orchestrator/resume.py Resumption.record(): a run continued
EVENT_KILLED = "killed"  # index.mark_killed: the orchestrator died without a summary
#: The deployer's (orchestrator/runtime/deploy.py): one per machine and deployment once it is set
#: up (what crossed the orchestrator's link to it: `bytes_sent`; how it got the dataset), and a
#: role process's exit (its code), which the supervisor and the chief's watch read.
EVENT_HOST_SETUP = "host_setup"
EVENT_PROCESS_EXIT = "process_exit"

METRICS_FIELDS = ("wall_time_s", "global_step", "steps_per_sec", "loss", "eval_accuracy")

STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"
STATUS_KILLED = "killed"  # the orchestrator died without writing a summary (kill -9, power loss)
STATUS_RUNNING = "running"  # no summary yet, and the owner holds the lock: not a summary status

SUMMARY_FIELDS = (
    "schema_version",  # int
    "run_id",  # str
    "status",  # completed | failed | interrupted | killed (written afterwards: mark_killed)
    "experiment",  # str, the experiment name
    "provider",  # str
    "protocol",  # bsp | asp | e.g. bsp>asp for a schedule
    "workers",  # int, at the start
    "parameter_servers",  # int
    "global_steps",  # int, last global step reached
    "wall_time_s",  # float, command start to teardown end
    "train_time_s",  # float, first to last training step (chief)
    "final_accuracy",  # float | null, evaluator's last accuracy
    "steps_per_sec",  # float, global_steps / train_time_s
    "cost_usd",  # float, the cluster's GCE price for wall_time_s (catalog in plan.json)
    "error",  # str | null
)

# Added by transient runs (issue 4); every run has them (0 / [] when nothing happened).
TRANSIENT_SUMMARY_FIELDS = (
    "revocations",  # int, servers revoked (injected or observed)
    "replacements",  # int, replacement servers that became ready
    "recoveries",  # int, recoveries completed (replace or restart)
    "restarts",  # int, cluster restarts from a checkpoint (PS or chief loss)
    "lost_steps",  # int, steps redone after restarts (since the last checkpoint)
    "phases",  # list of {protocol, start_step, end_step, wall_s}
    "switch_overhead_s",  # float, total time of in-place protocol switches
    "stragglers",  # int, straggler episodes detected
    "stragglers_injected",  # int, straggler episodes injected
)

# The prediction beside the measurement (null when the run had none).
PREDICTION_SUMMARY_FIELDS = (
    "predicted",  # the plan's simulated band (orchestrator.simulate.band)
    "prediction_error",  # {field: (predicted median - measured) / measured}, completed runs
)

# Set by a simulated run (provider=sim); null for a real one.
SIM_SUMMARY_FIELDS = (
    "sim_seed",  # int, the simulation's seed
    "sim_speed_factor",  # {gpu: factor}, how far this run's speed model is off, as drawn
    "accuracy_source",  # str, where the simulated final accuracy comes from
)

# What recovery and the evaluator did, in detail (not columns of runs.csv: a dict and a list).
DETAIL_SUMMARY_FIELDS = (
    "roles_restarted",  # {role: int}, roles started again after a loss ({} when none)
    "eval_skipped",  # [{step, reason}] checkpoints never evaluated; null: no evaluator / sim
)

#: Every field of summary.json, in order: :class:`orchestrator.rundir.record.RunSummary`'s fields.
ALL_SUMMARY_FIELDS = (*SUMMARY_FIELDS, *TRANSIENT_SUMMARY_FIELDS, *PREDICTION_SUMMARY_FIELDS,
                      *SIM_SUMMARY_FIELDS, *DETAIL_SUMMARY_FIELDS)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDirLock:
    """A run owns its directory: an exclusive ``flock`` on ``run.lock`` held while it lives.

    The kernel drops the lock when the owner exits, however it exits (``kill -9`` included), so
    a lock left by a dead run is never in the way; the file records host and pid so the refusal
    can say who owns the directory.
    """

    def __init__(self, run_dir: Path, name: str = LOCK_FILE) -> None:
        from orchestrator.config.errors import ConfigError

        self.path = Path(run_dir) / name
        self._fh = open(self.path, "a+")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = read_lock(self.path)
            self._fh.close()
            raise ConfigError("hydra.run.dir", f"{run_dir} is in use by a live run ("
                              f"pid {owner.get('pid', '?')} on {owner.get('host', '?')})",
                              "wait for it to end or choose another directory") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                   "started": time.time()}) + "\n")
        self._fh.flush()

    def release(self) -> None:
        if not self._fh.closed:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()


def read_lock(path: Path) -> dict[str, Any]:
    """The owner recorded in a lock file ({} when unreadable)."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def is_locked(run_dir: Path) -> bool:
    """Whether a live process owns ``run_dir`` (holds its lock) right now."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


class _AppendFile:
    """A line-buffered append-only result file that notices when it is removed or truncated.

    Appending to a file that someone removed writes into a deleted inode: everything after is
    silently lost. So before each write the file is compared with what was written (same inode,
    at least as long); on a mismatch it is reopened (recreated, with ``header`` first) and
    ``on_loss(name, reason, lost_bytes)`` records what happened.
    """

    def __init__(self, path: Path, header: str = "",
                 on_loss: Any = None) -> None:
        self.path, self.header, self.on_loss = path, header, on_loss
        self._open()

    def _open(self) -> None:
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.fh = open(self.path, "a", newline="", buffering=1)  # noqa: SIM115
        if new and self.header:
            self.fh.write(self.header)
        self.fh.flush()
        self.size = os.fstat(self.fh.fileno()).st_size

    @property
    def closed(self) -> bool:
        return self.fh.closed

    def write(self, text: str) -> None:
        if self.fh.closed:
            return
        reason = self._damage()
        if reason is not None:
            lost = self.size
            self.fh.close()
            self._open()
            if self.on_loss is not None:
                self.on_loss(self.path.name, reason, lost)
        self.fh.write(text)
        self.fh.flush()
        self.size = os.fstat(self.fh.fileno()).st_size

    def _damage(self) -> str | None:
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            return "removed"
        if on_disk.st_ino != os.fstat(self.fh.fileno()).st_ino:
            return "replaced"
        if on_disk.st_size < self.size:
            return "truncated"
        return None

    def close(self) -> None:
        self.fh.close()


class RunRecorder:
    """Writes one run directory, which it owns (:class:`RunDirLock`) until :meth:`close`.

    Every method is safe to call after a failure. A result file removed or truncated during the
    run is recreated (with everything this recorder still knows for the whole-file ones) and a
    ``result_file_lost`` event says which file, how, and how many bytes were lost.

    ``on_event`` sees every event record written, in order: the run's fold
    (:meth:`orchestrator.rundir.record.RunState.apply`), which the summary is built from.
    """

    def __init__(self, run_dir: Path, role: str = ROLE_ORCHESTRATOR,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunDirLock(self.run_dir)
        self.role = role
        self.on_event = on_event
        self._whole: dict[str, str] = {}  # whole-file results written so far: name -> text
        self._checked = time.monotonic()
        self._events = _AppendFile(self.run_dir / EVENTS_FILE, on_loss=self._lost)
        header = ",".join(METRICS_FIELDS) + "\r\n"  # csv's line ending, as the rows below
        self._metrics_fh = _AppendFile(self.run_dir / METRICS_FILE, header, on_loss=self._lost)
        self._metrics = csv.DictWriter(self._metrics_fh, fieldnames=list(METRICS_FIELDS))

    def _lost(self, name: str, reason: str, lost_bytes: int) -> None:
        self.event(EVENT_RESULT_FILE_LOST, file=name, reason=reason, lost_bytes=lost_bytes)

    def _write_whole(self, name: str, text: str) -> None:
        self._whole[name] = text
        write_atomic(self.run_dir / name, text)

    def check_files(self) -> None:
        """Recreate whole-file results (config, plan, spec...) removed or truncated since."""
        for name, text in self._whole.items():
            path = self.run_dir / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = None
            if size != len(text.encode()):
                write_atomic(path, text)
                self._lost(name, "removed" if size is None else "truncated", size or 0)

    def write_config(self, resolved: Mapping[str, Any]) -> None:
        self._write_whole(CONFIG_FILE,  # libyaml's dumper: 10x faster, same text
                          yaml.dump(_plain(resolved), Dumper=_YAML_DUMPER, sort_keys=True,
                                    default_flow_style=False))

    def write_json(self, name: str, data: Mapping[str, Any]) -> None:
        self._write_whole(name, json.dumps(_plain(data), indent=2, sort_keys=True) + "\n")

    def event(self, kind: str, role: str | None = None, time_s: float | None = None,
              **fields: Any) -> dict[str, Any]:
        record = {EVENT_TIME: time_s if time_s is not None else time.time(), EVENT_KIND: kind,
                  EVENT_ROLE: role or self.role, **fields}
        self._events.write(json.dumps(_plain(record), sort_keys=False) + "\n")
        if self.on_event is not None:
            self.on_event(record)
        if time.monotonic() - self._checked > CHECK_FILES_EVERY_S:
            self._checked = time.monotonic()
            self.check_files()
        return record

    def metric(self, wall_time_s: float, global_step: int, steps_per_sec: float | None = None,
               loss: float | None = None, eval_accuracy: float | None = None) -> None:
        if self._metrics_fh.closed:
            return
        self._metrics.writerow({
            "wall_time_s": round(wall_time_s, 3), "global_step": global_step,
            "steps_per_sec": "" if steps_per_sec is None else round(steps_per_sec, 4),
            "loss": "" if loss is None else round(loss, 6),
            "eval_accuracy": "" if eval_accuracy is None else round(eval_accuracy, 6),
        })

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        missing = [k for k in SUMMARY_FIELDS if k not in summary]
        assert not missing, f"summary lacks {missing}"
        from orchestrator import killpoints

        self.check_files()
        text = json.dumps(_plain(summary), indent=2, sort_keys=True) + "\n"
        killpoints.hit("summary", torn=killpoints.torn_write(
            self.run_dir / (SUMMARY_FILE + ".tmp"), text))
        self._write_whole(SUMMARY_FILE, text)

    def write_error(self, text: str) -> None:
        self._write_whole(ERROR_FILE, text)

    def close(self) -> None:
        self._events.close()
        self._metrics_fh.close()
        self.lock.release()


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json, None when there is none (or it cannot be read)."""
    return read_json_object(Path(run_dir) / SUMMARY_FILE) or None


def run_status(run_dir: Path) -> str:
    """completed | failed | interrupted | killed from summary.json; ``running`` while a live
    process owns the directory; ``killed`` when the owner died without writing a summary."""
    summary = read_json_object(Path(run_dir) / SUMMARY_FILE)
    if summary.get("status"):
        return str(summary["status"])
    return STATUS_RUNNING if is_locked(run_dir) else STATUS_KILLED


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a file; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _plain(value: Any) -> Any:
    """JSON/YAML-safe copy: enums to their value, tuples to lists, paths to str."""
    from enum import Enum

    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
