"""Sync-Switch (ICDCS'21): accuracy and time per protocol and switch point, and the offline policy.

A hybrid run trains the first fraction ``f`` of a BSP step budget B with BSP, then switches to
ASP for the rest (1 BSP step = N ASP global steps for N workers). Why it matters: BSP converges
to a better accuracy but is slow; ASP is fast but worse; a short BSP phase buys most of BSP's
accuracy at close to ASP's time. The offline policy searches, over recurring runs of one job,
for the smallest BSP share whose accuracy stays within a tolerance of full BSP.

Times use the files' ``Time`` column (restart gap at the switch removed), as in the paper.
Run: ``python -m analysis syncswitch [reference | SWEEP_DIR] [--dataset NAME] [--json]``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from analysis.cli import command_parser
from analysis.reference import read_syncswitch_curve, reference_path

# dataset → (workers N, BSP step budget B); from the README's step-budget conversion.
DATASETS = {"cifar10_res32": (8, 8000), "cifar100_res50": (8, 16000), "cluster_16": (16, 4000)}
RUN_GROUPS = {"cifar10_res32": ("baseline", "switch_exp"), "cifar100_res50": (".",),
              "cluster_16": (".",)}
# Runs the README flags as not comparable; each is kept out of the means, with the reason.
EXCLUDED_RUNS = {
    "cifar10_res32/baseline/bsp_1": "restarted from a step-5,500 checkpoint (reminder.txt); 1.7× slower",
}
STEP_TOLERANCE = 0.05  # a run is complete when its last step is within 5 % of the phase target
_CIFAR100_SHARES = {"6": 6.25, "12": 12.5}  # folder "6_94" means 6.25 % BSP, "12_88" 12.5 %


@dataclass(frozen=True)
class SwitchRun:
    """One training run: protocol mix, converged accuracy and training time (s, gaps removed)."""

    dataset: str
    name: str
    bsp_fraction: float  # share of the BSP step budget trained with BSP (1 = BSP, 0 = ASP)
    asp_first: bool
    run: int
    time_s: float | None
    accuracy: float | None
    complete: bool
    note: str = ""

    @property
    def protocol(self) -> str:
        return protocol_label(self.bsp_fraction, self.asp_first)


def protocol_label(bsp_fraction: float, asp_first: bool = False) -> str:
    """``BSP``, ``ASP``, ``BSP 5% → ASP`` or ``ASP 75% → BSP``."""
    if bsp_fraction >= 1:
        return "BSP"
    if bsp_fraction <= 0:
        return "ASP"
    if asp_first:
        return f"ASP {100 * (1 - bsp_fraction):g}% → BSP"
    return f"BSP {100 * bsp_fraction:g}% → ASP"


def parse_run_name(name: str) -> tuple[float, bool, int]:
    """Folder name → (BSP fraction, ASP first?, run number); raises ValueError if unknown."""
    run_match = re.search(r"(?:run|_)_?(\d+)$", name)
    run = int(run_match.group(1)) if run_match else 1
    if m := re.match(r"b(\d+)[-_]a\d+", name):
        return int(m.group(1)) / 100, False, run
    if m := re.match(r"a(\d+)[-_]b\d+", name):
        return 1 - int(m.group(1)) / 100, True, run
    if m := re.match(r"(\d+)_(\d+)_(\d+)$", name):
        return _CIFAR100_SHARES.get(m.group(1), float(m.group(1))) / 100, False, int(m.group(3))
    if m := re.match(r"(\d\d)(\d\d)_run\d+$", name):
        return int(m.group(1)) / 100, False, run
    if name.startswith("bsp"):
        return 1.0, False, run
    if name.startswith("asp"):
        return 0.0, False, run
    raise ValueError(f"unrecognised Sync-Switch run folder name {name!r}")


def target_steps(bsp_fraction: float, workers: int, budget_bsp_steps: int) -> float:
    """Global step at the end of training: f·B BSP steps plus (1−f)·B·N ASP steps."""
    return bsp_fraction * budget_bsp_steps + (1 - bsp_fraction) * budget_bsp_steps * workers


def _last_step(run_dir: Path) -> float:
    steps = [pd.read_csv(run_dir / f)["Step"].max() for f in ("acc.csv", "loss.csv")
             if (run_dir / f).exists()]
    return float(max(steps)) if steps else math.nan


def load_reference_runs(dataset: str = "cifar10_res32") -> list[SwitchRun]:
    """Every run of one Sync-Switch dataset, with completeness and exclusion notes."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown Sync-Switch dataset {dataset!r} ({', '.join(DATASETS)})")
    workers, budget = DATASETS[dataset]
    runs = []
    for group in RUN_GROUPS[dataset]:
        for run_dir in sorted(p for p in reference_path("syncswitch", dataset, group).iterdir()
                              if p.is_dir()):
            fraction, asp_first, number = parse_run_name(run_dir.name)
            curve, time_s = read_syncswitch_curve(run_dir)
            rel = str(Path(dataset, group, run_dir.name)).replace("/./", "/")
            last = _last_step(run_dir)
            target = target_steps(fraction, workers, budget)
            complete = abs(last / target - 1) <= STEP_TOLERANCE
            note = EXCLUDED_RUNS.get(rel, "" if complete else f"partial: step {last:.0f} of {target:.0f}")
            runs.append(SwitchRun(
                dataset=dataset, name=rel, bsp_fraction=fraction, asp_first=asp_first, run=number,
                time_s=time_s,
                accuracy=float(curve["accuracy"].iloc[-1]) if len(curve) else None,
                complete=complete and rel not in EXCLUDED_RUNS, note=note,
            ))
    return runs


def reference_curves(dataset: str = "cifar10_res32") -> dict[str, pd.DataFrame]:
    """Evaluation curves (``time_s, step, accuracy``) of the complete runs, by run name."""
    curves = {}
    for run in load_reference_runs(dataset):
        if run.complete:
            curve, _ = read_syncswitch_curve(reference_path("syncswitch", run.name))
            if len(curve):
                curves[run.name] = curve
    return curves


def summarize(runs: list[SwitchRun]) -> pd.DataFrame:
    """Per protocol/switch point: runs, mean training time and mean converged accuracy.

    Means skip what a run cannot give (a run without a processed curve has a time but no final
    evaluation); ``speedup_vs_bsp`` and ``accuracy_gain_vs_asp`` compare with the baselines.
    """
    df = pd.DataFrame([asdict(r) | {"protocol": r.protocol} for r in runs if r.complete])
    if df.empty:
        return df
    table = (
        # "dataset" keeps our runs of different cluster sizes apart ("own, 4 workers")
        df.groupby(["dataset", "bsp_fraction", "asp_first", "protocol"], sort=True)
        .agg(runs=("name", "size"), time_s=("time_s", "mean"), time_std_s=("time_s", "std"),
             accuracy=("accuracy", "mean"), accuracy_std=("accuracy", "std"))
        .reset_index()
        .sort_values(["dataset", "asp_first", "bsp_fraction"], ascending=[True, True, False])
    )
    bsp = table[table["bsp_fraction"] == 1.0]
    asp = table[table["bsp_fraction"] == 0.0]
    table["speedup_vs_bsp"] = bsp["time_s"].iloc[0] / table["time_s"] if len(bsp) else math.nan
    table["accuracy_gain_vs_asp"] = table["accuracy"] - asp["accuracy"].iloc[0] if len(asp) else math.nan
    return table.reset_index(drop=True)


def time_to_accuracy(curve: pd.DataFrame, target: float) -> float:
    """First ``time_s`` at which the evaluation accuracy reaches ``target``; NaN if never."""
    hit = curve[curve["accuracy"] >= target]
    return float(hit["time_s"].iloc[0]) if len(hit) else math.nan


# --------------------------------------------------------------------------- offline policy
@dataclass(frozen=True)
class PolicyDecision:
    """Next BSP fraction to try (None when the search has converged) and the best so far."""

    next_fraction: float | None
    best_fraction: float
    best_accuracy: float
    threshold: float
    lower: float  # largest tried fraction known to miss the threshold (0 = ASP)
    upper: float  # smallest tried fraction known to meet it (1 = BSP)


def recommend_next_fraction(
    results: Mapping[float, float] | pd.DataFrame,
    tolerance: float = 0.005,
    bsp_accuracy: float | None = None,
    min_gap: float = 1 / 64,
) -> PolicyDecision:
    """Binary search for the smallest BSP share whose accuracy is ≥ BSP accuracy − tolerance.

    ``results`` maps a tried fraction (0–1) to its (mean) converged accuracy, or is a
    :func:`summarize` table. Full BSP (1.0) is assumed to pass; its accuracy is taken from
    ``results[1.0]`` unless ``bsp_accuracy`` is given (raises ValueError if neither). The bet,
    as in the paper: accuracy is monotone in the BSP share, so the answer lies between the largest
    failing and the smallest passing fraction, and halving that gap (50 %, 25 %, 12.5 %, … when
    everything passes) finds it in a few recurring runs. Stops when the gap is below ``min_gap``.
    """
    if isinstance(results, pd.DataFrame):
        frame = results[~results.get("asp_first", False)] if "asp_first" in results else results
        results = dict(zip(frame["bsp_fraction"], frame["accuracy"], strict=True))
    results = {float(f): float(a) for f, a in results.items() if not math.isnan(a)}
    if bsp_accuracy is None:
        if 1.0 not in results:
            raise ValueError("need the full-BSP accuracy: pass bsp_accuracy or a result at 1.0")
        bsp_accuracy = results[1.0]
    threshold = bsp_accuracy - tolerance
    passing = sorted(f for f, a in results.items() if a >= threshold) or [1.0]
    upper = min([*passing, 1.0])
    lower = max([f for f, a in results.items() if a < threshold and f < upper], default=0.0)
    best_acc = results.get(upper, bsp_accuracy)
    next_fraction = None if upper - lower <= min_gap else (lower + upper) / 2
    return PolicyDecision(next_fraction, upper, best_acc, threshold, lower, upper)


# --------------------------------------------------------------------------- our own runs
def own_runs(source: str | Path) -> list[SwitchRun]:
    """Our runs as SwitchRuns: BSP share from ``phases`` (else ``protocol``), time = the sum of
    phase wall times (switch pauses excluded, like ``Time``), else ``train_time_s``."""
    from analysis.runs import STATUS_COMPLETED, load_runs

    out = []
    for run in load_runs(source):
        s = run.summary
        workers = max(int(s.workers or 1), 1)
        if s.phases:
            bsp = sum(p.end_step - p.start_step for p in s.phases if p.protocol == "bsp")
            asp = sum(p.end_step - p.start_step for p in s.phases if p.protocol == "asp") / workers
            fraction = bsp / (bsp + asp) if bsp + asp else math.nan
            asp_first = s.phases[0].protocol == "asp" and 0 < fraction < 1
            time_s = sum(p.wall_s for p in s.phases) or s.train_time_s
        else:
            # a schedule such as "bsp>asp" without phases has no known BSP share: NaN
            fraction = {"bsp": 1.0, "asp": 0.0}.get((s.protocol or "").lower(), math.nan)
            asp_first, time_s = False, s.train_time_s or s.wall_time_s
        out.append(SwitchRun(f"own, {workers} worker{'s' * (workers != 1)}", run.name, round(fraction, 4), asp_first, 1, time_s,
                             s.final_accuracy, s.status in (None, STATUS_COMPLETED), s.status or ""))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis syncswitch``: table per switch point plus the policy's next step."""
    parser = command_parser(
        "syncswitch",
        description="Converged accuracy and time per protocol / BSP→ASP switch point, and the "
        "offline policy's next BSP fraction to try.",
    )
    parser.add_argument("source", nargs="?", default="reference",
                        help="'reference' (Sync-Switch data) or a sweep/run directory of ours")
    parser.add_argument("--dataset", default="cifar10_res32", choices=sorted(DATASETS))
    parser.add_argument("--tolerance", type=float, default=0.005,
                        help="accuracy (fraction) the policy may give up vs BSP [0.005]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs = load_reference_runs(args.dataset) if args.source == "reference" else own_runs(args.source)
    table = summarize(runs)
    if table.empty:
        print("no complete runs found")
        return 1
    decision = recommend_next_fraction(table, args.tolerance) if (table["bsp_fraction"] == 1).any() else None
    if args.json:
        print(json.dumps({"table": json.loads(table.to_json(orient="records")),
                          "policy": asdict(decision) if decision else None}, indent=1))
        return 0
    print(table.round(4).to_string(index=False))
    if decision:
        nxt = "done" if decision.next_fraction is None else f"{100 * decision.next_fraction:g} %"
        print(f"\npolicy (tolerance {args.tolerance:g}): best BSP share so far "
              f"{100 * decision.best_fraction:g} % (accuracy {decision.best_accuracy:.4f}); next to try: {nxt}")
    return 0

