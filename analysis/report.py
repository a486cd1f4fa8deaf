"""HTML report: ``python -m analysis report SOURCE --out DIR`` → ``DIR/index.html`` + PNGs.

SOURCE is ``reference`` (the three papers' data) or one of our sweep/run directories. The page
explains each study in a sentence, then shows its figure and table, so a reader understands the
results without the code. Sections that the source cannot support say why instead of failing.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis import cost, lifetimes, plots, syncswitch
from analysis.cli import command_parser
from analysis.reference import reference_path

if TYPE_CHECKING:
    from analysis.runs import Run

SPEED_SATURATION_GAIN = 0.5  # a worker adding < half a single worker's speed = PS bottleneck
REFERENCE_CURVE_PROTOCOLS = ("BSP", "ASP", "BSP 5% → ASP", "BSP 25% → ASP")
# what a report of one configuration says instead of a plot with a single point
SWEEP_HINT = ("a sweep compares configurations, e.g. <code>python -m orchestrator "
              "+experiment=NAME -m cluster.workers=1,2,4</code>")


@dataclass
class Section:
    """One study on the page: prose, figures (file name, caption) and tables (caption, frame)."""

    title: str
    intro: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)


# --------------------------------------------------------------------------- speed vs workers
def flag_saturation(speeds: pd.DataFrame) -> pd.Series:
    """True where each worker added since the previous measured size brought less than
    SPEED_SATURATION_GAIN × the per-worker speed of the smallest measured cluster."""
    ordered = speeds.sort_values(["panel", "series", "workers"])
    groups = ordered.groupby(["panel", "series"], sort=False)
    per_added = groups["speed"].diff() / groups["workers"].diff()
    per_worker = groups["speed"].transform("first") / groups["workers"].transform("first")
    flagged = per_added < SPEED_SATURATION_GAIN * per_worker
    return flagged.reindex(speeds.index).astype(bool)


def _reference_speeds() -> tuple[pd.DataFrame, pd.DataFrame | None, str]:
    """CM-DARE cluster speeds; the bottleneck table comes from ``analysis.scaling`` when that
    module is installed (it owns the detector), else only the per-point saturation rule."""
    raw = pd.read_csv(reference_path("cmdare", "derived", "cluster_speed_by_workers.csv"))
    speeds = pd.DataFrame({
        "panel": raw["gpu"] + ", " + raw["parameter_servers"].astype(str) + " PS",
        "series": raw["model"], "workers": raw["workers"],
        "speed": raw["speed_mean_steps_per_s"], "speed_std": raw["speed_std_steps_per_s"],
    })
    speeds["bottleneck"] = flag_saturation(speeds)
    note, table = "", None
    try:
        from analysis import scaling

        table = scaling.detect_ps_bottleneck(scaling.load_cluster_speeds())
    except (ImportError, AttributeError) as exc:
        return speeds, None, f" (analysis.scaling unavailable: {exc}; saturation rule only)"
    if {"saturation_workers", "gpu", "parameter_servers", "model"} <= set(table.columns):
        # One definition of "bottleneck" on the page: the rings follow the detector's table.
        knee = raw.merge(table, on=["gpu", "parameter_servers", "model"], how="left")
        speeds["bottleneck"] = (knee["workers"] >= knee["saturation_workers"]).to_numpy()
    return speeds, table.round(2), note


def _speed_summary(speeds: pd.DataFrame) -> pd.DataFrame:
    """Per setting and series: speed at the fewest and the most workers measured, the best
    speed, and how much of linear scaling from the fewest to the most was kept."""
    rows = []
    for (panel, series), g in speeds.groupby(["panel", "series"], sort=True):
        g = g.sort_values("workers")
        first, last = g.iloc[0], g.iloc[-1]
        flagged = g[g["bottleneck"]]
        linear = last["workers"] / first["workers"] * first["speed"]
        rows.append({
            "setting": panel, "model/series": series,
            "workers": f"{int(first['workers'])}–{int(last['workers'])}",
            "speed at fewest (steps/s)": round(first["speed"], 2),
            "speed at most (steps/s)": round(last["speed"], 2),
            "best speed (steps/s)": round(g["speed"].max(), 2),
            "share of linear scaling at most": round(last["speed"] / linear, 2),
            "saturates from (workers)": int(flagged["workers"].min()) if len(flagged) else "—",
        })
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- sections
def _lifetime_section(out: Path) -> Section:
    df = lifetimes.load_lifetimes("cmdare")
    km, fits, hazards = {}, {}, {}
    for gpu, g in df.groupby("gpu", sort=True):
        km[gpu] = lifetimes.fit_kaplan_meier(g, label=gpu)
        fits[gpu] = lifetimes.fit_parametric(g)
        hazards[gpu] = lifetimes.hourly_hazard(g)
    plots.plot_lifetime_curves(km, fits, out / "lifetimes.png",
                               "Revocation of GCE preemptible GPU VMs (CM-DARE, 396 VMs)")
    plots.plot_hazard(hazards, out / "hazard.png", "Revocation hazard by hour since start")
    table = lifetimes.summarize_lifetimes(df).round(3)
    by_region = lifetimes.region_table("cmdare").round(2)
    return Section(
        "Revocation lifetimes",
        "How long a transient (preemptible) GPU VM lives before the cloud revokes it. GCE stops "
        "every preemptible VM after 24 h, so survivors are right-censored at 24 h (Kaplan–Meier); "
        "Weibull and exponential fits use interval censoring of the 1-hour bins. A Weibull shape "
        "ρ < 1 means the risk is highest right after start (a VM that survived the first hours is "
        "likely to live on). Exported for fault injection as <code>revocation_models.json</code>.",
        [("lifetimes.png", "Share of VMs revoked vs time (KM with 95 % CI; dashed Weibull, dotted "
          "exponential)"), ("hazard.png", "Hourly hazard: most revocations come in the first hour")],
        [("Per GPU (CM-DARE's set; paper: K80 46.2 %, P100 54.2 %, V100 57.5 % revoked in 24 h)",
          table), ("Per GPU and region", by_region)],
    )


def _cost_section(out: Path, source: str | Path) -> Section:
    table = cost.cost_table(source)
    reference = source == "reference"
    cols = ["config", "runs", "time_s", "cost_usd", "accuracy", "speedup_vs_1_on_demand",
            "savings_vs_1_on_demand_pct", "savings_vs_n_on_demand_pct", "pareto"]
    numbers = ("Per configuration (means over runs)", table[[c for c in cols if c in table]].round(4))
    priced = ("" if reference else " Our costs are the plan's hourly price × wall time at the "
              "run's price catalog: for <code>provider=local</code>, what the same cluster would "
              "cost in the cloud, not money spent.")
    if len(table) < 2:
        row = table.iloc[0]
        return Section("Cost and speed",
                       f"One configuration ({html.escape(str(row['config']))}): "
                       f"{row['time_s']:.1f} s wall time, ${row['cost_usd']:.4f}, accuracy "
                       f"{row['accuracy']:.4f}; nothing to compare it with; {SWEEP_HINT}.{priced}",
                       tables=[(numbers[0], numbers[1][cols[:5]])])
    title = ("ICAC'19: ResNet-32 / CIFAR-10, 64k steps on K80 (2019 prices)"
             if reference else "Our runs: wall time vs cost per configuration")
    plots.plot_cost_pareto(table, out / "cost_pareto.png", title,
                           "training time" if reference else "wall time per run")
    intro = ("Time, cost and accuracy of each cluster configuration, and which configurations are "
             "Pareto-optimal (nothing else is both faster and cheaper)." + priced
             + "".join(f" Note: {html.escape(n)}." for n in cost.comparison_notes(table)))
    if reference:
        h = cost.icac19_headline()
        intro += (f" <b>Headline:</b> 8 transient K80 workers take {h.transient_time_s:,.1f} s vs "
                  f"{h.on_demand_1_time_s:,.1f} s on one on-demand K80 ({h.speedup:.2f}× faster) "
                  f"and cost ${h.transient_cost_usd:.4f} vs ${h.on_demand_n_cost_usd:.4f} on 8 "
                  f"on-demand K80 ({h.savings_vs_n_on_demand_pct:.1f} % cheaper; paper: 7.7×, "
                  f"62.9 %), at {h.transient_accuracy:.4f} vs {h.on_demand_1_accuracy:.4f} accuracy.")
    return Section("Cost and speed", intro, [("cost_pareto.png", title)], [numbers])


def _syncswitch_reference_section(out: Path) -> Section:
    runs = syncswitch.load_reference_runs("cifar10_res32")
    table = syncswitch.summarize(runs)
    curves = syncswitch.reference_curves("cifar10_res32")
    protocols = {r.name: r.protocol for r in runs}
    shown = {n: c for n, c in curves.items() if protocols[n] in REFERENCE_CURVE_PROTOCOLS}
    plots.plot_accuracy_curves(shown, protocols, out / "accuracy_curves.png",
                               "CIFAR-10 ResNet-32, 8 workers: accuracy per protocol",
                               "training time, switch pauses removed")
    plots.plot_switch_tradeoff(table, out / "switch_tradeoff.png",
                               "Converged accuracy vs training time per switch point")
    decision = syncswitch.recommend_next_fraction(table, tolerance=0.005)
    nxt = "none (converged)" if decision.next_fraction is None else f"{100 * decision.next_fraction:g} %"
    excluded = pd.DataFrame([{"run": r.name, "reason": r.note} for r in runs if not r.complete])
    return Section(
        "Sync-Switch: BSP, ASP and hybrids",
        "BSP (synchronous) converges to higher accuracy but is slow; ASP is fast but less accurate. "
        "A hybrid trains the first X % of the BSP step budget with BSP, then switches to ASP. "
        f"Offline policy (tolerance 0.5 points of BSP accuracy): best BSP share "
        f"{100 * decision.best_fraction:g} % (accuracy {decision.best_accuracy:.4f}); next to try: {nxt}.",
        [("accuracy_curves.png", "Evaluation accuracy vs time, one line per run"),
         ("switch_tradeoff.png", "Each point: mean ± std over runs of one switch point")],
        [("Per protocol / switch point (paper: BSP 10,603.7 s / 0.9200, ASP 1,607.3 s / 0.8918, "
          "5 % BSP 2,085.7 s / 0.9174)", table.drop(columns=["asp_first", "dataset"]).round(4)),
         ("Runs left out", excluded)],
    )


def _own_speed_section(ok: pd.DataFrame, out: Path) -> Section:
    """Speed vs workers, drawn only when the runs span at least two cluster sizes."""
    proto = next((c for c in ("protocol", "sync.protocol") if c in ok), None)
    series = ok[proto].fillna("?").astype(str).str.upper() if proto else "all runs"
    panel = ok["experiment"].fillna("our runs").astype(str) if "experiment" in ok else "our runs"
    speeds = pd.DataFrame({"panel": panel, "series": series, "workers": ok["workers"],
                           "speed": ok["steps_per_sec"]})
    speeds = speeds.groupby(["panel", "series", "workers"], as_index=False)["speed"].agg(
        speed="mean", speed_std="std", runs="size")
    if speeds["workers"].nunique() < 2:
        numbers = speeds.rename(columns={"panel": "experiment", "series": "protocol",
                                         "speed": "speed (global steps/s)",
                                         "speed_std": "std over runs"}).round(2)
        sizes = ", ".join(str(int(w)) for w in sorted(speeds["workers"].unique()))
        return Section("Speed vs workers",
                       f"Every run used the same cluster size ({sizes} workers), so there is no "
                       f"speed-vs-workers curve to draw; {SWEEP_HINT}.",
                       tables=[("Measured speed", numbers)])
    speeds["bottleneck"] = flag_saturation(speeds)
    plots.plot_speed_vs_workers(speeds, out / "speed_vs_workers.png", "Training speed vs workers",
                                flag_label="added < ½ a worker's speed")
    return Section(
        "Speed vs workers",
        "Global steps/s per cluster size (mean ± std over runs). A red ring marks a size where each "
        "added worker brought less than half the per-worker speed of the smallest cluster; on "
        "<code>provider=local</code> every role shares this machine's cores, so a ring there "
        "measures the machine, not a parameter-server bottleneck.",
        [("speed_vs_workers.png", "Speed vs workers")], [("Scaling", _speed_summary(speeds))])


def _own_accuracy_section(runs: list[Run], sw: list[syncswitch.SwitchRun],
                          out: Path) -> Section | None:
    """Accuracy during training: one line per run when there are runs to compare, else the
    single run's evaluations as numbers."""
    curves = {r.name: r.metrics.dropna(subset=["eval_accuracy"]).rename(
        columns={"wall_time_s": "time_s", "eval_accuracy": "accuracy"}) for r in runs}
    curves = {k: v for k, v in curves.items() if len(v)}
    if not curves:
        return None
    if len(curves) == 1:
        (name, curve), = curves.items()
        evals = curve[["time_s", "global_step", "accuracy"]].rename(
            columns={"time_s": "wall time since start (s)", "global_step": "global step",
                     "accuracy": "test accuracy"}).round(4)
        return Section("Accuracy", f"One run ({html.escape(name)}), so nothing to compare: its "
                       "evaluations are below. TensorBoard shows its curves "
                       "(<code>make tensorboard</code>).",
                       tables=[("Evaluations", evals)])
    protocols = {r.name: f"{r.protocol} ({r.dataset.removeprefix('own, ')})" for r in sw}
    plots.plot_accuracy_curves(curves, protocols, out / "accuracy_curves.png",
                               "Test accuracy during training, one line per run",
                               "wall time since start")
    return Section("Accuracy per protocol", "Evaluation accuracy during training.",
                   [("accuracy_curves.png", "Accuracy vs wall time")],
                   [("Per protocol", syncswitch.summarize(sw).round(4))])


def _own_sections(source: Path, out: Path) -> list[Section]:
    from analysis.runs import load_runs, load_runs_table

    table = load_runs_table(source)
    runs = load_runs(source)
    sections = []
    overview = [c for c in ("run_id", "status", "protocol", "workers", "global_steps",
                            "wall_time_s", "steps_per_sec", "final_accuracy", "cost_usd",
                            "revocations", "error") if c in table]
    sections.append(Section("Runs", f"{len(table)} run(s) read from <code>{html.escape(str(source))}</code>.",
                            tables=[("All runs", table[overview])]))
    ok = table.dropna(subset=["workers", "steps_per_sec"])
    if len(ok):
        sections.append(_own_speed_section(ok, out))
    try:
        sections.append(_cost_section(out, source))
    except ValueError as exc:  # in the user's words (cost.own_runs_table says what is missing)
        sections.append(Section("Cost and speed", f"Not available: {html.escape(str(exc))}."))
    accuracy = _own_accuracy_section(runs, syncswitch.own_runs(source), out)
    if accuracy is not None:
        sections.append(accuracy)
    return sections


# --------------------------------------------------------------------------- HTML
_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 7px}
th{background:#f0f0f0}figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}
figcaption{font-size:13px;color:#555}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}"""


def render_html(title: str, subtitle: str, sections: list[Section]) -> str:
    """One self-contained page (images referenced by relative file name)."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1><p>{subtitle}</p>"]
    parts.append("<ul>" + "".join(f"<li><a href='#s{i}'>{html.escape(s.title)}</a></li>"
                                  for i, s in enumerate(sections)) + "</ul>")
    for i, s in enumerate(sections):
        parts.append(f"<h2 id='s{i}'>{html.escape(s.title)}</h2><p>{s.intro}</p>")
        for img, caption in s.figures:
            parts.append(f"<figure><img src='{html.escape(img)}' alt='{html.escape(caption)}'>"
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        for caption, frame in s.tables:
            parts.append(f"<h3>{html.escape(caption)}</h3>")
            parts.append(frame.to_html(index=False, na_rep="—", border=0) if len(frame) else "<p>none</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _progress(steps: list[tuple[str, Callable[[], object]]]) -> list[object]:
    """Run report steps, with a rich status line on a terminal and silently otherwise."""
    if not sys.stderr.isatty():
        return [fn() for _, fn in steps]
    from rich.console import Console

    results = []
    with Console(stderr=True).status("building report") as status:
        for label, fn in steps:
            status.update(label)
            results.append(fn())
    return results


def build_report(source: str | Path, out: str | Path) -> Path:
    """Write ``out/index.html`` and its PNGs; returns the HTML path. Raises FileNotFoundError for
    a SOURCE that is neither ``reference`` nor a folder holding runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if str(source) == "reference":
        def speed() -> Section:
            speeds, table, note = _reference_speeds()
            plots.plot_speed_vs_workers(speeds, out / "speed_vs_workers.png",
                                        "CM-DARE: asynchronous training speed vs workers")
            tables = [("Scaling per setting" + note, _speed_summary(speeds))]
            if table is not None:
                tables.append(("PS bottleneck detector (analysis.scaling)", table))
            return Section("Speed vs workers", "Cluster speed as workers are added with one or two "
                           "parameter servers (PS). K80 scales linearly to 8 workers; P100 with one "
                           "PS saturates near 45 steps/s from 5 workers (red rings), two PS reach ~80.",
                           [("speed_vs_workers.png", "Speed vs workers per GPU and PS count")], tables)

        sections = _progress([("speed vs workers", speed), ("lifetimes", lambda: _lifetime_section(out)),
                              ("cost", lambda: _cost_section(out, "reference")),
                              ("sync-switch", lambda: _syncswitch_reference_section(out))])
        title, sub = "Transient-GPU training: the papers' data reproduced", (
            "Data: ICAC'19, ICDCS'20 (CM-DARE) and ICDCS'21 (Sync-Switch), Cake Lab, WPI, Apache-2.0; "
            "see analysis/reference_data/README.md.")
    else:
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"report source {source} does not exist (or use 'reference')")
        sections = _own_sections(source, out)
        title, sub = "Transient-GPU training: our runs", html.escape(str(source))
    sub += f" Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by <code>python -m analysis report</code>."
    path = out / "index.html"
    path.write_text(render_html(title, sub, sections))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis report SOURCE --out DIR``."""
    parser = command_parser("report", description="Write an HTML report with plots and tables.")
    parser.add_argument("source", help="'reference' or a sweep/run directory of ours")
    parser.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    args = parser.parse_args(argv)
    print(f"wrote {build_report(args.source, args.out)}")
    return 0
