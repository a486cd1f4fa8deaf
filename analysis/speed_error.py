"""How wrong the speed model (analysis/speed_model.py) is, measured on held-out data.

The simulator draws a step time from a log-normal spread around the model's prediction
(orchestrator/simulate/fit.py exports it); this module measures that spread:
leave-one-GPU-out (:func:`evaluate_leave_gpu_out`), the papers' repeat measurements and
leave-one-architecture-out give :func:`speed_error_model`, which widens with a GPU's distance
outside the measured hardware (:func:`spec_distance`). Public ResNet-50 ratios
(:data:`PUBLIC_RATIOS`) check the model's hardware scaling on GPUs no paper measured
(:func:`public_checks`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis.features import (
    GPU_SPECS,
    compute_tflops,
    gpu_mem_bw,
    per_architecture,
    prepare_speed_frame,
)
from analysis.speed_model import (
    SpeedModel,
    fit_speed_model,
    load_base_speed_table,
    load_reference_speed_data,
    reference_speed_model,
)


def evaluate_leave_gpu_out() -> dict[str, Any]:
    """Leave-one-GPU-out: how wrong the speed model is on a GPU it never saw.

    The papers measured three GPUs: K80 and P100 (16 architectures, the training table) and
    V100 (4 architectures, ``speed_data_base`` only). Each is held out in turn; the model is
    fitted on the others' rows and predicts the held-out GPU's by the route an unmeasured GPU
    takes (the nearest measured GPU scaled by TFLOPS and bandwidth). Each fold records the
    relative errors (log of predicted / measured) and how far the held-out GPU lies outside the
    fitted GPUs' TFLOPS and bandwidth ranges (``distance``, :func:`spec_distance`; 0 inside).
    Holding out P100 (between K80 and V100 in both) is the one interpolation; K80 and V100 are
    extrapolations."""
    full = reference_speed_model().table
    data = {g: full[full["gpu"] == g] for g in ("K80", "P100", "V100")}
    folds = {}
    for held, rows in data.items():
        train = SpeedModel(pd.concat([d for g, d in data.items() if g != held],
                                     ignore_index=True))
        pred = train.predict(rows.reset_index(drop=True))
        errors = np.log(pred / rows["y"].to_numpy())
        distance = spec_distance(float(rows["tflops"].iloc[0]), float(rows["mem_bw"].iloc[0]),
                                 train.spec_range())
        folds[held] = {"fitted_on": train.gpus, "n": len(rows),
                       "distance": round(distance, 6),
                       "hardware_exponent": round(train.hardware_exponent(), 6),
                       "rms_log_error": round(float(np.sqrt(np.mean(errors ** 2))), 6),
                       "mean_log_error": round(float(np.mean(errors)), 6),
                       "mape": round(float(np.mean(np.abs(np.expm1(errors))) * 100), 3)}
    return folds


def tflops_distance(tflops: float, lo: float, hi: float) -> float:
    """How far (|log ratio|) a value lies outside the range [lo, hi]; 0 inside."""
    if tflops < lo:
        return float(np.log(lo / tflops))
    return float(np.log(tflops / hi)) if tflops > hi else 0.0


def spec_distance(tflops: float, mem_bw: float, ranges: dict[str, list[float]]) -> float:
    """How far a GPU lies outside the measured GPUs' hardware: the Euclidean norm of its log
    distances outside the TFLOPS and the bandwidth ranges (0 inside both). The speed model's
    held-out error grows with it."""
    return float(np.hypot(tflops_distance(tflops, *ranges["tflops"]),
                          tflops_distance(mem_bw, *ranges["mem_bw_gbs"])))


def repeat_measurement_error() -> float:
    """RMS log ratio between CM-DARE's two measurements of the same (GPU, architecture)
    (``speed_data`` and ``speed_data_base``, K80 and P100): what a measured step time is off
    by on another VM, another day."""
    main = fit_speed_model(load_reference_speed_data()).table
    both = load_base_speed_table(main).merge(main, on=["gpu", "model"], suffixes=("", "_main"))
    return float(np.sqrt(np.mean(np.log(both["y"] / both["y_main"]) ** 2)))


def architecture_error() -> float:
    """RMS log error of leave-one-architecture-out on the fitted GPUs: a model measured on no
    GPU (e.g. ResNet-56) predicted from its complexity."""
    raw = load_reference_speed_data()
    prepared = prepare_speed_frame(raw)
    table = per_architecture(prepare_speed_frame(raw, lookup=prepared).dropna(subset=["y"]))
    errors = []
    for model in table["model"].unique():
        held = (table["model"] == model).to_numpy()
        pred = SpeedModel(table[~held]).predict(table[held].reset_index(drop=True))
        errors += list(np.log(pred / table[held]["y"].to_numpy()))
    return float(np.sqrt(np.mean(np.square(errors))))


def speed_error_model() -> dict[str, Any]:
    """The speed model's own error as a log-normal spread of the step time, from held-out data:

    * ``measured``: a (GPU, architecture) the papers measured: the repeat-measurement spread;
    * ``architecture``: an architecture measured on no GPU, on a measured GPU: leave-one-
      architecture-out;
    * a GPU no paper measured: ``sqrt(inside² + (per_log_tflops · d)²)``, ``d`` its
      :func:`spec_distance` outside the measured GPUs' TFLOPS and bandwidth (the key keeps its
      name; it is per log unit of that distance); ``inside`` from the interpolating fold (P100
      held out), ``per_log_tflops`` from the extrapolating folds (K80, V100 held out) by least
      squares on their excess variance (``Σ max(0, e² − inside²) / Σ d²``);
      ``max_tested_distance``: the farthest a held-out fold extrapolated, beyond which the
      spread itself is not measured.

    Why log-normal: the errors are ratios (a GPU 1.4× slower than predicted), and a step time
    is positive."""
    folds = evaluate_leave_gpu_out()
    inside = [f for f in folds.values() if f["distance"] == 0]
    outside = [f for f in folds.values() if f["distance"] > 0]
    sigma_in = float(np.sqrt(np.mean([f["rms_log_error"] ** 2 for f in inside])))
    excess = sum(max(0.0, f["rms_log_error"] ** 2 - sigma_in ** 2) * f["n"] for f in outside)
    slope = float(np.sqrt(excess / sum(f["distance"] ** 2 * f["n"] for f in outside)))
    model = reference_speed_model()
    ranges = model.spec_range()
    return {"measured": round(repeat_measurement_error(), 6),
            "architecture": round(architecture_error(), 6),
            "inside": round(sigma_in, 6), "per_log_tflops": round(slope, 6),
            "max_tested_distance": max(f["distance"] for f in folds.values()),
            "hardware_exponent": round(model.hardware_exponent(), 6),
            "fitted_gpus": model.gpus, "tflops_range": ranges["tflops"],
            "mem_bw_range": ranges["mem_bw_gbs"], "folds": folds}


def unmeasured_gpu_sigma(gpu: str, error: dict[str, Any]) -> tuple[float, float]:
    """(sigma_log, spec distance) of the speed model on a GPU no paper measured, from
    :func:`speed_error_model`'s ``error``."""
    d = spec_distance(compute_tflops(gpu), gpu_mem_bw(gpu),
                      {"tflops": error["tflops_range"], "mem_bw_gbs": error["mem_bw_range"]})
    return float(np.hypot(error["inside"], error["per_log_tflops"] * d)), d


#: Public single-GPU ResNet-50 throughputs of a GPU no paper measured here, against a V100 in
#: the same source and software (``ratio`` = images/s of the GPU / images/s of the V100). The
#: job is CIFAR ResNet training, so these check the hardware scaling, not the step time itself.
PUBLIC_RATIOS: tuple[dict[str, Any], ...] = (
    {"gpu": "A100", "ratio": round(909 / 412, 3),
     "what": "ResNet-50 v1.5 training, TensorFlow (NGC 20.06-tf1), XLA; A100 40GB TF32 "
             "909 img/s vs V100 16GB FP32 412 img/s",
     "url": "https://github.com/NVIDIA/DeepLearningExamples/blob/master/TensorFlow/"
            "Classification/ConvNets/resnet50v1.5/README.md"},
    {"gpu": "A100", "ratio": round(938 / 367, 3),
     "what": "ResNet-50 v1.5 training, PyTorch (NGC 21.03); A100 80GB TF32 938 img/s vs "
             "V100 16GB FP32 367 img/s",
     "url": "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/"
            "Classification/ConvNets/resnet50v1.5/README.md"},
    {"gpu": "T4", "ratio": round(424.42 / 1252.06, 3),
     "what": "ResNet-50 v1.5 FP32 inference (forward pass only: no training figure "
             "published), TensorFlow (NGC 20.06-tf1), batch 64; T4 424 vs V100 1252 img/s",
     "url": "https://github.com/NVIDIA/DeepLearningExamples/blob/master/TensorFlow/"
            "Classification/ConvNets/resnet50v1.5/README.md"},
    {"gpu": "T4", "ratio": round(426 / 1229, 3),
     "what": "ResNet-50 v1.5 FP32 inference (forward pass only), PyTorch (NGC 21.03), "
             "batch 128; T4 426 vs V100 1229 img/s",
     "url": "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/"
            "Classification/ConvNets/resnet50v1.5/README.md"},
)


def public_checks(model: SpeedModel | None = None, architecture: str = "Res32",
                  error: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The model's speed ratio to the V100 (the papers' measured V100) of each GPU with a public
    figure (:data:`PUBLIC_RATIOS`), against that figure: ``log_error`` = log(model / public),
    ``within`` when it lies inside the model's own 2σ band for that GPU (held-out error, as the
    simulation draws it). A GPU of the catalogue with no public figure appears once with
    ``ratio`` None: nothing outside this model supports its figure."""
    model = model or reference_speed_model()
    error = error or speed_error_model()
    table = model.table
    feats = table[table["model"] == architecture].iloc[0]
    gpus = sorted(set(GPU_SPECS) - set(model.gpus))
    frame = pd.DataFrame([{**feats.to_dict(), "gpu": g, "tflops": compute_tflops(g),
                           "mem_bw": gpu_mem_bw(g), "y": float("nan")}
                          for g in [*gpus, "V100"]])
    pred = dict(zip(frame["gpu"], model.predict(frame), strict=True))
    out = []
    for gpu in gpus:
        sigma, distance = unmeasured_gpu_sigma(gpu, error)
        predicted = pred["V100"] / pred[gpu]
        refs = [r for r in PUBLIC_RATIOS if r["gpu"] == gpu] or [
            {"gpu": gpu, "ratio": None, "what": "no public figure found", "url": ""}]
        for ref in refs:
            log_error = None if ref["ratio"] is None else round(
                float(np.log(predicted / ref["ratio"])), 4)
            out.append({**ref, "architecture": architecture,
                        "predicted_ratio": round(float(predicted), 3),
                        "sigma_log": round(sigma, 4), "distance": round(distance, 4),
                        "log_error": log_error,
                        "within": log_error is not None and abs(log_error) <= 2 * sigma})
    return out
