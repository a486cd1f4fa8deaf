"""The allowed range of every numeric config field, in one table, and the check that applies it.

One table rather than checks scattered over the validators, so that no numeric field is
forgotten (``tests/orchestrator/test_bad_inputs.py`` generates its cases from it, and fails
for a numeric schema field that is missing here) and NaN / infinity are rejected everywhere.
Paths are the dotted overrides a user types; ``*`` stands for every list index or mapping key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from orchestrator.config.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """``low`` ≤ value (< when ``low_open``), and value < ``high`` (≤ when not ``high_open``)."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = True

    def contains(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        if self.high is None:
            return above
        return above and (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '≥'} {number(self.low)}"
        return (f"in {'(' if self.low_open else '['}{number(self.low)}, {number(self.high)}"
                f"{')' if self.high_open else ']'}")


def number(value: float) -> str:
    """A number as the user would type it back: ``0.05``, ``-1``, ``4294967295``."""
    return str(value) if isinstance(value, int) else f"{value:g}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
FRACTION = Range(0, 1, low_open=True, high_open=False)
MOMENTUM = Range(0, 1)
SEED = Range(0, 2**32 - 1, high_open=False)  # numpy's seed range (keras.utils.set_random_seed)
PORT = Range(1, 65535, high_open=False)  # a TCP port
#: The first of a machine's role ports (colocated roles take the next ones): unprivileged (the
#: roles do not run as root), with room above it for the roles of one machine.
ROLE_PORTS = Range(1024, 65000)
GCE_MAX_RUN_S = 120 * 86400  # maxRunDuration's upper bound (30 s is its lower; 0: none)

RANGES: dict[str, Range] = {
    "report_every_s": Range(0.05),
    "cluster.workers": AT_LEAST_ONE,
    "cluster.parameter_servers": AT_LEAST_ONE,
    "cluster.worker_groups.*.count": AT_LEAST_ONE,
    "cluster.recovery.replacement_delay_s": NON_NEGATIVE,
    "cluster.recovery.max_restarts": NON_NEGATIVE,
    "cluster.recovery.restart_delay_s": NON_NEGATIVE,
    "cluster.recovery.chief_silence_s": POSITIVE,
    "job.train_steps": AT_LEAST_ONE,
    "job.batch_size": AT_LEAST_ONE,
    "job.learning_rate": POSITIVE,
    "job.momentum": MOMENTUM,
    "job.weight_decay": NON_NEGATIVE,
    "job.lr_decay_steps.*": AT_LEAST_ONE,
    "job.lr_decay_factor": POSITIVE,
    "job.warmup_steps": NON_NEGATIVE,
    "job.checkpoint_frequency": NON_NEGATIVE,
    "job.keep_checkpoints": AT_LEAST_ONE,
    "job.eval_frequency": NON_NEGATIVE,
    "job.steps_per_closure": NON_NEGATIVE,
    "job.seed": SEED,
    "sync.phases.*.fraction": FRACTION,
    "sync.phases.*.hparams.learning_rate": POSITIVE,
    "sync.phases.*.hparams.momentum": MOMENTUM,
    "sync.fractions.*": FRACTION,
    "sync.phase_hparams.*.learning_rate": POSITIVE,
    "sync.phase_hparams.*.momentum": MOMENTUM,
    "sync.policy.min_dwell_s": NON_NEGATIVE,
    "sync.policy.calm_s": NON_NEGATIVE,
    "provider.ready_timeout_s": AT_LEAST_ONE,
    # each backend's own fields: a pattern the chosen backend lacks matches nothing
    "provider.stop_grace_s": POSITIVE,  # local, ssh
    "provider.provision_delay_s": NON_NEGATIVE,  # local
    "provider.unreachable_grace_s": POSITIVE,  # ssh, gce
    "provider.outage_grace_s": POSITIVE,  # ssh
    "provider.hosts.*.port": PORT,  # ssh
    "provider.first_port": ROLE_PORTS,
    "provider.connect_timeout_s": POSITIVE,
    "provider.command_timeout_s": POSITIVE,
    "provider.heartbeat_interval_s": POSITIVE,
    "provider.heartbeat_timeout_s": POSITIVE,
    "provider.max_parallel_handshakes": AT_LEAST_ONE,
    "provider.boot_disk_gb": Range(10),  # gce: its smallest disk (the image's size: pre-flight)
    "provider.max_run_duration_s": Range(0, GCE_MAX_RUN_S, high_open=False),
    "provider.lease_s": NON_NEGATIVE,  # 0 = no lease; negative would silently be none
    "provider.trainer_port": ROLE_PORTS,
    "provider.poll_interval_s": POSITIVE,
    "provider.ready_poll_s": POSITIVE,
    "provider.operation_timeout_s": POSITIVE,
    "provider.vm_ready_timeout_s": POSITIVE,
    "provider.host_key_timeout_s": NON_NEGATIVE,  # 0 = pin the host key on first use at once
    "provider.host_key_poll_s": POSITIVE,
    "provider.boot_timeout_s": POSITIVE,
    "provider.login_grace_s": POSITIVE,
    "provider.gpu_timeout_s": POSITIVE,
    "provider.retries": AT_LEAST_ONE,
    "provider.retry_backoff_s": POSITIVE,
    "provider.not_ready_retry_s": POSITIVE,
    "provider.boot_preemptions": NON_NEGATIVE,  # 0 = never re-created alone
    "provider.max_parallel": AT_LEAST_ONE,
    "pricing.gpus.*.on_demand_usd_per_h": NON_NEGATIVE,
    "pricing.gpus.*.preemptible_usd_per_h": NON_NEGATIVE,
    "pricing.gpus.*.tflops": POSITIVE,
    "pricing.machine_types.*.on_demand_usd_per_h": NON_NEGATIVE,
    "pricing.machine_types.*.preemptible_usd_per_h": NON_NEGATIVE,
    "pricing.gpus.*.regions.*.on_demand_usd_per_h": NON_NEGATIVE,
    "pricing.gpus.*.regions.*.preemptible_usd_per_h": NON_NEGATIVE,
    "pricing.machine_types.*.regions.*.on_demand_usd_per_h": NON_NEGATIVE,
    "pricing.machine_types.*.regions.*.preemptible_usd_per_h": NON_NEGATIVE,
    "pricing.machine_types.*.vcpus": AT_LEAST_ONE,
    "pricing.machine_types.*.memory_gb": POSITIVE,
    "revocation.seed": SEED,
    "revocation.rate_per_hour": NON_NEGATIVE,
    "revocation.time_scale": POSITIVE,
    "revocation.notice_s": NON_NEGATIVE,
    "revocation.events.*.at_s": NON_NEGATIVE,
    "revocation.events.*.at_step": NON_NEGATIVE,
    "straggler.injections.*.workers.*": NON_NEGATIVE,
    "straggler.injections.*.delay_s": POSITIVE,
    "straggler.injections.*.start_s": NON_NEGATIVE,
    "straggler.injections.*.start_step": NON_NEGATIVE,
    "straggler.injections.*.duration_s": POSITIVE,
    "straggler.injections.*.every_s": NON_NEGATIVE,
    "straggler.injections.*.repeats": AT_LEAST_ONE,
    "straggler.detection.k": Range(1, low_open=True),
    "straggler.detection.m": AT_LEAST_ONE,
    "sim.seed": SEED,
    "sim.repeats": AT_LEAST_ONE,
    "planner.deadline_h": POSITIVE,
    "planner.budget_usd": POSITIVE,
    "planner.workers.*": AT_LEAST_ONE,
    "planner.parameter_servers.*": AT_LEAST_ONE,
    "planner.bsp_fractions.*": Range(0, 1, high_open=False),
    "planner.top": AT_LEAST_ONE,
    "planner.min_p_deadline": Range(0, 1, high_open=False),
    "planner.repeats": AT_LEAST_ONE,
    "planner.max_repeats": AT_LEAST_ONE,
    "planner.p_precision": FRACTION,
    "queue.quota_gpus": AT_LEAST_ONE,
    "queue.max_concurrent": AT_LEAST_ONE,
    "queue.run_gpus": NON_NEGATIVE,
    "queue.las_threshold_gpu_h": POSITIVE,
}


def _child(node: Any, key: str) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list):
        return node[int(key)] if key.isdigit() and int(key) < len(node) else None
    return getattr(node, key, None)


def _keys(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [str(k) for k in node]
    if isinstance(node, list):
        return [str(i) for i in range(len(node))]
    return []


def values_at(node: Any, pattern: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) for every field matching ``pattern`` below ``node`` (None skipped)."""
    head, _, rest = pattern.partition(".")
    for key in (_keys(node) if head == "*" else [head]):
        value = _child(node, key)
        if value is None:
            continue
        path = f"{prefix}{key}"
        if rest:
            yield from values_at(value, rest, path + ".")
        else:
            yield path, value


def check_finite(node: Any, prefix: str = "") -> None:
    """Reject NaN and infinity in any number field below ``node``; raises ConfigError."""
    if isinstance(node, float):
        if not math.isfinite(node):
            raise ConfigError(prefix.rstrip("."), f"must be a finite number (got {node})")
        return
    if is_dataclass(node):
        children = [(f.name, getattr(node, f.name)) for f in fields(node)]
    elif isinstance(node, dict | list):
        children = [(k, _child(node, k)) for k in _keys(node)]
    else:
        return
    for key, value in children:
        check_finite(value, f"{prefix}{key}.")


def check_ranges(node: Any, prefix: str = "") -> None:
    """Apply every RANGES entry under ``prefix`` ("" = the root config) to ``node``.

    Raises ConfigError naming the exact field, list items by index (``...workers.1``).
    """
    check_finite(node, prefix + "." if prefix else "")
    lead = prefix + "." if prefix else ""
    for pattern, allowed in RANGES.items():
        if not pattern.startswith(lead):
            continue
        for path, value in values_at(node, pattern[len(lead):], lead):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue  # the schema's type check reports these
            if not allowed.contains(value):
                raise ConfigError(path, f"must be {allowed.text()} (got {number(value)})")
