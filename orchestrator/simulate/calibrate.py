"""The speed model for the machine at hand: predictions for runs on this machine's CPUs.

No paper measured a CPU worker, so the fitted models cannot predict a ``provider=local`` run of
CPU processes. Rather than invent a step time, the preflight's training step is extended into a
short calibration of *this* machine (:func:`orchestrator.preflight.run_preflight` with
``timed_steps``): the benchmarks' single-process loop of the exact model, problem and batch
gives the step time, the same process times a checkpoint write and how long it took to be ready
(TensorFlow import, data, model build), and the model's weight count feeds the parameter-server
capacity. The simulation then predicts the run with the *same* scaling, PS-saturation, BSP-sync
and checkpoint code as for the papers' GPUs; only these four inputs are this machine's. What the
models were not fitted for (all roles sharing a few cores, gRPC over loopback) shows as the
prediction's error, which ``summary.json`` records (``prediction_error``).

A calibration is cached per machine (host name, CPU count) and job shape in the per-user cache
(``$XDG_CACHE_HOME/transient-orchestrator/calibration.json``); the first run of a shape pays it
(seconds), later runs and dry runs reuse it. Delete the file to measure again (e.g. after the
machine's load changed: the record keeps the load average it was measured at).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.simulate.models import CPU, SimModels

#: Steps timed by one calibration (after the loop's own warm-up): ~1 s of the digits CNN here.
CALIBRATION_STEPS = 100
CACHE_NAME = "calibration.json"


def cache_file() -> Path:
    """Where calibrations are kept (beside the dataset cache)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "transient-orchestrator" / CACHE_NAME


def applies(cfg: ExperimentConfig) -> bool:
    """Calibration predicts runs whose workers are processes on this machine."""
    return cfg.provider.name == "local"


def cache_key(cfg: ExperimentConfig) -> str:
    """Machine and job shape: what the measured step time depends on."""
    job = cfg.job
    return (f"{socket.gethostname()}/{os.cpu_count()}cpu/{job.model}/{job.hparam_set}/"
            f"{job.problem}/b{job.batch_size}")


def _read() -> dict[str, Any]:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def measure(cfg: ExperimentConfig) -> dict[str, Any]:
    """Calibrate now (a subprocess trains the job's model here) and cache the result."""
    from orchestrator.preflight import run_preflight

    record = json.loads(run_preflight(cfg, timed_steps=CALIBRATION_STEPS))
    record.update(measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                  load_avg_1m=round(os.getloadavg()[0], 2), cpus=os.cpu_count(),
                  key=cache_key(cfg))
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {**_read(), record["key"]: record}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: concurrent runs never read half a file
    return record


def calibration(cfg: ExperimentConfig, measure_if_missing: bool) -> dict[str, Any] | None:
    """This machine's calibration for ``cfg.job``: cached, else measured when allowed."""
    cached = _read().get(cache_key(cfg))
    if cached is not None or not measure_if_missing:
        return cached
    return measure(cfg)


def calibrated_models(models: SimModels, cfg: ExperimentConfig,
                      cal: dict[str, Any]) -> SimModels:
    """``models`` with this machine's four inputs: a CPU worker's step time (stored at the
    speed model's reference batch, as the fitted table is), the weight count, the checkpoint
    write and the process start-up (roles are processes here: no VM boots)."""
    params = copy.deepcopy(models.params)
    hparam = cfg.job.hparam_set
    params["step_time_s"].setdefault(hparam, {})[CPU] = (
        cal["step_s"] * params["batch_size"] / cfg.job.batch_size)
    params["parameters"][hparam] = cal["weights"]
    params["checkpoint"].setdefault("measured_s", {})[hparam] = cal["checkpoint_s"]
    params["machine"] = {"start_s": cal["ready_s"]}
    return SimModels(params)
