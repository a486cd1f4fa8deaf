"""Export the parameters the simulator needs from the fitted models in ``analysis/``.

Why a file: fitting the speed model, the scaling fits and the lifetime models takes ≈ 10–20 s
(Gaussian processes, lifelines), far more than simulating a run (milliseconds), and
``analysis/`` depends on pandas/scikit-learn/lifelines, which a simulation should not need.
So the fitted parameters are exported once to :data:`PARAMS_FILE` (committed, like
``analysis/revocation_models.json``) and :mod:`orchestrator.simulate.models` only reads JSON.
Regenerate after changing a model: ``python -m orchestrator.simulate.fit``; a test checks the
committed file against a re-fit.

Data flow stays one way: reference data → ``analysis`` fits → this export → the simulator.
Every number below comes from a fit or a mean over the papers' measurements; nothing is typed in.
"""

from __future__ import annotations

import argparse
import csv
import json
import warnings
from pathlib import Path
from typing import Any

PARAMS_FILE = Path(__file__).with_name("sim_models.json")
PARAMS_SCHEMA_VERSION = 2  # 2: step_time_error (the speed model's held-out error)

#: The job's ``hparam_set`` → the CM-DARE architecture measured for it.
MEASURED_ARCHITECTURES = {"resnet_cifar_15": "Res15", "resnet_cifar_32": "Res32"}
#: Hparam sets of the same family that were not measured: depth, extrapolated from the two above.
EXTRAPOLATED_DEPTHS = {"resnet_cifar_56": 56}
_MEASURED_DEPTHS = {"Res15": 15, "Res32": 32}
#: Catalog GPU keys → the analysis package's GPU names.
GPU_NAMES = {"k80": "K80", "p100": "P100", "v100": "V100", "t4": "T4", "a100": "A100", "l4": "L4"}
#: CIFAR ResNet checkpoint name in CM-DARE's checkpoint table.
_CKPT_MODELS = {"Res15": "ResNet-15", "Res32": "ResNet-32"}


def _architecture_table() -> tuple[Any, Any]:
    """Per-architecture feature table of the speed model, with the extrapolated depths added."""
    import pandas as pd

    from analysis.speed_model import reference_speed_model

    model = reference_speed_model()
    table = model.table
    base = table[table["model"].isin(list(_MEASURED_DEPTHS))].groupby("model")[
        ["gflops", "mparams", "tensors"]].first()
    rows = []
    for hparam, depth in EXTRAPOLATED_DEPTHS.items():
        a, b = base.loc["Res15"], base.loc["Res32"]
        w = (depth - 15) / (32 - 15)  # FLOPs, weights and tensors grow linearly with depth
        rows.append({"model": hparam, **{c: float(a[c] + w * (b[c] - a[c]))
                                         for c in ("gflops", "mparams", "tensors")}})
    return model, pd.DataFrame(rows)


def step_times() -> tuple[dict[str, dict[str, float]], dict[str, int], dict[str, str]]:
    """Seconds per step at batch 128 per (hparam_set, catalog GPU), weights per hparam_set, and
    how each number was obtained (measured mean / speed-model prediction)."""
    import pandas as pd

    from analysis.features import compute_tflops, gpu_mem_bw

    model, extra = _architecture_table()
    table = model.table
    out: dict[str, dict[str, float]] = {}
    params: dict[str, int] = {}
    how: dict[str, str] = {}
    names = {**MEASURED_ARCHITECTURES, **{h: h for h in EXTRAPOLATED_DEPTHS}}
    for hparam, arch in names.items():
        feats = (table[table["model"] == arch].iloc[0] if arch in set(table["model"])
                 else extra[extra["model"] == arch].iloc[0])
        params[hparam] = round(float(feats["mparams"]) * 1e6)
        frame = pd.DataFrame([{"gpu": GPU_NAMES[g], "model": arch, "gflops": feats["gflops"],
                               "mparams": feats["mparams"], "tensors": feats["tensors"],
                               "tflops": compute_tflops(GPU_NAMES[g]),
                               "mem_bw": gpu_mem_bw(GPU_NAMES[g]), "y": float("nan")}
                              for g in GPU_NAMES])
        pred = model.predict(frame)
        out[hparam] = {g: round(float(p), 6) for g, p in zip(GPU_NAMES, pred, strict=True)}
        for g in GPU_NAMES:
            seen = ((table["model"] == arch) & (table["gpu"] == GPU_NAMES[g])).any()
            how[f"{hparam}/{g}"] = "measured" if seen else "speed model"
    return out, params, how


def step_time_errors(how: dict[str, str]) -> dict[str, Any]:
    """The speed model's own error per (hparam_set, catalog GPU), from its held-out error on the
    papers' data (:func:`analysis.speed_error.speed_error_model`): ``sigma_log`` (the spread of
    log step time a simulated run draws from), ``basis`` (``measured``; ``speed model``: an
    architecture no paper measured, on a measured GPU; ``extrapolated``: a GPU no paper
    measured, scaled by TFLOPS and memory bandwidth), ``tflops_outside`` (how far, in log
    units, that GPU lies outside the measured GPUs' TFLOPS and bandwidth; 0 inside) and
    ``supported`` with its ``support`` (:func:`speed_support`)."""
    import math

    from analysis.speed_error import public_checks, speed_error_model, unmeasured_gpu_sigma

    model = speed_error_model()
    checks = public_checks(error=model)
    per_gpu: dict[str, dict[str, Any]] = {}
    for key, source in sorted(how.items()):
        hparam, gpu = key.split("/")
        name = GPU_NAMES[gpu]
        outside = 0.0
        if source == "measured":
            sigma, basis = model["measured"], "measured"
        elif name in model["fitted_gpus"]:
            sigma, basis = model["architecture"], "speed model"
        else:
            sigma, outside = unmeasured_gpu_sigma(name, model)
            if hparam not in MEASURED_ARCHITECTURES:  # neither the model nor the GPU measured
                sigma = math.hypot(sigma, model["architecture"])
            basis = "extrapolated"
        supported, support = speed_support(name, basis, outside, checks)
        per_gpu.setdefault(hparam, {})[gpu] = {"sigma_log": round(sigma, 6), "basis": basis,
                                               "tflops_outside": round(outside, 6),
                                               "supported": supported, "support": support}
    return {"by_job": per_gpu, "model": {**model, "public_checks": checks}}


def speed_support(gpu: str, basis: str, outside: float,
                  checks: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether anything supports the speed model's step time of ``gpu``, and what: a
    measurement; a GPU inside the measured GPUs' TFLOPS and bandwidth (an interpolation, whose
    held-out error is measured); or, outside, public throughputs of that GPU that agree with the
    model within its own 2σ (:func:`analysis.speed_error.public_checks`). An extrapolation with
    no public figure, or one the public figures contradict, is not supported: its spread is a
    guess about a GPU nothing here has seen."""
    if basis != "extrapolated":
        return True, "measured on this GPU"
    mine = [c for c in checks if c["gpu"] == gpu and c["ratio"] is not None]
    if mine and all(c["within"] for c in mine):
        ratios = ", ".join(f"{c['ratio']:.2f}" for c in mine)
        return True, (f"public ResNet-50 throughputs ({ratios}× a V100) agree with the "
                      f"model's {mine[0]['predicted_ratio']:.2f}×")
    if mine:
        return False, (f"public ResNet-50 throughputs of {gpu} disagree with the model beyond "
                       "its error")
    if outside == 0:
        return True, "inside the measured GPUs' TFLOPS and memory bandwidth"
    return False, (f"no measurement or public throughput of {gpu}; it lies {outside:.2f} "
                   "log-units outside the measured GPUs' TFLOPS and memory bandwidth")


def scaling() -> dict[str, Any]:
    """Per-GPU worker efficiency (median over the fitted models) and the effective PS bandwidth."""
    import numpy as np

    from analysis.scaling import fit_scaling, ps_bandwidth_bytes_per_s

    fits = fit_scaling()
    eff = {}
    for gpu in sorted({f.gpu for f in fits}):
        eff[gpu.lower()] = round(float(np.median([f.efficiency for f in fits if f.gpu == gpu])), 6)
    eff["default"] = round(float(np.median([f.efficiency for f in fits])), 6)
    return {"efficiency": eff,
            "ps_bandwidth_bytes_per_s": round(ps_bandwidth_bytes_per_s(fits), 1),
            "source": "analysis.scaling.fit_scaling on CM-DARE cluster_speed_by_workers.csv"}


def checkpoint() -> dict[str, Any]:
    """Linear checkpoint model and each architecture's checkpoint size (CM-DARE ckpt.csv);
    unmeasured sizes scale with the weights (MB per million weights, median of the table)."""
    import numpy as np

    from analysis.checkpoint_model import CKPT_FILE, fit_linear

    intercept, slope = fit_linear()
    with open(CKPT_FILE, newline="") as f:
        rows = list(csv.DictReader(f))
    mb_per_mparam = float(np.median([float(r["Checkpoint Size (MB)"])
                                     / (float(r["Number of Parameters"]) / 1e6) for r in rows]))
    sizes = {}
    for hparam, arch in MEASURED_ARCHITECTURES.items():
        row = next(r for r in rows if r["Model"] == _CKPT_MODELS[arch])
        sizes[hparam] = float(row["Checkpoint Size (MB)"])
    return {"intercept_s": round(intercept, 6), "slope_s_per_mb": round(slope, 8),
            "size_mb": sizes, "mb_per_million_weights": round(mb_per_mparam, 4)}


def _mean_std(values: list[float]) -> dict[str, float]:
    import numpy as np

    return {"mean_s": round(float(np.mean(values)), 3),
            "std_s": round(float(np.std(values, ddof=1)), 3), "n": len(values)}


def startup() -> dict[str, Any]:
    """VM start-up (provisioning + staging + booting) per pricing, replacement-server start-up
    per GPU, and TensorFlow process start (cold, warm), all from CM-DARE's measurements."""
    from analysis.features import CMDARE_DIR

    totals: dict[str, list[float]] = {"on_demand": [], "transient": []}
    for folder in sorted((CMDARE_DIR / "startup_time").iterdir()):
        kind = "on_demand" if folder.name.startswith("on_demand") else "transient"
        for path in sorted(folder.glob("*.csv")):
            with open(path, newline="") as f:
                totals[kind] += [sum(float(v) for v in row.values()) for row in csv.DictReader(f)]
    vm = {k: _mean_std(v) for k, v in totals.items()}
    replacement = {}
    with open(CMDARE_DIR / "derived" / "replacement_server_startup.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["request"] == "immediate" and row["setting"].lower() in GPU_NAMES:
                replacement[row["setting"].lower()] = {"mean_s": float(row["mean_s"]),
                                                       "std_s": float(row["std_s"])}
    tf_start = {}
    with open(CMDARE_DIR / "derived" / "tf_start_time_overall.csv", newline="") as f:
        for row in csv.DictReader(f):
            tf_start[row["start_type"]] = {"mean_s": float(row["mean_s"]),
                                           "std_s": float(row["std_s"])}
    return {"vm": vm, "replacement": replacement, "tf_start": tf_start}


def bsp_sync(step_s: float) -> dict[str, Any]:
    """BSP's per-step synchronisation cost, fitted on Sync-Switch's 8-worker BSP runs only.

    A BSP step waits for the slowest of N workers and then for the PS to aggregate N gradients
    and hand out N copies of the weights: ``t = step_s + c·N``, one parameter ``c`` fitted on the
    8-worker CIFAR-10 BSP mean (the 16-worker and every hybrid run are held out)."""
    from analysis.syncswitch import DATASETS, load_reference_runs, summarize

    table = summarize(load_reference_runs("cifar10_res32"))
    bsp = table[(table["bsp_fraction"] >= 1) & ~table["asp_first"]].iloc[0]
    workers, budget = DATASETS["cifar10_res32"]
    per_step = float(bsp["time_s"]) / budget
    return {"sync_s_per_worker": round((per_step - step_s) / workers, 6),
            "fit_on": f"Sync-Switch cifar10_res32 BSP, {workers} workers, {budget} steps, "
                      f"{float(bsp['time_s']):.1f} s"}


def accuracy_table() -> list[dict[str, Any]]:
    """Converged accuracies the papers measured, with the setup they belong to."""
    from analysis.cost import icac19_k80_table
    from analysis.syncswitch import DATASETS, load_reference_runs, summarize

    rows = []
    for r in icac19_k80_table().itertuples():
        rows.append({"hparam_set": "resnet_cifar_32", "problem": "image_cifar10",
                     "bsp_steps": 64000, "workers": int(r.workers), "bsp_fraction": 0.0,
                     "transient": bool(r.transient), "accuracy": round(float(r.accuracy), 5),
                     "source": f"ICAC'19 {r.config}, {r.runs} runs"})
    for dataset, hparam, problem in (("cifar10_res32", "resnet_cifar_32", "image_cifar10"),
                                     ("cluster_16", "resnet_cifar_32", "image_cifar10")):
        workers, budget = DATASETS[dataset]
        for r in summarize(load_reference_runs(dataset)).itertuples():
            if r.asp_first or r.accuracy != r.accuracy:  # NaN: no accuracy measured
                continue
            rows.append({"hparam_set": hparam, "problem": problem, "bsp_steps": budget,
                         "workers": workers, "bsp_fraction": round(float(r.bsp_fraction), 4),
                         "transient": None, "accuracy": round(float(r.accuracy), 5),
                         "source": f"Sync-Switch {dataset} {r.protocol}, {r.runs} runs"})
    return rows


def lifetimes() -> dict[str, Any]:
    """Lifetime models of both datasets: CM-DARE (2019–20, 396 VMs: the default) and ICAC'19
    (February 2019, the period of ICAC'19's training runs)."""
    from analysis.lifetimes import build_revocation_models

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: build_revocation_models(name) for name in ("cmdare", "icac19")}


def build_params() -> dict[str, Any]:
    """Every parameter the simulator reads (see :mod:`orchestrator.simulate.models`)."""
    steps, params, how = step_times()
    return {
        "schema_version": PARAMS_SCHEMA_VERSION,
        "description": "Simulator parameters fitted by analysis/ on the papers' reference data; "
                       "regenerate with python -m orchestrator.simulate.fit",
        "batch_size": 128,
        "step_time_s": steps,
        "step_time_source": how,
        "step_time_error": step_time_errors(how),
        "parameters": params,
        "scaling": scaling(),
        "checkpoint": checkpoint(),
        "startup": startup(),
        "bsp": bsp_sync(steps["resnet_cifar_32"]["k80"]),
        "accuracy": accuracy_table(),
        "lifetimes": lifetimes(),
    }


def export(path: Path = PARAMS_FILE) -> Path:
    path.write_text(json.dumps(build_params(), indent=1, sort_keys=True) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.simulate.fit [PATH]``: re-fit and write the file, print its path.
    Parsed, so that ``--help`` answers instead of being taken for the file to write."""
    from orchestrator.version import add_version_argument, prog_name

    parser = argparse.ArgumentParser(
        prog=prog_name("orchestrator.simulate.fit"),
        description="Re-fit the simulator's parameters from analysis/ on the papers' reference "
                    "data (about 20 s) and write them as JSON.")
    add_version_argument(parser, "orchestrator.simulate.fit")
    parser.add_argument("path", nargs="?", type=Path, default=PARAMS_FILE,
                        help=f"where to write (default: the committed {PARAMS_FILE.name})")
    print(export(parser.parse_args(argv).path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
