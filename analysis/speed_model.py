"""Per-step time of a model on a GPU, predicted from model complexity (CM-DARE, ICDCS'20).

Method (why each choice):

* **Unit of evidence = architecture.** The 13 samples of one (GPU, model) pair come from one run
  and are near-duplicates, so models are fitted on per-architecture means and evaluated with
  leave-one-architecture-out CV (all GPUs' rows of the held-out model leave together).
* **Physical component.** A training step costs a fixed latency, work proportional to the FLOPs
  and a per-tensor cost (kernel launches, PS push/pull RPCs per variable):
  ``t = a + b·GFLOPs + c·tensors/100`` with a, b, c ≥ 0 (NNLS, weighted for relative error). It
  extrapolates sanely to models larger or smaller than any seen.
* **Smooth component.** A Gaussian process on log(GFLOPs), log(tensors) with an RBF + linear
  kernel captures the GPU's growing efficiency on wider layers, which the additive form misses.
* The prediction is the geometric mean of both. Architectures measured on the same GPU in training
  are returned as their measured mean; an unseen GPU is scaled from the nearest known GPU by
  peak TFLOPS with the exponent fitted between the known GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, DotProduct, WhiteKernel
from sklearn.preprocessing import StandardScaler

from analysis.features import (
    CMDARE_DIR,
    gpu_tflops,
    per_architecture,
    prepare_speed_frame,
    read_speed_csvs,
)
from analysis.features import mape as _mape

DEFAULT_TRAIN = CMDARE_DIR / "speed_data" / "0latency_norm_computation.csv"
_FEATURE_SETS: tuple[tuple[str, ...], ...] = (("gflops", "tensors"), ("gflops",))


class _Component:
    """NNLS + GP pair for one GPU and one feature set, fitted on per-architecture means."""

    def __init__(self, table: pd.DataFrame, features: tuple[str, ...]) -> None:
        self.features = features
        y = table["y"].to_numpy()
        design = self._design(table)
        self.coef, _ = nnls(design / y[:, None], np.ones_like(y))
        logx = np.log(table[list(features)].to_numpy(dtype=float))
        self.scaler = StandardScaler().fit(logx)
        kernel = (
            ConstantKernel(1.0) * RBF(length_scale=np.ones(len(features)))
            + DotProduct()
            + WhiteKernel(1e-3)
        )
        self.gp = GaussianProcessRegressor(
            kernel, normalize_y=True, n_restarts_optimizer=0, random_state=0
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.gp.fit(self.scaler.transform(logx), np.log(y))

    def _design(self, frame: pd.DataFrame) -> np.ndarray:
        cols = [np.ones(len(frame)), frame["gflops"].to_numpy(dtype=float)]
        if "tensors" in self.features:
            cols.append(frame["tensors"].to_numpy(dtype=float) / 100.0)
        return np.column_stack(cols)

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        physical = np.maximum(self._design(frame) @ self.coef, 1e-6)
        logx = np.log(frame[list(self.features)].to_numpy(dtype=float))
        smooth = self.gp.predict(self.scaler.transform(logx))
        return np.exp((np.log(physical) + smooth) / 2.0)


class SpeedModel:
    """Step-time predictor; keeps only its per-architecture training table (JSON-serialisable)
    and refits the small components on demand, so save/load needs no pickle."""

    def __init__(self, table: pd.DataFrame) -> None:
        self.table = table.reset_index(drop=True)
        self._components: dict[tuple[str, tuple[str, ...]], _Component | None] = {}

    @property
    def gpus(self) -> list[str]:
        return sorted(self.table["gpu"].unique())

    def _component(self, gpu: str, features: tuple[str, ...]) -> _Component | None:
        key = (gpu, features)
        if key not in self._components:
            rows = self.table[self.table["gpu"] == gpu].dropna(subset=[*features, "y"])
            self._components[key] = _Component(rows, features) if len(rows) >= 3 else None
        return self._components[key]

    def _predict_known_gpu(self, frame: pd.DataFrame, gpu: str) -> np.ndarray:
        pred = np.full(len(frame), np.nan)
        for features in _FEATURE_SETS:
            todo = np.isnan(pred) & frame[list(features)].notna().all(axis=1).to_numpy()
            comp = self._component(gpu, features) if todo.any() else None
            if comp is not None:
                pred[todo] = comp.predict(frame[todo])
        measured = frame.merge(
            self.table[self.table["gpu"] == gpu][["model", "gflops", "y"]],
            on=["model", "gflops"], how="left", suffixes=("", "_seen"),
        )["y_seen"].to_numpy()
        return np.where(np.isnan(measured), pred, measured)

    def _tflops_exponent(self) -> float:
        """How step time scales with peak TFLOPS between known GPUs (1.0 if only one GPU)."""
        t = self.table.pivot_table(index="model", columns="gpu", values="y").dropna()
        tf = self.table.groupby("gpu")["tflops"].first()
        if t.shape[1] < 2:
            return 1.0
        a, b = t.columns[0], t.columns[-1]
        return float(np.median(np.log(t[a] / t[b])) / np.log(tf[b] / tf[a]))

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        """Predicted step time (s) for each row of a raw or prepared speed frame."""
        frame = df if "gflops" in df.columns else prepare_speed_frame(df, lookup=self.table)
        frame = frame.reset_index(drop=True)
        pred = np.full(len(frame), np.nan)
        known = self.table.groupby("gpu")["tflops"].first()
        for gpu, idx in frame.groupby("gpu").groups.items():
            rows = frame.loc[idx]
            if gpu in known.index:
                pred[idx] = self._predict_known_gpu(rows, gpu)
                continue
            tf = float(rows["tflops"].iloc[0])
            if np.isnan(tf):
                raise ValueError(f"unknown GPU {gpu!r}: give its 'GPU TFLOPS' column")
            ref = (np.log(known) - np.log(tf)).abs().idxmin()
            scale = (known[ref] / tf) ** self._tflops_exponent()
            pred[idx] = self._predict_known_gpu(rows.assign(gpu=ref), ref) * scale
        return pred

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "cmdare-speed-model", "version": 1,
                "table": self.table.to_dict(orient="records")}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> SpeedModel:
        data = json.loads(Path(path).read_text())
        return cls(pd.DataFrame(data["table"]))


def fit_speed_model(frames: pd.DataFrame | list[pd.DataFrame]) -> SpeedModel:
    """Fit on raw speed frames (columns of ``0latency_k80_new.csv``); rows without target dropped."""
    raw = pd.concat(frames, ignore_index=True) if isinstance(frames, list) else frames
    prepared = prepare_speed_frame(raw)
    prepared = prepare_speed_frame(raw, lookup=prepared)  # borrow tensor counts across GPUs
    table = per_architecture(prepared.dropna(subset=["y", "gflops"]))
    return SpeedModel(table)


def load_reference_speed_data() -> pd.DataFrame:
    """K80 + P100 rows of all 16 architectures shipped with the package."""
    return pd.read_csv(DEFAULT_TRAIN)


def evaluate_leave_architecture_out(df: pd.DataFrame | None = None) -> dict[str, Any]:
    """Leave-one-architecture-out CV: each model name is held out on every GPU at once.

    Returns overall and per-GPU MAPE (%, mean over rows) and per-GPU, per-architecture MAPE.
    """
    raw = load_reference_speed_data() if df is None else df
    prepared = prepare_speed_frame(raw)
    prepared = prepare_speed_frame(raw, lookup=prepared).dropna(subset=["y"])
    pred = np.full(len(prepared), np.nan)
    for model in prepared["model"].unique():
        held = (prepared["model"] == model).to_numpy()
        fitted = SpeedModel(per_architecture(prepared[~held]))
        pred[held] = fitted.predict(prepared[held])
    out = prepared.assign(pred=pred, ape=np.abs(pred / prepared["y"] - 1) * 100)
    per_gpu = out.groupby("gpu")["ape"].mean()
    per_model = out.groupby(["gpu", "model"])["ape"].mean()
    return {
        "mape": float(out["ape"].mean()),
        "per_gpu": {g: float(v) for g, v in per_gpu.items()},
        "per_model": {g: {m: float(per_model[(g, m)]) for m in per_model[g].index}
                      for g in per_gpu.index},
        "n_architectures": int(prepared["model"].nunique()),
    }


#: ``speed_data_base/<folder>``'s architecture prefix → the speed table's model name.
_BASE_MODELS = {"res15": "Res15", "res32": "Res32", "shakebig": "shakebig",
                "shakesmall": "shakesmall"}


def load_base_speed_table(lookup: pd.DataFrame | None = None) -> pd.DataFrame:
    """CM-DARE's ``speed_data_base/``: a second, independent measurement of four architectures
    on K80 and P100 and the only V100 measurement, as a per-architecture table (the columns of
    :attr:`SpeedModel.table`; step time = the median of the run's 100-step readings, the
    features borrowed from ``lookup``, by default the K80+P100 training table)."""
    table = lookup if lookup is not None else fit_speed_model(load_reference_speed_data()).table
    features = table.groupby("model")[["gflops", "mparams", "tensors"]].first()
    rows = []
    for folder in sorted((CMDARE_DIR / "speed_data_base").iterdir()):
        arch = next(a for a in _BASE_MODELS if folder.name.startswith(a))
        gpu = folder.name[len(arch):].upper()
        data = pd.read_csv(folder / "data.csv").dropna(subset=["Step", "Step Time"])
        rows.append({"gpu": gpu, "model": _BASE_MODELS[arch],
                     **features.loc[_BASE_MODELS[arch]].to_dict(),
                     "tflops": gpu_tflops(gpu), "y": float(data["Step Time"].median())})
    return pd.DataFrame(rows)


def evaluate_leave_gpu_out() -> dict[str, Any]:
    """Leave-one-GPU-out: how wrong the speed model is on a GPU it never saw.

    The papers measured three GPUs: K80 and P100 (16 architectures, the training table) and
    V100 (4 architectures, ``speed_data_base`` only). Each is held out in turn; the model is
    fitted on the others' rows and predicts the held-out GPU's by the route an unmeasured GPU
    takes (the nearest fitted GPU scaled by peak TFLOPS). Each fold records the relative errors
    (log of predicted / measured) and how far the held-out GPU's TFLOPS lie outside the fitted
    range (``distance``, in natural-log units; 0 inside). Holding out P100 (between K80 and
    V100) is the one interpolation; K80 and V100 are extrapolations."""
    main = fit_speed_model(load_reference_speed_data()).table
    base = load_base_speed_table(main)
    data = {"K80": main[main["gpu"] == "K80"], "P100": main[main["gpu"] == "P100"],
            "V100": base[base["gpu"] == "V100"]}
    folds = {}
    for held, rows in data.items():
        train = pd.concat([d for g, d in data.items() if g != held], ignore_index=True)
        pred = SpeedModel(train).predict(rows.reset_index(drop=True))
        errors = np.log(pred / rows["y"].to_numpy())
        lo, hi = train["tflops"].min(), train["tflops"].max()
        tf = float(rows["tflops"].iloc[0])
        folds[held] = {"fitted_on": sorted(set(train["gpu"])), "n": len(rows),
                       "distance": round(tflops_distance(tf, lo, hi), 6),
                       "rms_log_error": round(float(np.sqrt(np.mean(errors ** 2))), 6),
                       "mean_log_error": round(float(np.mean(errors)), 6),
                       "mape": round(float(np.mean(np.abs(np.expm1(errors))) * 100), 3)}
    return folds


def tflops_distance(tflops: float, lo: float, hi: float) -> float:
    """How far (|log ratio|) a GPU's peak TFLOPS lie outside the fitted range [lo, hi]; 0 inside."""
    if tflops < lo:
        return float(np.log(lo / tflops))
    return float(np.log(tflops / hi)) if tflops > hi else 0.0


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
    * ``architecture``: an architecture measured on no GPU, on a fitted GPU: leave-one-
      architecture-out;
    * a GPU no paper measured: ``sqrt(inside² + (per_log_tflops · d)²)``, ``d`` the distance of
      its TFLOPS outside the fitted range; ``inside`` from the interpolating fold (P100 held
      out), ``per_log_tflops`` from the extrapolating folds (K80, V100 held out) by least
      squares on their excess variance (``Σ max(0, e² − inside²) / Σ d²``).

    Why log-normal: the errors are ratios (a GPU 1.4× slower than predicted), and a step time
    is positive."""
    folds = evaluate_leave_gpu_out()
    inside = [f for f in folds.values() if f["distance"] == 0]
    outside = [f for f in folds.values() if f["distance"] > 0]
    sigma_in = float(np.sqrt(np.mean([f["rms_log_error"] ** 2 for f in inside])))
    excess = sum(max(0.0, f["rms_log_error"] ** 2 - sigma_in ** 2) * f["n"] for f in outside)
    slope = float(np.sqrt(excess / sum(f["distance"] ** 2 * f["n"] for f in outside)))
    main = fit_speed_model(load_reference_speed_data()).table
    return {"measured": round(repeat_measurement_error(), 6),
            "architecture": round(architecture_error(), 6),
            "inside": round(sigma_in, 6), "per_log_tflops": round(slope, 6),
            "fitted_gpus": sorted(set(main["gpu"])),
            "tflops_range": [float(main["tflops"].min()), float(main["tflops"].max())],
            "folds": folds}


_FOLDER_MODEL = {"res": "Res", "cus": "custom", "shake32_d32": "shake small 32d"}


def measurement_sessions() -> pd.DataFrame:
    """Date (UTC) each (GPU, architecture) was measured, from the first wall time of its
    ``speed_data/0lat_<gpu>_<model>/`` TensorBoard export. Diagnostic only: no CSV a user gives
    the CLI carries it, so the predictor never uses it."""
    rows = []
    for folder in sorted((CMDARE_DIR / "speed_data").glob("0lat_*_*")):
        _, gpu, name = folder.name.split("_", 2)
        model = _FOLDER_MODEL.get(name, name)
        for short, long in (("res", "Res"), ("cus", "custom")):
            if model.startswith(short):
                model = long + model[len(short):]
        wall = pd.read_csv(next(folder.glob("*.csv")))["Wall time"].iloc[0]
        date = pd.Timestamp(wall, unit="s").strftime("%Y-%m-%d")
        rows.append({"gpu": gpu.upper(), "model": model, "session": date})
    return pd.DataFrame(rows)


def session_residuals(gpu: str) -> pd.DataFrame:
    """In-sample relative residual (%) of the additive fit ``a + b·GFLOPs + c·tensors`` per
    architecture on one GPU, with the date it was measured. On P100 the sign and size of the
    residual follow the measurement session (the architectures the model cannot explain were
    measured on other days), on K80 they do not: the P100 error floor is run-to-run hardware
    variation, not a missing model-complexity feature."""
    prepared = prepare_speed_frame(load_reference_speed_data())
    prepared = prepare_speed_frame(load_reference_speed_data(), lookup=prepared)
    table = per_architecture(prepared.dropna(subset=["y"]))
    table = table[table["gpu"] == gpu].reset_index(drop=True)
    design = np.column_stack([np.ones(len(table)), table["gflops"], table["tensors"] / 100.0])
    y = table["y"].to_numpy()
    coef, _ = nnls(design / y[:, None], np.ones_like(y))
    table["residual_pct"] = (y / (design @ coef) - 1) * 100.0
    return table.merge(measurement_sessions(), on=["gpu", "model"], how="left")


def reproduce_cmdare_baselines() -> dict[str, dict[str, float]]:
    """Re-run the CM-DARE notebook recipe (``sigmetrics2020_speed_prediction_2.ipynb``).

    Recipe: ``shuffle(random_state=0)`` of ``0latency_k80_new.csv`` / ``0latency_p100_new2.csv``,
    feature ``Normalized Model``, ``train_test_split(test_size=0.2, random_state=0)`` (a random
    *row* split, so every test architecture is also in training), LinearRegression and
    ``SVR(kernel='poly', degree=2, C=100, epsilon=0.01, coef0=1, gamma='auto')``. The shipped files
    lack four of the paper's 20 models, so the numbers cannot match the paper's exactly.
    """
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVR
    from sklearn.utils import shuffle

    paper = {"K80": (19.06, 9.96), "P100": (22.28, 13.79)}
    files = {"K80": "0latency_k80_new.csv", "P100": "0latency_p100_new2.csv"}
    result: dict[str, dict[str, float]] = {}
    for gpu, name in files.items():
        data = shuffle(pd.read_csv(CMDARE_DIR / "speed_data" / name), random_state=0)
        x, y = data[["Normalized Model"]], data["Step Time (s)"].to_numpy()
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0)
        lin = LinearRegression().fit(x_tr, y_tr)
        svr = SVR(kernel="poly", C=100, gamma="auto", degree=2, epsilon=0.01, coef0=1)
        svr.fit(x_tr, y_tr)
        result[gpu] = {
            "linear_mape": _mape(y_te, lin.predict(x_te)),
            "svr_mape": _mape(y_te, svr.predict(x_te)),
            "paper_linear_mape": paper[gpu][0],
            "paper_svr_mape": paper[gpu][1],
            "n_test": len(y_te),
        }
    return result


def evaluate_files(train: list[str | Path], test: str | Path) -> dict[str, Any]:
    """Fit on the train CSVs, predict the test CSV: the ``speed-model`` command's JSON object."""
    model = fit_speed_model(read_speed_csvs(list(train)))
    test_raw = pd.read_csv(test)
    frame = prepare_speed_frame(test_raw, lookup=model.table)
    pred = model.predict(frame)
    result: dict[str, Any] = {"mape": None, "n_test": len(frame), "per_model": {},
                              "predictions": [float(p) for p in pred]}
    scored = frame.assign(pred=pred).dropna(subset=["y"])
    if len(scored):
        result["mape"] = _mape(scored["y"], scored["pred"])
        result["per_model"] = {
            m: _mape(g["y"], g["pred"]) for m, g in scored.groupby("model", sort=False)
        }
    return result


def main(argv: list[str] | None = None) -> int:
    """``speed-model`` subcommand: fit on --train CSVs, report MAPE on --test."""
    parser = argparse.ArgumentParser(
        prog="python -m analysis speed-model",
        description="Predict per-step training time from model complexity and GPU type "
        "(CM-DARE speed model). CSVs have the columns of "
        "reference_data/cmdare/speed_data/0latency_k80_new.csv.",
    )
    parser.add_argument("--train", nargs="+", default=[str(DEFAULT_TRAIN)],
                        help="training CSV(s) (default: the shipped K80+P100 table)")
    parser.add_argument("--test", required=True, help="CSV to predict; scored if it has targets")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--save", help="also write the fitted model as JSON to this path")
    args = parser.parse_args(argv)
    if args.save:
        fit_speed_model(read_speed_csvs(args.train)).save(args.save)
    result = evaluate_files(args.train, args.test)
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Speed model on {Path(args.test).name} ({result['n_test']} rows)")
    table.add_column("architecture")
    table.add_column("MAPE %", justify="right")
    for model, value in result["per_model"].items():
        table.add_row(model, f"{value:.2f}")
    overall = "n/a (no targets)" if result["mape"] is None else f"{result['mape']:.2f}"
    table.add_row("[bold]all rows[/bold]", overall)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
