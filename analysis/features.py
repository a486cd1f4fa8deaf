"""Shared feature engineering for the CM-DARE performance models (speed, checkpoint).

Why a separate module: the speed CSVs of CM-DARE come in many variants (``0latency_*.csv``) whose
optional columns differ (``Number of Tensors`` and the checkpoint file sizes exist only in the
``*_new*`` tables, ``GPU TFLOPS`` may be absent in files we did not produce). The models must
tolerate this, so every frame goes through :func:`prepare_speed_frame`, which

* converts units once (GFLOP, millions of parameters, tensors) so fitted coefficients are readable;
* fills ``GPU TFLOPS`` from a small spec table when a file only names the GPU;
* imputes ``Number of Tensors`` from the same architecture's other rows, or from the checkpoint
  index/meta file sizes (both are almost exactly proportional to the tensor count: the index file
  stores one entry per tensor, ≈0.104 MB each; the meta graph ≈0.0185 MB per tensor).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.data_dir import REFERENCE_DIR

CMDARE_DIR = REFERENCE_DIR / "cmdare"

TARGET = "Step Time (s)"
SPEED = "Speed (steps/sec)"
GPU = "GPU (temp)"
MODEL = "Model (temp)"
FLOPS = "Model FLOPs"
PARAMS = "Number of Parameters"
TENSORS = "Number of Tensors"
TFLOPS = "GPU TFLOPS"
MEM_BW = "GPU Memory Bandwidth (GB/s)"  # optional: a GPU missing from GPU_SPECS needs it

# Peak FP32 TFLOPS and memory bandwidth (GB/s) of the GPUs the orchestrator can rent: the two
# features the speed model scales a step time by to a GPU it has no measurement of
# (analysis.speed_model). K80/P100 TFLOPS are the values CM-DARE used as features (per GK210 die
# for the K80); the others are the vendors' data-sheet numbers (A100 40 GB; H100 SXM).
# ``tf32_tflops`` (dense, without sparsity): Ampere and later GPUs run TensorFlow's float32
# convolutions and matrix products on TF32 tensor cores by default (TensorFlow >= 2.4,
# https://www.tensorflow.org/api_docs/python/tf/config/experimental/enable_tensor_float_32_execution),
# so that is the arithmetic rate a float32 job gets there (:func:`compute_tflops`).
GPU_SPECS: dict[str, dict[str, float]] = {
    "K80": {"tflops": 4.113, "mem_bw_gbs": 240.0},
    "P100": {"tflops": 9.526, "mem_bw_gbs": 732.0},
    "V100": {"tflops": 15.7, "mem_bw_gbs": 900.0},
    "T4": {"tflops": 8.1, "mem_bw_gbs": 320.0},
    "A100": {"tflops": 19.5, "tf32_tflops": 156.0, "mem_bw_gbs": 1555.0},
    "L4": {"tflops": 30.3, "tf32_tflops": 60.0, "mem_bw_gbs": 300.0},
    "H100": {"tflops": 67.0, "tf32_tflops": 494.7, "mem_bw_gbs": 3350.0},
}

# MB of checkpoint file per tensor, measured on the 16 architectures with both columns.
_INDEX_MB_PER_TENSOR = 0.1036
_META_MB_PER_TENSOR = 0.0185


def mape(y_true: np.ndarray | pd.Series, y_pred: np.ndarray | pd.Series) -> float:
    """Mean absolute percentage error in percent (the metric of every CM-DARE table)."""
    y = np.asarray(y_true, dtype=float)
    p = np.asarray(y_pred, dtype=float)
    return float(np.mean(np.abs((y - p) / y)) * 100.0)


def gpu_tflops(name: str) -> float:
    """Peak TFLOPS of a GPU from :data:`GPU_SPECS`; NaN for an unknown name."""
    return GPU_SPECS.get(str(name).strip().upper(), {}).get("tflops", float("nan"))


def compute_tflops(name: str) -> float:
    """Peak TFLOPS a float32 TensorFlow job gets on a GPU: TF32 where the GPU has it (used by
    default), else FP32; NaN for an unknown name. The speed model's compute feature."""
    spec = GPU_SPECS.get(str(name).strip().upper(), {})
    return spec.get("tf32_tflops", spec.get("tflops", float("nan")))


def gpu_mem_bw(name: str) -> float:
    """Memory bandwidth (GB/s) of a GPU from :data:`GPU_SPECS`; NaN for an unknown name."""
    return GPU_SPECS.get(str(name).strip().upper(), {}).get("mem_bw_gbs", float("nan"))


def read_speed_csvs(paths: list[str | Path]) -> pd.DataFrame:
    """Concatenate speed CSVs (columns of ``0latency_k80_new.csv``), remembering the source file."""
    frames = [pd.read_csv(p).assign(source_file=Path(p).name) for p in paths]
    return pd.concat(frames, ignore_index=True)


def prepare_speed_frame(df: pd.DataFrame, lookup: pd.DataFrame | None = None) -> pd.DataFrame:
    """Return a copy of ``df`` with model-ready columns ``gpu, model, gflops, mparams, tensors,
    tflops, mem_bw, y`` (``y`` = step time in s, NaN when the file has no target).

    ``lookup`` (another prepared frame, e.g. the training data) lends tensor counts to rows of the
    same architecture whose file lacks them, so a P100 row can borrow the K80 row's count.
    """
    if FLOPS not in df.columns and PARAMS not in df.columns:
        raise ValueError(f"speed CSV needs '{FLOPS}' or '{PARAMS}'; got {list(df.columns)}")
    out = pd.DataFrame(index=df.index)
    out["gpu"] = df[GPU].astype(str).str.strip() if GPU in df.columns else "unknown"
    out["model"] = df[MODEL].astype(str).str.strip() if MODEL in df.columns else "unknown"
    params = pd.to_numeric(df.get(PARAMS), errors="coerce") if PARAMS in df.columns else None
    flops = pd.to_numeric(df.get(FLOPS), errors="coerce") if FLOPS in df.columns else None
    if flops is None:  # FLOPs track parameters closely (≈880 FLOP/param) in every CM-DARE table
        flops = params * 880.0
    out["gflops"] = flops / 1e9
    out["mparams"] = (params if params is not None else flops / 880.0) / 1e6
    tflops = pd.to_numeric(df[TFLOPS], errors="coerce") if TFLOPS in df.columns else np.nan
    out["tflops"] = pd.Series(tflops, index=df.index).fillna(out["gpu"].map(compute_tflops))
    bw = pd.to_numeric(df[MEM_BW], errors="coerce") if MEM_BW in df.columns else np.nan
    out["mem_bw"] = pd.Series(bw, index=df.index).fillna(out["gpu"].map(gpu_mem_bw))
    out["tensors"] = _impute_tensors(df, out, lookup)
    if TARGET in df.columns:
        out["y"] = pd.to_numeric(df[TARGET], errors="coerce")
    elif SPEED in df.columns:
        out["y"] = 1.0 / pd.to_numeric(df[SPEED], errors="coerce")
    else:
        out["y"] = np.nan
    return out


def _impute_tensors(
    df: pd.DataFrame, out: pd.DataFrame, lookup: pd.DataFrame | None
) -> pd.Series:
    """Tensor count per row: own column, then same model elsewhere, then checkpoint file sizes."""
    tensors = (
        pd.to_numeric(df[TENSORS], errors="coerce")
        if TENSORS in df.columns
        else pd.Series(np.nan, index=df.index)
    )
    known = pd.concat(
        [out.assign(tensors=tensors)[["model", "tensors"]]]
        + ([lookup[["model", "tensors"]]] if lookup is not None else [])
    ).dropna()
    by_model = known.groupby("model")["tensors"].median()
    tensors = tensors.fillna(out["model"].map(by_model))
    for column, mb_per_tensor in (
        ("Index File Size", _INDEX_MB_PER_TENSOR),
        ("Meta File Size", _META_MB_PER_TENSOR),
    ):
        if column in df.columns:
            tensors = tensors.fillna(
                (pd.to_numeric(df[column], errors="coerce") / mb_per_tensor).round()
            )
    return tensors


def per_architecture(prepared: pd.DataFrame) -> pd.DataFrame:
    """One row per (gpu, model): feature values and mean step time.

    Rows of one architecture are near-duplicates (13 samples of the same run), so the models are
    fitted on these means: every architecture then weighs the same whatever its sample count.
    """
    agg = {"gflops": "first", "mparams": "first", "tensors": "first", "tflops": "first",
           "mem_bw": "first", "y": "mean"}
    return prepared.groupby(["gpu", "model"], as_index=False, sort=False).agg(agg)
