"""What the planner shows: the ranked table with its header and notes (the marks, what each
figure rests on: Wilson bounds, measured accuracy, examples trained, borrowed lifetimes), the
time-vs-cost plot, the table as CSV, and the top answer as one dry-run command.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from orchestrator.config.schema import ExperimentConfig, schedule_phases
from orchestrator.simulate.band import draws, share_text
from orchestrator.simulate.models import SimModels
from orchestrator.simulate.planner_candidates import configure
from provisioning.gce.billing import LIVE_SOURCE


def supported(row: dict[str, Any]) -> bool:
    """Whether anything (a measurement, a calibration, the measured GPUs' range, a public
    throughput) supports the row's step time (``SimModels.supported``)."""
    return bool(row.get("speed_supported", (True, ""))[0])


def _hours(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 3600:.2f}"


def _narrow(band: dict[str, float | None]) -> bool:
    """A time band under 2 % wide: with the speed error drawn per run, only a cap that is not
    drawn (the parameter server's capacity) holds a run's time that still."""
    return band["p10"] is not None and band["p90"] is not None and band["p90"] <= 1.02 * band["p10"]


def _spread(sigma_log: float) -> str:
    """A log-normal spread as its 1σ factor: "×/÷1.49" = between 1.49× slower and faster."""
    return f"×/÷{math.exp(sigma_log):.2f}"


#: The GPU every measured accuracy was trained on: ICAC'19's and Sync-Switch's K80 workers.
ACCURACY_MEASURED_ON = "k80"

#: Which measured lifetimes ``sim.lifetimes`` names, as the planner's notes say them.
LIFETIME_DATA = {"cmdare": "CM-DARE's 2019–20", "icac19": "ICAC'19's February 2019"}


def measured_accuracy(r: dict[str, Any]) -> float | None:
    """A row's accuracy where measured runs support it: the papers' runs of the same setup on
    the GPU they trained on (K80). None elsewhere: ASP's staleness, and so its accuracy,
    follows the GPUs' speed, and a K80 figure copied to a T4 would be a guess."""
    if r.get("final_accuracy") is None or r["gpu"] != ACCURACY_MEASURED_ON:
        return None
    return float(r["final_accuracy"])


def samples_of(cfg: ExperimentConfig, r: dict[str, Any]) -> int:
    """Examples the row's run trains at its planned global steps (the row's ``samples`` when
    it has them): a switch schedule's budget trains more with more workers, ASP's does not."""
    if "samples" in r:
        return int(r["samples"])
    from orchestrator.plan import plan_phases, samples_trained

    run_cfg = configure(cfg, r["candidate"])
    return samples_trained(run_cfg.job.batch_size, r["workers"],
                           plan_phases(run_cfg, r["workers"]))


def precision_notes(shown: list[dict[str, Any]], cfg: ExperimentConfig) -> list[str]:
    """What the table's figures rest on: bounds where every (or no) run met it, where the
    accuracy comes from or why it is missing, the work each answer trains, and lifetimes
    borrowed from other GPUs."""
    notes = []
    shares = [(r[k], r["runs"]) for r in shown for k in ("p_deadline", "p_complete") if k in r]
    if any(round(p * n) in (0, n) for p, n in shares):
        low, high = min(n for _, n in shares), max(n for _, n in shares)
        notes.append("P(deadline), completes: shares of the row's simulated runs (runs per row: "
                     f"{low if low == high else f'{low}–{high}'}); "
                     "\"≥ x%\" (\"≤ x%\"): all (none) of them, said as the 95 % Wilson "
                     "bound for that many runs, since no number of runs shows a certainty")
    sources = sorted({r["accuracy_source"] for r in shown
                      if measured_accuracy(r) is not None and r.get("accuracy_source")})
    if sources:
        notes.append(f"accuracy: the mean final test accuracy of measured runs of the same "
                     f"setup (workers, schedule, budget) on {ACCURACY_MEASURED_ON.upper()}, "
                     f"to 3 decimals: {'; '.join(sources)}")
    if any(measured_accuracy(r) is None for r in shown):
        same = sorted({f"{r['final_accuracy']:.3f} ({r['accuracy_source']})" for r in shown
                       if r.get("final_accuracy") is not None and r.get("accuracy_source")
                       and measured_accuracy(r) is None})
        also = f"; the same setup on K80: {'; '.join(same)}" if same else ""
        notes.append(f"accuracy -: no measured run supports it (the papers measured "
                     f"{ACCURACY_MEASURED_ON.upper()} workers only, ICAC'19 ASP 1–8 workers and "
                     f"Sync-Switch 8 and 16; not carried to other GPUs or setups{also})")
    counts = {samples_of(cfg, r) for r in shown}
    schedules = bool(schedule_phases(cfg.sync)) or any(
        r["candidate"].bsp_fraction is not None for r in shown)
    if len(counts) > 1 or schedules:
        b, batch = cfg.job.train_steps, cfg.job.batch_size
        notes.append(f"samples: examples trained by the planned global steps (an ASP step: one "
                     f"worker's batch of {batch}; a BSP step: all N workers'); a switch "
                     f"schedule's budget job.train_steps={b} is in BSP-equivalent steps, "
                     f"f·{b} BSP + (1−f)·{b}·N ASP = {b}·N·{batch} examples: fewer workers "
                     f"train fewer (ASP alone trains {b}·{batch} whatever N); compare equal "
                     "work before cost")
    lifetime = lifetime_note(shown, cfg)
    if lifetime:
        notes.append(lifetime)
    return notes


def lifetime_note(shown: list[dict[str, Any]], cfg: ExperimentConfig) -> str | None:
    """Whose lifetimes revoke the transient rows: the measured GPUs', and for a GPU nobody
    measured (T4, L4, A100) those borrowed, pooled (CloudLifetimes); None when no cloud
    revokes them (the experiment's own revocation model does)."""
    from orchestrator.config.transient import RevocationModel
    from provisioning.registry import provider_class

    if cfg.revocation.model != RevocationModel.none or not any(r["transient"] for r in shown):
        return None
    # the planner's candidates all run on the simulated cloud and no plan exists here: by name
    market = provider_class("sim").transient_market(cfg.pricing)
    data = SimModels.load().lifetime_models(str(cfg.sim.lifetimes))
    measured = sorted(data["gpus"])
    vms = sum(g.get("all", {}).get("vms", 0) for g in data["gpus"].values())
    borrowed = sorted({r["gpu"].upper() for r in shown
                       if r["transient"] and r["gpu"].upper() not in measured})
    said = (f"lifetimes: revocations drawn from {LIFETIME_DATA.get(str(cfg.sim.lifetimes), '')} "
            f"measured preemptible {', '.join(measured)} VMs ({vms} VMs, "
            f"sim.lifetimes={cfg.sim.lifetimes})")
    if market is not None and market.value != "preemptible":
        said += f", applied to today's {market.value.capitalize()} VMs"
    if borrowed:
        said += (f"; {', '.join(borrowed)}: nobody measured their lifetimes, borrowed from "
                 f"{', '.join(measured)} pooled")
    return said


def header(cfg: ExperimentConfig, shown: int, total: int,
           runs: list[int] | None = None) -> str:
    """What the table answers: the limits (the minimum P(deadline) included), the ranking and
    how many runs stand behind each row: the shown rows' own counts (``runs``; a candidate
    ruled out early rests on fewer, but is not shown), else what the settings allow."""
    p = cfg.planner
    limits = []
    if p.deadline_h is not None:
        limits.append(f"deadline {p.deadline_h:g} h with P ≥ {p.min_p_deadline:.0%}")
    if p.budget_usd is not None:
        limits.append(f"budget ${p.budget_usd:g} (mean cost)")
    if runs:
        low, high = min(runs), max(runs)
        said = f"{low:,}" if low == high else f"{low:,}–{high:,}"
        behind = f"{said} simulated runs per row"
    else:
        behind = (f"{p.repeats}–{p.max_repeats} simulated runs each" if p.max_repeats > p.repeats
                  else f"{p.repeats} simulated runs each")
    return (f"Plan: {cfg.name}, {shown} of {total} configurations meet "
            f"{', '.join(limits) or 'no limit'}; ranked by {p.objective} ({behind}, "
            f"{draws(cfg)}; prices {cfg.pricing.name} {cfg.pricing.date or 'undated'}"
            f"{' from ' + cfg.pricing.source if cfg.pricing.source == LIVE_SOURCE else ''})")


def print_table(ranked: list[dict[str, Any]], cfg: ExperimentConfig, total: int,
                console: Any = None) -> None:
    """The ranked table (``planner.top`` rows) and its notes: the marks and what bands cover."""
    from rich.table import Table

    from orchestrator.display import make_console

    p = cfg.planner
    console = console or make_console()
    table = Table(title=header(cfg, len(ranked), total, [r["runs"] for r in ranked]),
                  title_justify="left")
    for col in ("#", "cluster", "zone", "sync", "on revocation", "P(deadline)", "completes",
                "time h (p10–p90)", "cost $ (mean)", "cost $ (p10–p90)", "revocations",
                "samples", "accuracy"):
        table.add_column(col, justify="left" if col in ("cluster", "zone", "sync",
                                                        "on revocation") else "right")
    shown = ranked[:p.top]
    for i, r in enumerate(shown, 1):
        c = r["candidate"]
        w, cost = r["time_to_result_s"], r["cost_usd"]
        if not supported(r):  # no figure nothing supports: the row, its reason in the notes
            table.add_row(str(i), c.label + " ‡", c.zone, c.sync_label, r["recovery"],
                          *["‡"] * 2, *["—"] * 4, f"{samples_of(cfg, r) / 1e6:.3g}M", "-")
            continue
        table.add_row(str(i), c.label + (" †" if r["extrapolated"] else ""), c.zone,
                      c.sync_label, r["recovery"] + (" *" if r["recovery_changed"] else ""),
                      "-" if "p_deadline" not in r else share_text(r["p_deadline"], r["runs"]),
                      share_text(r["p_complete"], r["runs"]),
                      f"{_hours(w['p10'])}–{_hours(w['p90'])}",
                      f"{r['mean_cost_usd']:.2f}", f"{cost['p10']:.2f}–{cost['p90']:.2f}",
                      f"{r['mean_revocations']:.2f}", f"{samples_of(cfg, r) / 1e6:.3g}M",
                      "-" if measured_accuracy(r) is None else f"{measured_accuracy(r):.3f}")
    if not console.is_terminal:  # a file or a pipe: whole rows, no zone cut to "europe-west4…"
        from rich.measure import Measurement

        need = Measurement.get(console, console.options.update(width=1000), table).maximum
        console.width = max(console.width, need)
    console.print(table)
    notes = ["time: to the result over every run (\"never\": the share that fails, see "
             "completes); cost: what a run costs, completed or failed"]
    unsupported = sorted({(r["gpu"], r["speed_supported"][1]) for r in shown
                          if not supported(r)})
    for gpu, why in unsupported:
        notes.append(f"‡ {gpu}: no figure shown: {why}; ranked after every supported row. A "
                     f"measured step time replaces the estimate: python -m "
                     f"orchestrator.simulate.calibrate +experiment={cfg.name} --gpu {gpu} "
                     "--step-s SECONDS")
    extrapolated = sorted({(r["gpu"], r["speed_sigma_log"]) for r in shown
                           if r["extrapolated"] and supported(r)})
    if extrapolated:
        spread = ", ".join(f"{g} {_spread(s)}" for g, s in extrapolated)
        notes.append(f"† step time scaled by TFLOPS and memory bandwidth to a GPU no paper "
                     f"measured (its held-out error, 1σ: {spread}); a calibration on that GPU "
                     f"replaces it: python -m orchestrator.simulate.calibrate "
                     f"+experiment={cfg.name} [--gpu G --step-s S]")
    narrow = [r for r in shown if _narrow(r["time_to_result_s"])]
    if narrow:
        n = narrow[0]["candidate"].parameter_servers
        cap = SimModels.load().ps_capacity(cfg.job.hparam_set, n)
        serve = "one parameter server serves" if n == 1 else f"{n} parameter servers serve"
        notes.append(f"time bands of almost no width ({narrow[0]['candidate'].label}): the "
                     f"cluster outruns what {serve} ({cap:.0f} steps/s for this job, "
                     "CM-DARE's measured saturation); "
                     "no error is drawn for that limit, so the band is only as sure as it is")
    if any(r["recovery_changed"] for r in shown):
        notes.append(f"* planned with replace: on_revocation="
                     f"{cfg.cluster.recovery.on_revocation} would end a lone transient "
                     "worker's run at its first revocation")
    notes += precision_notes(shown, cfg)
    for note in notes:
        console.print(note, highlight=False)


def pareto_plot(rows: list[dict[str, Any]], cfg: ExperimentConfig, path: Path) -> Path:
    """Median time vs median cost, p10–p90 error bars, Pareto-optimal candidates labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from analysis.cost import pareto_mask

    rows = [r for r in rows if r["time_to_result_s"]["p50"] is not None]  # most runs fail
    never = 2 * max([r["time_to_result_s"]["p90"] or 0.0 for r in rows] + [1.0])  # bar end
    t = [r["time_to_result_s"]["p50"] / 3600 for r in rows]
    c = [r["cost_usd"]["p50"] for r in rows]
    best = pareto_mask(t, c)
    fig, ax = plt.subplots(figsize=(9, 6))
    for r, ti, ci, on in zip(rows, t, c, best, strict=True):
        w, cost = r["time_to_result_s"], r["cost_usd"]
        color = "tab:orange" if r["transient"] else "tab:blue"
        p90 = (w["p90"] if w["p90"] is not None else never) / 3600
        ax.errorbar(ti, ci, xerr=[[max(0.0, ti - w["p10"] / 3600)], [max(0.0, p90 - ti)]],
                    yerr=[[max(0.0, ci - cost["p10"])], [max(0.0, cost["p90"] - ci)]],
                    fmt="o", color=color, mfc="white" if r["extrapolated"] else color,
                    alpha=0.9 if on else 0.25, ms=6 if on else 3, capsize=2, lw=0.8)
        if on:
            mark = " †" if r["extrapolated"] else ""
            ax.annotate(f"{r['candidate'].label}{mark}\n{r['candidate'].zone}", (ti, ci),
                        fontsize=7, xytext=(4, 4), textcoords="offset points")
    if cfg.planner.deadline_h is not None:
        ax.axvline(cfg.planner.deadline_h, color="red", ls="--", lw=1, label="deadline")
    if cfg.planner.budget_usd is not None:
        ax.axhline(cfg.planner.budget_usd, color="purple", ls=":", lw=1, label="budget")
    ax.plot([], [], "o", color="tab:orange", label="transient")
    ax.plot([], [], "o", color="tab:blue", label="on-demand")
    if any(r["extrapolated"] for r in rows):
        ax.plot([], [], "o", color="grey", mfc="white",
                label="† step time extrapolated (GPU not in the speed model's fit)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("time to result, hours (median; bars: 10th–90th percentile of every run, "
                  "a failed run never finishing)")
    ax.set_ylabel("cost, USD (median; bars: 10th–90th percentile)")
    least = min((r["runs"] for r in rows), default=cfg.planner.repeats)  # a ruled-out one: fewer
    ax.set_title(f"{cfg.name}: simulated time vs cost (≥ {least} runs per cluster, "
                 f"prices {cfg.pricing.name}); labelled: Pareto-optimal", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """The ranked table; time bands over every run (empty = never), ``wall_*`` over the
    completed runs only (``band_share`` of them); ``samples`` (set by plan_experiment) as in
    the table; ``final_accuracy`` only where measured (:func:`measured_accuracy`), with its
    ``accuracy_source``."""
    cols = ["gpu", "workers", "parameter_servers", "transient", "zone", "sync", "recovery",
            "hourly_usd", "runs", "p_complete", "p_deadline", "mean_wall_time_s",
            "mean_cost_usd", "mean_revocations", "samples", "final_accuracy", "accuracy_source",
            "speed_basis", "speed_sigma_log", "extrapolated", "band_share"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*cols, "time_p10", "time_p50", "time_p90", "wall_completed_p10",
                         "wall_completed_p90", "cost_p10", "cost_p90"])
        for r in rows:
            t = r["time_to_result_s"]
            measured = measured_accuracy(r)
            shown = {**r, "parameter_servers": r["candidate"].parameter_servers,
                     "final_accuracy": "" if measured is None else measured,
                     "accuracy_source": "" if measured is None else r.get("accuracy_source")}
            writer.writerow([shown.get(k, "") for k in cols] + [
                "" if t[k] is None else t[k] for k in ("p10", "p50", "p90")] + [
                r["wall_time_s"]["p10"], r["wall_time_s"]["p90"], r["cost_usd"]["p10"],
                r["cost_usd"]["p90"]])


def answer_overrides(cfg: ExperimentConfig, r: dict[str, Any]) -> list[str]:
    """The Hydra overrides that make the experiment row ``r``'s cluster, as :func:`configure`
    plans it: GPU, workers, zone, machine type, transient, parameter servers, the recovery
    the row was planned with, and its schedule where the row sets one."""
    run_cfg = configure(cfg, r["candidate"])
    cluster, group = run_cfg.cluster, run_cfg.cluster.worker_groups[0]
    transient = str(group.transient).lower()
    if len(cfg.cluster.worker_groups) == 1:
        out = [f"cluster.workers={group.count}", f"cluster.worker_groups.0.gpu={group.gpu}",
               f"cluster.worker_groups.0.zone={group.zone}",
               f"cluster.worker_groups.0.machine_type={group.machine_type}",
               f"cluster.worker_groups.0.transient={transient}"]
    else:  # one group replaces the experiment's several
        out = [f"cluster.workers={group.count}",
               f"cluster.worker_groups=[{{count:{group.count},gpu:{group.gpu},zone:{group.zone},"
               f"machine_type:{group.machine_type},transient:{transient}}}]"]
    out += [f"cluster.ps_zone={cluster.ps_zone}",
            f"cluster.parameter_servers={cluster.parameter_servers}"]
    if cluster.recovery.on_revocation != cfg.cluster.recovery.on_revocation:
        out.append(f"cluster.recovery.on_revocation={cluster.recovery.on_revocation}")
    if r["candidate"].bsp_fraction is not None:
        phases = ",".join(f"{{protocol:{ph.protocol.value},fraction:{ph.fraction:g}}}"
                          for ph in run_cfg.sync.phases)
        out += [f"sync.phases=[{phases}]", "sync.switch_order=", "sync.fractions=[]",
                "sync.phase_hparams=[]"]
    return out


def dry_run_command(overrides: list[str], cfg: ExperimentConfig, r: dict[str, Any]) -> str:
    """The one command that dry-runs row ``r``: the question's own overrides but the
    planner's and those the row sets (a schedule of its own replaces the question's ``sync``),
    then the row's (:func:`answer_overrides`)."""
    import shlex

    from orchestrator.version import prog_name

    answer = answer_overrides(cfg, r)
    keys = {o.split("=", 1)[0] for o in answer} | {
        "planner", "dry_run", "cluster.worker_groups.0.count"}
    if r["candidate"].bsp_fraction is not None:
        keys.add("sync")

    def own(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+~")
        return not any(key == k or key.startswith(k + ".") for k in keys)

    return " ".join([prog_name("orchestrator"), *map(shlex.quote, [
        *(o for o in overrides if own(o)), *answer, "dry_run=true"])])
