"""Cluster-size scaling and parameter-server (PS) bottleneck detection (CM-DARE, ICDCS'20).

Asynchronous PS training adds one worker's throughput per worker until the PS saturates: every
step pulls all parameters from and pushes all gradients to the PS, so the PS's network/CPU caps
the cluster at ``capacity ≈ bandwidth·#PS / (8 bytes·parameters)`` steps/s. The model here is
therefore ``speed(n) = min(eff·n·s1, cap)`` per (GPU, #PS, model), and the capacity is expressed
as an effective PS bandwidth so it transfers to models and PS counts that were not measured.
A bottleneck is flagged where adding workers stops adding throughput for at least two worker
counts in a row (one flat point is noise: the P100 runs vary by ±5 %).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from analysis.cli import command_parser
from analysis.features import CMDARE_DIR

CLUSTER_DIR = CMDARE_DIR / "speed_and_cluster_size"
DERIVED_FILE = CMDARE_DIR / "derived" / "cluster_speed_by_workers.csv"
# Parameter counts of the four cluster-study models (from cmdare/speed_data).
MODEL_PARAMS = {
    "ResNet-15": 693_818,
    "ResNet-32": 1_857_722,
    "Shake Shake Small": 2_926_986,
    "Shake Shake Big": 26_204_362,
}
_FOLDER_RE = re.compile(r"^(res15|res32|shakes?big|shakesmall)\D*?(k80|p100|80|100)?(ps2)?worker(\d)$")
_MODEL_NAMES = {"res15": "ResNet-15", "res32": "ResNet-32", "shakebig": "Shake Shake Big",
                "shakesbig": "Shake Shake Big", "shakesmall": "Shake Shake Small"}


def load_cluster_speeds(warmup_fraction: float = 0.1) -> pd.DataFrame:
    """Cluster speed per (gpu, parameter_servers, model, workers) from the 96 TensorBoard exports.

    The first ``warmup_fraction`` of each series (start-up, workers still joining) is dropped;
    ``speed`` is the median of the rest, robust to the evaluator pauses that dent the series.
    """
    rows = []
    for setting in ("k80", "p100", "p100ps2"):
        for folder in sorted((CLUSTER_DIR / setting).iterdir()):
            match = _FOLDER_RE.match(folder.name)
            if match is None:
                raise ValueError(f"unexpected cluster folder name {folder}")
            values = pd.read_csv(folder / "run_.-tag-global_step_sec.csv")["Value"].to_numpy()
            values = values[int(len(values) * warmup_fraction):]
            rows.append({
                "gpu": "K80" if setting == "k80" else "P100",
                "parameter_servers": 2 if setting.endswith("ps2") else 1,
                "model": _MODEL_NAMES[match.group(1)],
                "workers": int(match.group(4)),
                "speed": float(np.median(values)),
                "speed_mean": float(values.mean()),
                "speed_std": float(values.std(ddof=1)),
                "n_samples": len(values),
            })
    return pd.DataFrame(rows).sort_values(["gpu", "parameter_servers", "model", "workers"],
                                          ignore_index=True)


def load_derived_cluster_speeds() -> pd.DataFrame:
    """The means the authors plotted (``derived/cluster_speed_by_workers.csv``), same columns."""
    df = pd.read_csv(DERIVED_FILE)
    return df.rename(columns={"speed_mean_steps_per_s": "speed",
                              "speed_std_steps_per_s": "speed_std"}).drop(columns="source")


@dataclass(frozen=True)
class ScalingFit:
    """Fitted ``speed(n) = min(efficiency·n·s1, capacity)`` for one configuration."""

    gpu: str
    parameter_servers: int
    model: str
    single_worker_speed: float
    efficiency: float
    capacity: float  # steps/s; inf when no saturation was observed
    mape: float

    def predict(self, workers: int | np.ndarray) -> np.ndarray:
        n = np.asarray(workers, dtype=float)
        return np.minimum(self.efficiency * n * self.single_worker_speed, self.capacity)


def _fit_group(g: pd.DataFrame) -> tuple[float, float]:
    n, s = g["workers"].to_numpy(float), g["speed"].to_numpy(float)
    s1 = float(s[n == 1][0]) if (n == 1).any() else float(s[0] / n[0])

    def resid(p: np.ndarray) -> np.ndarray:
        return np.log(np.minimum(p[0] * n * s1, np.exp(p[1]))) - np.log(s)

    fit = least_squares(resid, x0=[1.0, np.log(s.max() * 1.5)],
                        bounds=([0.3, np.log(s.min())], [1.5, np.log(s.max() * 50)]))
    eff, cap = float(fit.x[0]), float(np.exp(fit.x[1]))
    return eff, (cap if cap < eff * n.max() * s1 else float("inf"))


def fit_scaling(df: pd.DataFrame | None = None) -> list[ScalingFit]:
    """Fit the saturating-linear model per (gpu, parameter_servers, model)."""
    df = load_derived_cluster_speeds() if df is None else df
    fits = []
    for (gpu, ps, model), g in df.groupby(["gpu", "parameter_servers", "model"]):
        g = g.sort_values("workers")
        eff, cap = _fit_group(g)
        s1 = float(g["speed"].iloc[0] / g["workers"].iloc[0])
        fit = ScalingFit(gpu, int(ps), model, s1, eff, cap, 0.0)
        err = float(np.mean(np.abs(fit.predict(g["workers"]) / g["speed"] - 1)) * 100)
        fits.append(ScalingFit(gpu, int(ps), model, s1, eff, cap, err))
    return fits


def ps_bandwidth_bytes_per_s(fits: list[ScalingFit]) -> float:
    """Effective per-PS bandwidth implied by the saturated fits: cap·8·params/#PS (median)."""
    values = [f.capacity * 8 * MODEL_PARAMS[f.model] / f.parameter_servers
              for f in fits if np.isfinite(f.capacity) and f.model in MODEL_PARAMS]
    return float(np.median(values)) if values else float("inf")


def predict_cluster_speed(
    single_worker_speed: float,
    workers: int | np.ndarray,
    parameter_servers: int = 1,
    parameters: int | None = None,
    efficiency: float | None = None,
    ps_bandwidth: float | None = None,
) -> np.ndarray:
    """Cluster steps/s of ``workers`` asynchronous workers.

    Linear in workers with the measured efficiency (median over configurations if not given),
    capped by what ``parameter_servers`` PS can serve for a model with ``parameters`` weights
    (no cap when ``parameters`` is None).
    """
    fits = fit_scaling() if efficiency is None or ps_bandwidth is None else []
    eff = efficiency if efficiency is not None else float(np.median([f.efficiency for f in fits]))
    linear = eff * np.asarray(workers, dtype=float) * single_worker_speed
    if parameters is None:
        return linear
    bw = ps_bandwidth if ps_bandwidth is not None else ps_bandwidth_bytes_per_s(fits)
    return np.minimum(linear, bw * parameter_servers / (8.0 * parameters))


def detect_ps_bottleneck(df: pd.DataFrame | None = None, threshold: float = 0.5) -> pd.DataFrame:
    """Per (gpu, parameter_servers, model): where adding a worker adds < ``threshold`` of one
    worker's speed for every further worker count (and at least two of them).

    Columns: ``saturation_workers`` (NaN if none), ``saturation_speed`` (mean speed from there
    on), ``max_speed``, ``bottleneck`` (bool).
    """
    df = load_derived_cluster_speeds() if df is None else df
    rows = []
    for (gpu, ps, model), g in df.groupby(["gpu", "parameter_servers", "model"]):
        g = g.sort_values("workers")
        n, s = g["workers"].to_numpy(), g["speed"].to_numpy(float)
        gain = np.diff(s) / s[0] * n[0]  # marginal speed-up in units of one worker
        sat = None
        for i in range(len(gain) - 1):  # i+1 is the first worker count of the flat tail
            if (gain[i:] < threshold).all():
                sat = i + 1
                break
        rows.append({
            "gpu": gpu, "parameter_servers": int(ps), "model": model,
            "saturation_workers": float(n[sat]) if sat is not None else np.nan,
            "saturation_speed": float(s[sat:].mean()) if sat is not None else np.nan,
            "max_speed": float(s.max()), "bottleneck": sat is not None,
        })
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """``scaling`` subcommand: fitted scaling curves and PS-bottleneck flags."""
    parser = command_parser(
        "scaling",
        description="Cluster-size scaling of asynchronous PS training and PS-bottleneck "
        "detection from CM-DARE's speed_and_cluster_size measurements.")
    parser.add_argument("--source", choices=["derived", "raw"], default="derived",
                        help="authors' plotted means (derived) or the TensorBoard exports (raw)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="marginal gain (in single-worker speeds) below which a worker "
                        "adds nothing (default 0.5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    df = load_derived_cluster_speeds() if args.source == "derived" else load_cluster_speeds()
    fits = fit_scaling(df)
    bottlenecks = detect_ps_bottleneck(df, args.threshold)
    if args.json:
        print(json.dumps({
            "fits": [{**asdict(f), "capacity": f.capacity if np.isfinite(f.capacity) else None}
                     for f in fits],
            "bottlenecks": json.loads(bottlenecks.to_json(orient="records")),
            "ps_bandwidth_bytes_per_s": ps_bandwidth_bytes_per_s(fits),
        }))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Cluster scaling: speed(n) = min(eff·n·s1, cap)")
    for col in ("GPU", "#PS", "model", "s1", "eff", "cap", "fit MAPE %", "saturates at", "flag"):
        table.add_column(col)
    flags = bottlenecks.set_index(["gpu", "parameter_servers", "model"])
    for f in fits:
        b = flags.loc[(f.gpu, f.parameter_servers, f.model)]
        sat = "-" if np.isnan(b["saturation_workers"]) else (
            f"{int(b['saturation_workers'])} workers, {b['saturation_speed']:.1f}/s")
        table.add_row(f.gpu, str(f.parameter_servers), f.model, f"{f.single_worker_speed:.2f}",
                      f"{f.efficiency:.2f}", f"{f.capacity:.1f}", f"{f.mape:.1f}", sat,
                      "PS BOTTLENECK" if b["bottleneck"] else "")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
