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

The same path replaces the speed model's extrapolation for a GPU it was not fitted on: run on a
machine with that GPU (``python -m orchestrator.simulate.calibrate +experiment=NAME``; the GPU is
read from ``nvidia-smi``), or record a step time measured by a real run on it (``--gpu l4
--step-s 0.031``). Such a calibration is kept per GPU type and job shape, not per machine: the
planner, the dry run's band and its estimate then use it for that GPU, with the spread of a
measurement instead of the extrapolation's, and the row loses its "extrapolated" mark.

A CPU calibration is cached per machine (host name, CPU count) and job shape in the per-user cache
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
from typing import TYPE_CHECKING, Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.simulate.models import CPU, SimModels

if TYPE_CHECKING:
    from orchestrator.plan import RunPlan

#: Steps timed by one calibration (after the loop's own warm-up): ~1 s of the digits CNN here.
CALIBRATION_STEPS = 100
CACHE_NAME = "calibration.json"


def cache_file() -> Path:
    """Where calibrations are kept (beside the dataset cache)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "transient-orchestrator" / CACHE_NAME


def applies(plan: RunPlan) -> bool:
    """Calibration predicts runs whose workers are processes on this machine."""
    return plan.backend.hosts_here


def cache_key(cfg: ExperimentConfig) -> str:
    """Machine and job shape: what the measured step time depends on."""
    job = cfg.job
    return (f"{socket.gethostname()}/{os.cpu_count()}cpu/{job.model}/{job.hparam_set}/"
            f"{job.problem}/b{job.batch_size}")


def gpu_cache_key(gpu: str, cfg: ExperimentConfig) -> str:
    """A GPU calibration belongs to the GPU type and the job shape (any machine with that GPU)."""
    job = cfg.job
    return f"gpu/{gpu}/{job.model}/{job.hparam_set}/{job.problem}/b{job.batch_size}"


#: ``nvidia-smi`` product names → catalog GPU keys.
GPU_PRODUCTS = {"K80": "k80", "P100": "p100", "V100": "v100", "T4": "t4", "A100": "a100",
                "L4": "l4", "H100": "h100", "H200": "h200"}


def local_gpu() -> str | None:
    """The catalog key of this machine's first GPU (``nvidia-smi``), None without one."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return gpu_key(out.splitlines()[0]) if out.strip() else None


def gpu_key(product: str) -> str | None:
    """``nvidia-smi``'s product name → catalog key: "Tesla V100-SXM2-16GB" → ``v100``."""
    words = product.replace("-", " ").split()
    return next((GPU_PRODUCTS[w] for w in words if w in GPU_PRODUCTS), None)


def record_gpu(cfg: ExperimentConfig, gpu: str, step_s: float, source: str) -> dict[str, Any]:
    """Keep a step time of ``cfg.job`` measured on ``gpu`` (batch ``job.batch_size``)."""
    record = {"gpu": gpu, "step_s": step_s, "source": source, "key": gpu_cache_key(gpu, cfg),
              "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    _write(record)
    return record


def gpu_calibrations(cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """Every GPU calibration of ``cfg.job``'s shape in the cache, by GPU key."""
    table = _read()
    out = {}
    for key, record in table.items():
        if key.startswith("gpu/") and key == gpu_cache_key(record.get("gpu", ""), cfg):
            out[record["gpu"]] = record
    return out


def with_gpu_calibrations(models: SimModels, cfg: ExperimentConfig) -> SimModels:
    """``models`` with every cached GPU calibration of this job shape replacing the speed
    model's step time of that GPU (and its error: a measurement's)."""
    cals = gpu_calibrations(cfg)
    if not cals:
        return models
    params = copy.deepcopy(models.params)
    hparam = cfg.job.hparam_set
    errors = params["step_time_error"]["by_job"].setdefault(hparam, {})
    for gpu, cal in cals.items():
        params["step_time_s"].setdefault(hparam, {})[gpu] = (
            cal["step_s"] * params["batch_size"] / cfg.job.batch_size)
        errors[gpu] = {"sigma_log": params["step_time_error"]["model"]["measured"],
                       "basis": "calibrated", "tflops_outside": 0.0,
                       "calibration": cal.get("source", "")}
    return SimModels(params)


def _write(record: dict[str, Any]) -> None:
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {**_read(), record["key"]: record}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: concurrent runs never read half a file


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
    _write(record)
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


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.simulate.calibrate OVERRIDES [--gpu G --step-s S]``."""
    import argparse
    import sys

    from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
    from orchestrator.config.validation import validate
    from orchestrator.simulate.validate import compose
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(
        prog=prog_name("orchestrator.simulate.calibrate"),
        description="Measure the job's step time on this machine (its GPU when it has one) or "
                    "record one measured on a GPU elsewhere; the planner and the dry run use it "
                    "instead of the speed model's extrapolation.")
    add_version_argument(parser, "orchestrator.simulate.calibrate")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=NAME")
    parser.add_argument("--gpu", help="catalog GPU the --step-s was measured on (e.g. l4)")
    parser.add_argument("--step-s", type=float, help="seconds per step of one worker at "
                        "job.batch_size, measured on --gpu (e.g. by a real run)")
    args = parser.parse_args(argv)
    try:
        cfg = compose(args.overrides)
        validate(cfg)
    except ConfigError as err:
        print(err.line(), file=sys.stderr)
        return CONFIG_ERROR_EXIT_CODE
    if (args.gpu is None) != (args.step_s is None):
        parser.error("--gpu and --step-s go together")
    if args.gpu is not None:
        if args.step_s <= 0:
            parser.error("--step-s must be > 0")
        record = record_gpu(cfg, args.gpu.lower(), args.step_s, "given on the command line")
    else:
        from orchestrator.preflight import PreflightError
        from orchestrator.runtime import data

        gpu = local_gpu()
        try:
            data.prepare(cfg)  # the job's dataset, fetched into the cache as a run's data step does
            measured = measure(cfg)
        except ConfigError as err:  # a bad job.data_dir, or a DataError: the download failed
            print(err.line(), file=sys.stderr)
            return CONFIG_ERROR_EXIT_CODE
        except PreflightError as err:
            print(err, file=sys.stderr)
            return 1
        record = (record_gpu(cfg, gpu, measured["step_s"], "measured here")
                  if gpu is not None else measured)
    print(json.dumps(record, indent=1, sort_keys=True))
    print(f"kept in {cache_file()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
