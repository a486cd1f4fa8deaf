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

# Peak FP32 TFLOPS and memory bandwidth (GB/s) of the GPUs the orchestrator can rent. K80/P100
# TFLOPS are the values CM-DARE used as features (per GK210 die for the K80); the others are the
# vendors' data-sheet numbers. Bandwidth is only used to rank GPUs for unseen-GPU scaling.
GPU_SPECS: dict[str, dict[str, float]] = {
    "K80": {"tflops": 4.113, "mem_bw_gbs": 240.0},
    "P100": {"tflops": 9.526, "mem_bw_gbs": 732.0},
    "V100": {"tflops": 15.7, "mem_bw_gbs": 900.0},
    "T4": {"tflops": 8.1, "mem_bw_gbs": 320.0},
    "A100": {"tflops": 19.5, "mem_bw_gbs": 1555.0},
    "L4": {"tflops": 30.3, "mem_bw_gbs": 300.0},
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


def read_speed_csvs(paths: list[str | Path]) -> pd.DataFrame:
    """Concatenate speed CSVs (columns of ``0latency_k80_new.csv``), remembering the source file."""
    frames = [pd.read_csv(p).assign(source_file=Path(p).name) for p in paths]
    return pd.concat(frames, ignore_index=True)


def prepare_speed_frame(df: pd.DataFrame, lookup: pd.DataFrame | None = None) -> pd.DataFrame:
    """Return a copy of ``df`` with model-ready columns ``gpu, model, gflops, mparams, tensors,
    tflops, y`` (``y`` = step time in s, NaN when the file has no target).

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
    out["tflops"] = pd.Series(tflops, index=df.index).fillna(out["gpu"].map(gpu_tflops))
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
    agg = {"gflops": "first", "mparams": "first", "tensors": "first", "tflops": "first", "y": "mean"}
    return prepared.groupby(["gpu", "model"], as_index=False, sort=False).agg(agg)
