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
  are returned as their measured mean.
* **Another GPU** (:meth:`SpeedModel.hardware_exponent`). A training step is limited partly by
  arithmetic and partly by memory traffic (a CIFAR ResNet's small convolutions, batch norm and
  element-wise ops mostly stream memory). So a step time scales between GPUs as
  ``t ∝ TFLOPS^-w · bandwidth^-(1-w)``: ``w = 1`` compute-bound, ``w = 0`` bandwidth-bound, one
  number fitted by least squares on the measured GPUs' per-architecture time ratios (each pair
  of GPUs weighs the same). An unmeasured GPU is scaled from the nearest measured GPU in
  (log TFLOPS, log bandwidth); a GPU with a few measured architectures only (the papers' V100)
  keeps those and scales the rest from a fitted GPU by its own measured ratio.
  TFLOPS alone made an L4 (30 TFLOPS, 300 GB/s) faster than an A100; the papers' own V100 is
  1.2× a P100 for 1.65× the TFLOPS and 1.23× the bandwidth.

How wrong it is on held-out data (the spread the simulator draws from): analysis/speed_error.py.
"""

from __future__ import annotations

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

from analysis.cli import command_parser
from analysis.features import (
    CMDARE_DIR,
    compute_tflops,
    gpu_mem_bw,
    per_architecture,
    prepare_speed_frame,
    read_speed_csvs,
)
from analysis.features import mape as _mape

DEFAULT_TRAIN = CMDARE_DIR / "speed_data" / "0latency_norm_computation.csv"
_FEATURE_SETS: tuple[tuple[str, ...], ...] = (("gflops", "tensors"), ("gflops",))
#: A GPU with fewer measured architectures than this gets no complexity model of its own: its
#: other architectures are a fitted GPU's predictions times its measured ratio to that GPU.
MIN_FIT_ARCHITECTURES = 8


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
        if "mem_bw" not in self.table.columns:  # a model saved before bandwidth was a feature
            self.table["mem_bw"] = self.table["gpu"].map(gpu_mem_bw)
        self._components: dict[tuple[str, tuple[str, ...]], _Component | None] = {}

    @property
    def gpus(self) -> list[str]:
        return sorted(self.table["gpu"].unique())

    @property
    def fitted_gpus(self) -> list[str]:
        """GPUs with enough measured architectures for a complexity model of their own (the
        best-covered GPUs when none has :data:`MIN_FIT_ARCHITECTURES`)."""
        counts = self.table.groupby("gpu")["model"].nunique()
        return sorted(counts[counts >= min(MIN_FIT_ARCHITECTURES, counts.max())].index)

    def specs(self) -> pd.DataFrame:
        """(tflops, mem_bw) of every measured GPU, indexed by name."""
        return self.table.groupby("gpu")[["tflops", "mem_bw"]].first()

    def spec_range(self) -> dict[str, list[float]]:
        """The measured GPUs' range of each hardware feature: what the model has seen."""
        specs = self.specs()
        return {"tflops": [float(specs["tflops"].min()), float(specs["tflops"].max())],
                "mem_bw_gbs": [float(specs["mem_bw"].min()), float(specs["mem_bw"].max())]}

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

    def hardware_exponent(self) -> float:
        """``w`` of ``t ∝ TFLOPS^-w · bandwidth^-(1-w)``, in [0, 1], by least squares on the log
        step-time ratio of every pair of measured GPUs (mean over the architectures both
        measured, each pair weighing the same: the architectures of one pair are one piece of
        evidence about the hardware). 0.5 when the pairs cannot tell the two apart (one GPU, or
        GPUs whose TFLOPS and bandwidth differ by the same factor)."""
        t = self.table.pivot_table(index="model", columns="gpu", values="y")
        specs = self.specs()
        num = den = 0.0
        gpus = list(t.columns)
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                both = t[[a, b]].dropna()
                if both.empty:
                    continue
                ratio = float(np.mean(np.log(both[a] / both[b])))
                d_tf = float(np.log(specs.loc[b, "tflops"] / specs.loc[a, "tflops"]))
                d_bw = float(np.log(specs.loc[b, "mem_bw"] / specs.loc[a, "mem_bw"]))
                num += (d_tf - d_bw) * (ratio - d_bw)
                den += (d_tf - d_bw) ** 2
        if den < 1e-3:
            return 0.5
        return float(np.clip(num / den, 0.0, 1.0))

    def _nearest(self, tflops: float, mem_bw: float, among: list[str]) -> str:
        """The GPU of ``among`` closest in (log TFLOPS, log bandwidth)."""
        specs = self.specs().loc[among]
        dist = np.hypot(np.log(specs["tflops"] / tflops), np.log(specs["mem_bw"] / mem_bw))
        return str(dist.idxmin())

    def _predict_anchored_gpu(self, frame: pd.DataFrame, gpu: str) -> np.ndarray:
        """A GPU with a few measured architectures: those as measured, the others as the
        nearest fitted GPU's prediction times this GPU's mean measured ratio to it."""
        spec = self.specs().loc[gpu]
        ref = self._nearest(spec["tflops"], spec["mem_bw"], self.fitted_gpus)
        own = self.table[self.table["gpu"] == gpu].reset_index(drop=True)
        factor = float(np.exp(np.mean(np.log(own["y"] / self._predict_known_gpu(own, ref)))))
        pred = self._predict_known_gpu(frame.assign(gpu=ref), ref) * factor
        measured = frame.merge(own[["model", "gflops", "y"]], on=["model", "gflops"],
                               how="left", suffixes=("", "_seen"))["y_seen"].to_numpy()
        return np.where(np.isnan(measured), pred, measured)

    def _predict_measured_gpu(self, frame: pd.DataFrame, gpu: str) -> np.ndarray:
        if gpu in self.fitted_gpus:
            return self._predict_known_gpu(frame, gpu)
        return self._predict_anchored_gpu(frame, gpu)

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        """Predicted step time (s) for each row of a raw or prepared speed frame."""
        frame = df if "gflops" in df.columns else prepare_speed_frame(df, lookup=self.table)
        frame = frame.reset_index(drop=True)
        if "mem_bw" not in frame.columns:
            frame = frame.assign(mem_bw=frame["gpu"].map(gpu_mem_bw))
        pred = np.full(len(frame), np.nan)
        specs = self.specs()
        for gpu, idx in frame.groupby("gpu").groups.items():
            rows = frame.loc[idx]
            if gpu in specs.index:
                pred[idx] = self._predict_measured_gpu(rows, gpu)
                continue
            tf, bw = float(rows["tflops"].iloc[0]), float(rows["mem_bw"].iloc[0])
            if np.isnan(tf) or np.isnan(bw):
                raise ValueError(f"unknown GPU {gpu!r}: give its 'GPU TFLOPS' and "
                                 f"'GPU Memory Bandwidth (GB/s)' columns")
            ref = self._nearest(tf, bw, list(specs.index))
            pred[idx] = self._predict_measured_gpu(rows.assign(gpu=ref), ref) * hardware_ratio(
                specs.loc[ref, "tflops"], specs.loc[ref, "mem_bw"], tf, bw,
                self.hardware_exponent())
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


def hardware_ratio(tflops_from: float, bw_from: float, tflops_to: float, bw_to: float,
                   w: float) -> float:
    """Step time on the ``to`` GPU / step time on the ``from`` GPU (``t ∝ TF^-w · BW^-(1-w)``)."""
    return float((tflops_from / tflops_to) ** w * (bw_from / bw_to) ** (1.0 - w))


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
                     "tflops": compute_tflops(gpu), "mem_bw": gpu_mem_bw(gpu),
                     "y": float(data["Step Time"].median())})
    return pd.DataFrame(rows)


def reference_speed_model() -> SpeedModel:
    """The speed model on every GPU the papers measured: K80 and P100 (16 architectures, the
    training table) and V100 (4 architectures, ``speed_data_base`` only)."""
    main = fit_speed_model(load_reference_speed_data()).table
    base = load_base_speed_table(main)
    return SpeedModel(pd.concat([main, base[base["gpu"] == "V100"]], ignore_index=True))


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
    parser = command_parser(
        "speed-model",
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
