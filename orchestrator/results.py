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
    tensorboard/       TensorFlow event files (train/, eval/)
    checkpoints/       tf.train.CheckpointManager output
    logs/              one log per role process
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SCHEMA_VERSION = 1
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
SPEC_FILE = "trainer_spec.json"
EVENTS_FILE = "events.jsonl"
METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
ERROR_FILE = "error.txt"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
LOGS_DIR = "logs"

# Event fields filled by the framework (auto): time (unix s), kind, role; the rest is reported.
EVENT_TIME = "time"  # auto, unix seconds
EVENT_KIND = "kind"  # auto: provision, start, ready, train_start, phase_start, phase_end, step,
#                      checkpoint, eval, failure, train_end, teardown
EVENT_ROLE = "role"  # auto: orchestrator | ps | worker | chief | evaluator

METRICS_FIELDS = ("wall_time_s", "global_step", "steps_per_sec", "loss", "eval_accuracy")

STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
STATUS_INTERRUPTED = "interrupted"

SUMMARY_FIELDS = (
    "schema_version",  # int
    "run_id",  # str
    "status",  # completed | failed | interrupted
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


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunRecorder:
    """Writes one run directory. Every method is safe to call after a failure."""

    def __init__(self, run_dir: Path, role: str = "orchestrator") -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.role = role
        self._events = open(self.run_dir / EVENTS_FILE, "a", buffering=1)  # noqa: SIM115
        new_metrics = not (self.run_dir / METRICS_FILE).exists()
        self._metrics_fh = open(self.run_dir / METRICS_FILE, "a", newline="", buffering=1)  # noqa: SIM115
        self._metrics = csv.DictWriter(self._metrics_fh, fieldnames=list(METRICS_FIELDS))
        if new_metrics:  # no second header on resume
            self._metrics.writeheader()

    def write_config(self, resolved: Mapping[str, Any]) -> None:
        write_atomic(self.run_dir / CONFIG_FILE,  # libyaml's dumper: 10× faster, same text
                     yaml.dump(_plain(resolved), Dumper=_YAML_DUMPER, sort_keys=True,
                               default_flow_style=False))

    def write_json(self, name: str, data: Mapping[str, Any]) -> None:
        write_atomic(self.run_dir / name, json.dumps(_plain(data), indent=2, sort_keys=True) + "\n")

    def event(self, kind: str, role: str | None = None, time_s: float | None = None,
              **fields: Any) -> dict[str, Any]:
        record = {EVENT_TIME: time_s if time_s is not None else time.time(), EVENT_KIND: kind,
                  EVENT_ROLE: role or self.role, **fields}
        if not self._events.closed:
            self._events.write(json.dumps(_plain(record), sort_keys=False) + "\n")
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
        self.write_json(SUMMARY_FILE, summary)

    def write_error(self, text: str) -> None:
        write_atomic(self.run_dir / ERROR_FILE, text)

    def close(self) -> None:
        self._events.close()
        self._metrics_fh.close()


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
