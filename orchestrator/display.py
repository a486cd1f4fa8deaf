"""Rich rendering of a RunPlan: the dry run's output and the header of a real run."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from orchestrator.plan import RunPlan
from provisioning.base import ProviderConfig
from provisioning.registry import make_config, provider_class

#: Off a terminal rich would wrap at 80 columns; tables get this much room there instead.
PIPE_WIDTH = 120


def make_console(stderr: bool = False) -> Console:
    """A rich console for our messages. Off a terminal (CI logs, a file, a pipe) a one-line
    message must stay one line, so that it can be grepped and read whole: text is never
    hard-wrapped there (soft wrap), and tables get PIPE_WIDTH columns (rich's default for a
    pipe is 80, which wrapped a one-line error onto 2-4 lines)."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.soft_wrap = True
        console.width = max(console.width, PIPE_WIDTH)
    return console


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a (the speed model has no figure for this model and worker)"
    h, rem = divmod(round(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def provider_note(plan: RunPlan) -> str | None:
    """One line on what the provider does not do as the plan says (GPU types, zones, machine
    types) and, for a provider that bills nothing, what the prices then mean; None when the
    plan is provisioned and billed as written."""
    # plan_note is the backend's code, not a trait the plan can carry: asked by name
    backend = provider_class(plan.provider)
    parts = [note for note in (backend.plan_note(plan.host_specs()),) if note]
    if not plan.backend.billed:
        parts.append(f"prices (catalog {plan.catalog}) are what this cluster would cost in "
                     "the cloud, nothing is billed")
    return f"{plan.provider}: " + "; ".join(parts) if parts else None


_notes_said: set[str] = set()


def say_provider_note(plan: RunPlan, console: Console, once: bool = False) -> None:
    """Print `provider_note` if there is one; with `once`, not again in this process (the
    points of a sweep share it)."""
    note = provider_note(plan)
    if note and not (once and note in _notes_said):
        _notes_said.add(note)
        console.print(f"[cyan]note:[/cyan] {note}", highlight=False)


def approx_usd(usd: float | None, digits: int = 2, unit: str = "$") -> str:
    """An estimated amount to ``digits`` significant figures with "~": a plan's cost rests on
    the speed model (off by up to a factor of ~2, 1σ) and its rates on a shipped catalogue's
    prices, not today's in each region, so "$0.5001" would claim what nobody knows."""
    if usd is None:
        return "n/a"
    if usd == 0:
        return f"{unit}0"
    places = digits - 1 - math.floor(math.log10(abs(usd)))
    rounded = round(usd, places)
    places = digits - 1 - math.floor(math.log10(abs(rounded)))  # 0.996 → 1.0: one place fewer
    return f"~{unit}{rounded:,.{max(0, places)}f}"


def cost_text(cost_usd: float, plan: RunPlan) -> str:
    """A run's cost as the closing line says it: what was billed, or what it would have cost."""
    if plan.backend.billed:
        return f"${cost_usd:.4f} (catalog {plan.catalog})"
    return (f"${cost_usd:.4f} if run in the cloud (catalog {plan.catalog}; {plan.provider}: "
            "nothing billed)")


def render_plan(plan: RunPlan, console: Console | None = None, title: str | None = None,
                data: str | None = None, provider_config: ProviderConfig | None = None) -> None:
    """Print the plan: hosts with placement and price, what the backend would create (with
    `provider_config`, the run's provider section; None: the backend's defaults), phases,
    estimates, the data, risks."""
    console = console or make_console()
    hosts = Table(title=title or f"Plan: {plan.experiment} (provider {plan.provider}, "
                  f"prices {plan.catalog})", title_justify="left")
    for col, justify in (("host", "left"), ("role", "left"), ("GPU", "left"), ("zone", "left"),
                         ("machine", "left"), ("transient", "center"), ("$/h", "right")):
        hosts.add_column(col, justify=justify)  # type: ignore[arg-type]
    for h in plan.hosts:
        machine = f"on {h.colocate_with}" if h.colocate_with else h.machine_type
        hosts.add_row(h.name, h.role, h.gpu or "cpu", h.zone or "-", machine,
                      "yes" if h.transient else "no", approx_usd(h.hourly_usd, unit=""))
    hosts.add_section()
    hosts.add_row("total", f"{plan.workers} workers, {plan.parameter_servers} PS", "", "", "", "",
                  approx_usd(plan.hourly_usd, unit=""))
    console.print(hosts)

    render_preview(plan, console, provider_config)

    phases = Table(title="Phases (global-step targets)", title_justify="left")
    for col in ("#", "protocol", "start step", "end step", "BSP-equiv. steps", "hparams"):
        phases.add_column(col)
    for i, p in enumerate(plan.phases):
        hp = ", ".join(f"{k}={v:g}" for k, v in p.hparams.items()) or "-"
        phases.add_row(str(i), p.protocol, str(p.start_step), str(p.end_step),
                       f"{p.bsp_equivalent_steps:g}", hp)
    console.print(phases)

    render_estimate(plan, console)
    if data:
        console.print(f"data: {data}", highlight=False)
    say_provider_note(plan, console)
    if plan.revocation_model != "none":
        revs = plan.planned_revocations
        timed = sorted(r["at_s"] for r in revs if r.get("at_s") is not None)
        first = f", first at {timed[0]:.0f} s" if timed else ""
        within = "" if plan.est_train_time_s is None else " within the estimated run"
        console.print(f"revocations: model {plan.revocation_model}, {len(revs)} planned"
                      f"{within}{first} (seeded; transient hosts only unless configured)")
    for risk in plan.risks:
        console.print(f"[yellow]risk:[/yellow] {risk}")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def render_estimate(plan: RunPlan, console: Console) -> None:
    """The plan's one estimate: the speed model's point figures (those the band used when there
    is one, e.g. calibrated on this machine), then the simulated band around them."""
    from orchestrator.simulate.band import share_text

    b = plan.prediction  # simulated band (orchestrator/simulate/band.py)
    est = (b or {}).get("estimate") or {
        "steps_per_sec": plan.est_steps_per_sec, "train_time_s": plan.est_train_time_s,
        "cost_usd": plan.est_cost_usd, "speed_error": plan.speed_error,
        "extrapolated": plan.extrapolated_gpus}
    speed = f"{est['steps_per_sec']:.2f} steps/s" if est["steps_per_sec"] else "n/a"
    cost = approx_usd(est["cost_usd"])
    mark = ""
    if est["extrapolated"]:
        spread = ", ".join(f"{g} ×/÷{math.exp(est['speed_error'][g]['sigma_log']):.2f}"
                           for g in est["extrapolated"])
        mark = (f"   [yellow]† extrapolated[/yellow] (GPU not in the speed model's fit, "
                f"1σ {spread})")
    console.print(f"cost: [bold]{approx_usd(plan.hourly_usd)}/h[/bold]   est. speed: {speed}   "
                  f"est. train time: {_duration(est['train_time_s'])}   est. cost: {cost}{mark}")
    if b and "unavailable" in b:
        console.print(f"simulated: n/a ({b['unavailable']})")
    elif b:
        basis = (" calibrated on this machine" if "calibration" in b
                 else " of the GPU cluster in the cloud" if b.get("stand_in") else "")
        t = b["time_to_result_s"]
        drawn = b.get("draws", "revocations and the speed model's error drawn per run")
        console.print(f"simulated{basis} (p10–p90 of {b['runs']} runs, {drawn}): "
                      f"time {_duration(t['p10'])} – "
                      f"{_duration(t['p90']) if t['p90'] is not None else 'never'}   "
                      f"cost {approx_usd(b['cost_usd']['p10'])} – "
                      f"{approx_usd(b['cost_usd']['p90'])}   "
                      f"revocations {b['revocations']['p10']:g} – {b['revocations']['p90']:g}"
                      f"   P(completes) {share_text(b['p_complete'], b['runs'])}")


def render_preview(plan: RunPlan, console: Console,
                   provider_config: ProviderConfig | None = None) -> None:
    """What the plan's backend would create (`Provider.preview`; gce: its VMs per zone) and
    its notes (gce: the pre-create checks). `provider_config` None: the backend's defaults,
    fitted to the plan."""
    if provider_config is None:
        provider_config = make_config(plan.provider, {}).for_plan(plan.est_train_time_s)
    # the backend's code, run on the provider config (not a trait the plan can carry)
    preview = provider_class(plan.provider).preview(plan.host_specs(), provider_config)
    if preview is None:
        return
    table = Table(title=preview.title, title_justify="left")
    for col in preview.columns:
        table.add_column(col)
    for row in preview.rows:
        table.add_row(*row)
    console.print(table)
    for note in preview.notes:
        console.print(f"  {note}", highlight=False, markup=False)
