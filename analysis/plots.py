"""Figures of the report (matplotlib, Agg backend: works headless and in CI).

Each function takes tidy data, writes one PNG and returns its path. Every figure carries a
title, axis labels with units and a legend, because the report is read without the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and CI
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

DPI = 110
PROTOCOL_COLORS = {"BSP": "tab:blue", "ASP": "tab:red"}
_PALETTE = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def time_unit(max_seconds: float) -> tuple[float, str]:
    """Divisor and name of a readable time unit: seconds for short local runs, hours for the
    papers' multi-hour runs."""
    if max_seconds < 600:
        return 1.0, "s"
    if max_seconds < 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def count_ticks(ax: plt.Axes, values: pd.Series) -> None:
    """Integer x ticks for a count (workers): every measured value when there are few of them,
    else whole numbers only, never fractions of a worker."""
    distinct = sorted({int(v) for v in values.dropna()})
    if len(distinct) <= 12:
        ax.set_xticks(distinct)
        ax.set_xlim(distinct[0] - 0.5, distinct[-1] + 0.5)
    else:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def plot_speed_vs_workers(speeds: pd.DataFrame, path: Path, title: str,
                          flag_label: str = "PS bottleneck") -> Path:
    """Write ``speed_vs_workers_figure`` to ``path``."""
    return _save(speed_vs_workers_figure(speeds, title, flag_label), path)


def speed_vs_workers_figure(speeds: pd.DataFrame, title: str,
                            flag_label: str = "PS bottleneck") -> plt.Figure:
    """Cluster speed vs workers, one panel per setting (``panel`` column), one line per
    ``series``; points flagged in ``bottleneck`` get a red ring (adding workers stopped paying),
    described in the legend by ``flag_label`` when at least one is drawn."""
    panels = list(dict.fromkeys(speeds["panel"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), sharey=True,
                             squeeze=False)
    std = speeds["speed_std"] if "speed_std" in speeds else pd.Series(0.0, index=speeds.index)
    flagged_any = False
    for ax, panel in zip(axes[0], panels, strict=True):
        sub = speeds[speeds["panel"] == panel]
        for i, (series, grp) in enumerate(sub.groupby("series", sort=True)):
            grp = grp.sort_values("workers")
            spread = std.loc[grp.index]
            ax.errorbar(grp["workers"], grp["speed"],
                        yerr=spread if spread.notna().any() else None, marker="o",
                        ms=4, capsize=2, color=_PALETTE[i % len(_PALETTE)], label=str(series))
            flagged = grp[grp["bottleneck"].fillna(False).astype(bool)]
            flagged_any |= len(flagged) > 0
            ax.scatter(flagged["workers"], flagged["speed"], s=110, facecolors="none",
                       edgecolors="red", linewidths=1.5, zorder=3)
        ax.set_title(str(panel))
        ax.set_xlabel("workers")
        count_ticks(ax, sub["workers"])
        ax.grid(alpha=0.3)
    # shared y: set the range once, from all panels, so no panel's points are clipped
    top = (speeds["speed"] + std.fillna(0)).max()
    axes[0][0].set_ylim(0, top * 1.08)
    axes[0][0].set_ylabel("cluster speed (global steps/s)")
    if flagged_any:
        axes[0][0].scatter([], [], s=110, facecolors="none", edgecolors="red", label=flag_label)
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    return fig


def plot_lifetime_curves(
    km: Mapping[str, object], fits: Mapping[str, tuple[object, object]], path: Path, title: str
) -> Path:
    """Share of VMs revoked vs hours since start: Kaplan–Meier with 95 % CI per group, with the
    Weibull (dashed) and exponential (dotted) fits in the same colour."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    hours = np.linspace(0.01, 24, 200)
    for i, (label, fitter) in enumerate(km.items()):
        color = _PALETTE[i % len(_PALETTE)]
        fitter.plot_cumulative_density(ax=ax, ci_show=True, color=color, label=f"{label} (KM)")
        expo, weib = fits[label]
        ax.plot(hours, weib.cumulative_density_at_times(hours), "--", color=color, lw=1,
                label=f"{label} Weibull (ρ={weib.rho_:.2f})")
        ax.plot(hours, expo.cumulative_density_at_times(hours), ":", color=color, lw=1,
                label=f"{label} exponential")
    ax.set_xlim(0, 24)
    ax.set_ylim(0, 0.75)
    ax.set_xticks(range(0, 25, 2))
    ax.set_xlabel("hours since VM start (GCE stops preemptible VMs at 24 h)")
    ax.set_ylabel("share of VMs revoked")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    # Below the axes: inside, it would hide the early-hour CIs where the curves differ most.
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    return _save(fig, path)


def plot_hazard(hazards: Mapping[str, pd.DataFrame], path: Path, title: str) -> Path:
    """Hourly revocation hazard (revocations per VM alive at the hour's start) per group."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / max(len(hazards), 1)
    for i, (label, table) in enumerate(hazards.items()):
        offset = (i - (len(hazards) - 1) / 2) * width  # centre each hour's group on its tick
        ax.bar(table["hour"] + offset, 100 * table["hazard_per_h"], width=width, label=label,
               color=_PALETTE[i % len(_PALETTE)])
    ax.set_xlabel("hour since VM start")
    ax.set_ylabel("hazard (% of live VMs revoked)")
    ax.set_title(title)
    ax.set_xticks(range(0, 24, 2))
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    return _save(fig, path)


def plot_cost_pareto(table: pd.DataFrame, path: Path, title: str,
                     time_label: str = "training time") -> Path:
    """Write ``cost_pareto_figure`` to ``path``."""
    return _save(cost_pareto_figure(table, title, time_label), path)


def cost_pareto_figure(table: pd.DataFrame, title: str,
                       time_label: str = "training time") -> plt.Figure:
    """Mean time vs mean cost per configuration; the Pareto frontier (no configuration is both
    faster and cheaper) is connected. Transient clusters are filled, on-demand hollow; the
    legend names only the kinds present."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    div, unit = time_unit(float(table["time_s"].max()))
    t = table["time_s"] / div
    for transient, marker, label in ((False, "s", "on-demand"), (True, "o", "transient")):
        sel = table["transient"] == transient
        if not sel.any():
            continue
        ax.scatter(t[sel], table.loc[sel, "cost_usd"], marker=marker, s=60, label=label,
                   facecolors="tab:blue" if transient else "none", edgecolors="tab:blue")
    for x, c, name, transient in zip(t, table["cost_usd"], table["config"], table["transient"],
                                     strict=True):
        # on-demand labels above, transient below: the two rows never collide
        ax.annotate(str(name), (x, c), textcoords="offset points", ha="center", fontsize=8,
                    xytext=(0, -15 if transient else 9))
    front = table[table["pareto"]].sort_values("time_s")
    ax.plot(front["time_s"] / div, front["cost_usd"], "-o", color="tab:green", lw=1.5, ms=13,
            mfc="none", label="Pareto frontier")
    lo, hi = t.min() / 1.5, t.max() * 1.5
    ticks = [m * 10.0**k for k in range(-3, 6) for m in (1, 2, 5) if lo <= m * 10.0**k <= hi]
    if len(ticks) >= 2:  # worker counts double: log scale spaces each doubling equally
        ax.set_xscale("log")
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlim(lo, hi)
        unit += ", log scale"
    else:
        ax.margins(x=0.12)  # room for the outermost points' labels
    ax.set_xlabel(f"{time_label} ({unit})")
    ax.set_ylabel("cost per training run (USD)")
    ax.set_title(title)
    ax.set_ylim(0, table["cost_usd"].max() * 1.2)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return fig


def _protocol_color(protocol: str, order: list[str]) -> str:
    if protocol in PROTOCOL_COLORS:
        return PROTOCOL_COLORS[protocol]
    return _PALETTE[(order.index(protocol) + 2) % len(_PALETTE)]


def plot_accuracy_curves(
    curves: Mapping[str, pd.DataFrame], protocols: Mapping[str, str], path: Path, title: str,
    time_label: str = "training time",
) -> Path:
    """Evaluation accuracy vs training time, one thin line per run, coloured by protocol."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    div, unit = time_unit(max(float(c["time_s"].max()) for c in curves.values()))
    order = list(dict.fromkeys(protocols[n] for n in curves))
    seen: set[str] = set()
    sparse = max(len(c) for c in curves.values()) < 30
    for name, curve in curves.items():
        protocol = protocols[name]
        ax.plot(curve["time_s"] / div, curve["accuracy"], lw=1, alpha=0.75,
                marker="o" if sparse else None, ms=3,  # sparse evaluations stay visible
                color=_protocol_color(protocol, order),
                label=protocol if protocol not in seen else None)
        seen.add(protocol)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"{time_label} ({unit})")
    ax.set_ylabel("test accuracy (top-1, fraction)")
    # from a little below the lowest curve's 20 % quantile (early, near-chance points would
    # squash the converged part that is compared) to a little above the best point
    low = min(float(c["accuracy"].quantile(0.2)) for c in curves.values())
    best = max(float(c["accuracy"].max()) for c in curves.values())
    bottom = max(0.0, low - max(0.25 * (best - low), 0.01))
    ax.set_ylim(bottom, min(1.0, best + 0.08 * (best - bottom)) + 0.002)  # best point not on the frame
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)


def _label_points(ax: plt.Axes, points: list[tuple[float, float, str]], fontsize: int = 8) -> None:
    """Annotate each (x, y, text) beside its point, choosing for each label the first side
    (right, left, above, below) where it overlaps neither another point nor a label already
    placed, so labels of nearby points stay readable."""
    ax.get_xlim(), ax.get_ylim()  # settle autoscaling before converting to screen units
    to_pt = 72.0 / ax.figure.dpi
    centres = [tuple(ax.transData.transform((x, y)) * to_pt) for x, y, _ in points]
    taken = [(cx - 4, cy - 4, cx + 4, cy + 4) for cx, cy in centres]  # the markers themselves

    def overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
        return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))

    for (x, y, text), (cx, cy) in zip(points, centres, strict=True):
        w, h = 0.6 * fontsize * len(text), fontsize
        sides = [(6, -h / 2), (-6 - w, -h / 2), (-w / 2, 6), (-w / 2, -6 - h),
                 (6, 4), (6, -4 - h), (-6 - w, 4), (-6 - w, -4 - h)]
        boxes = [(cx + dx, cy + dy, cx + dx + w, cy + dy + h) for dx, dy in sides]
        costs = [sum(overlap(box, t) for t in taken) for box in boxes]
        best = costs.index(min(costs))
        taken.append(boxes[best])
        ax.annotate(text, (x, y), textcoords="offset points", xytext=sides[best],
                    ha="left", va="bottom", fontsize=fontsize)


def plot_switch_tradeoff(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Converged accuracy vs training time per protocol / switch point (mean ± std)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labels = []
    for asp_first, marker, label in ((False, "o", "BSP first"), (True, "^", "ASP first")):
        sub = table[table["asp_first"] == asp_first]
        if sub.empty:
            continue
        ax.errorbar(sub["time_s"] / 3600, sub["accuracy"], xerr=sub["time_std_s"] / 3600,
                    yerr=sub["accuracy_std"], fmt=marker, capsize=2, label=label)
        for _, row in sub.iterrows():
            f = row["bsp_fraction"]
            short = row["protocol"] if f in (0.0, 1.0) else f"{100 * f:g}%"
            labels.append((row["time_s"] / 3600, row["accuracy"], short))
    ax.set_xlabel("training time (h, switch pauses removed); labels: share of the BSP budget")
    ax.set_ylabel("converged test accuracy (fraction)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    _label_points(ax, labels)
    return _save(fig, path)
