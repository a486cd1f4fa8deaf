"""Entry point: ``python -m orchestrator [+experiment=NAME] [overrides] [-m sweeps]``, or the
console script ``transient-orchestrator``.

Thin on purpose: compose (Hydra) → validate → plan → predict → dry run, or play the plan: for
real (:func:`orchestrator.runtime.run.execute_run`) or in the model
(:func:`orchestrator.simulate.run.execute_sim`), as the backend's class declares (``simulated``). A config error prints one
line, ``config error: <field>: <problem> (<allowed>)``, and exits 2 with no traceback. A failed
run exits 1; Ctrl-C / SIGTERM clean up and exit 130. Experiments and config groups come from
the user's repository first (:mod:`orchestrator.user_repo`), then from the packaged config
(``pkg://orchestrator.conf``); results go under the folder the command runs from.

``python -m orchestrator --resume DIR [--retry-failed] [dry_run=true]`` finishes a run or sweep
whose orchestrator died (:mod:`orchestrator.resume`). ``--resume`` is our flag, spelled as one
because it is not a config value: it is taken off the command line before Hydra parses it, and
the recorded overrides are replayed instead.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
from orchestrator.config.schema import register_configs
from orchestrator.paths import CONF_SEARCH_PATH
from trainer.layout import EXIT_INTERRUPTED


def run_one(cfg: DictConfig) -> dict[str, Any] | None:
    """The Hydra task: one run (or one sweep point). Returns its summary, None for a dry run.

    A ConfigError exits here (SystemExit passes through Hydra's job wrapper, which would
    otherwise log a multi-line "Error executing job" report).
    """
    try:
        return _run_one(cfg)
    except ConfigError as err:
        print(err.line(), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)


def _run_one(cfg: DictConfig) -> dict[str, Any] | None:
    from hydra.core.hydra_config import HydraConfig

    from orchestrator import killpoints, resume, sweep
    from orchestrator.config.hydra_errors import check_group_change, check_label_overrides
    from orchestrator.display import cost_text, make_console, render_plan, say_provider_note
    from orchestrator.plan.load import load_and_plan
    from orchestrator.rundir import index, results
    from orchestrator.runtime import data
    from orchestrator.runtime.run import before_provisioning, execute_run
    from orchestrator.simulate.band import predict_band

    killpoints.hit("point_start")
    hc = HydraConfig.get()
    # as typed: `description=${x}` is an override's text, not an interpolation of this list
    overrides = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]
    check_label_overrides(overrides, dict(hc.runtime.choices))
    check_group_change(overrides, cfg.sync)
    run_dir = Path(hc.runtime.output_dir)
    resumption = None
    if resume.active():  # python -m orchestrator --resume DIR (orchestrator/resume.py)
        kept = resume.kept_summary(run_dir)
        if kept is not None:
            make_console().print(f"kept: {kept['status']} {kept['run_id']}; {run_dir}",
                                 highlight=False)
            if kept["status"] != results.STATUS_COMPLETED:
                sweep.failed_runs.append(str(run_dir))
            return kept
        resumption = resume.prepare_point(run_dir)
        if resumption is not None:  # it goes on with the config it started with
            cfg = OmegaConf.create(resume.recorded_config(run_dir))
    exp, plan = load_and_plan(cfg)
    plan.prediction = predict_band(exp, plan)  # None when no fitted model covers this setup
    multirun = hc.mode is not None and hc.mode.name == "MULTIRUN"
    title = exp.name
    if multirun:
        total = sweep.sweep_size or "?"
        title = f"run {hc.job.num + 1}/{total} {exp.name} " + " ".join(overrides)
    if exp.dry_run:
        render_plan(plan, make_console(), title=f"Plan: {title} (dry run: nothing provisioned)",
                    data=data.describe(exp), provider_config=exp.provider)
        return None
    before_provisioning(exp, plan)
    say_provider_note(plan, make_console(), once=True)
    if resumption is None and not resume.active():
        index.mark_killed_siblings(run_dir)  # earlier runs here whose orchestrator was killed
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    csv_dir = Path(hc.sweep.dir) if multirun else run_dir
    try:
        play = player(plan)  # a simulated run is played again, not resumed
        resumed = {"resumption": resumption} if resumption and play is execute_run else {}
        summary = play(exp, plan, run_dir, resolved, title,
                       sweep_id=sweep.sweep_id(hc.sweep.dir) if multirun else None, **resumed)
    except KeyboardInterrupt as ex:  # released and recorded: its row says so too
        summary = results.read_summary(run_dir)
        if summary is not None and not isinstance(ex, resume.Preempted):  # row when resumed
            index.append_run_row(csv_dir / index.RUNS_CSV, overrides, run_dir, summary)
        raise
    index.append_run_row(csv_dir / index.RUNS_CSV, overrides, run_dir, summary)
    _report(summary, run_dir, cost_text(summary["cost_usd"], plan))
    if summary["status"] != results.STATUS_COMPLETED:
        sweep.failed_runs.append(str(run_dir))
    return summary


def player(plan: Any) -> Callable[..., dict[str, Any]]:
    """Who plays the plan: the simulation for a backend that declares itself ``simulated``
    (``provider=sim``), the real run for every other. Both take ``(cfg, plan, run_dir,
    resolved_config, title, sweep_id=)``, write the same run directory and return its summary."""
    if plan.backend.simulated:
        from orchestrator.simulate.run import execute_sim

        return execute_sim
    from orchestrator.runtime.run import execute_run

    return execute_run


def _report(summary: dict[str, Any], run_dir: Path, cost: str) -> None:
    from rich.markup import escape  # an error may quote `pip install 'x[cpu]'`

    from orchestrator.display import make_console
    from orchestrator.transient.silence import closing_note

    acc = summary["final_accuracy"]
    acc_text = "n/a" if acc is None else f"{acc:.4f}"
    sps = summary["steps_per_sec"]
    make_console().print(
        f"[bold]{summary['status']}[/bold] {summary['run_id']}: {summary['global_steps']} steps"
        f" in {summary['wall_time_s']:.1f} s ({sps or 0:.1f} steps/s), accuracy {acc_text}, "
        f"{cost}; results in {run_dir}" + closing_note(run_dir) + _leftovers_note(run_dir)
        + (f"\n[red]error:[/red] {escape(summary['error'])}" if summary["error"] else ""),
        highlight=False,
    )


def _leftovers_note(run_dir: Path) -> str:
    """What the run could not confirm stopped (its journal's unreleased entries: a machine
    lost during the run and unreachable at its end), and the command that stops it; "" when
    everything was. Such roles also end by themselves once their lease lapses
    (orchestrator/runtime/deploy.py)."""
    from provisioning.journal import JOURNAL_FILE, list_unreleased

    left = list_unreleased(run_dir / JOURNAL_FILE)
    if not left:
        return ""
    hosts = sorted({e.address or e.host_id for e in left})
    return (f"; {len(left)} resource(s) on {', '.join(hosts)} not confirmed stopped: "
            f"run python -m orchestrator.release {run_dir}")


# Hydra's argparse stops at the first override, so `+experiment=X -m a=1,2` would fail; these
# value-less flags are moved before the overrides (the documented form puts them anywhere).
_MOVABLE_FLAGS = ("-m", "--multirun", "-r", "--run", "--resolve")


#: Presets appended after everything else, the experiment included, wherever they were typed:
#: ``+debug=default`` shortens the experiment's run, so it must be merged after it.
_LAST_PRESETS = ("+debug=",)


def normalise_argv(argv: list[str]) -> list[str]:
    """Move value-less Hydra flags in front of the overrides and the presets that must win
    (``+debug=...``) to their end, keeping everything else in order."""
    flags = [a for a in argv[1:] if a in _MOVABLE_FLAGS]
    rest = [a for a in argv[1:] if a not in _MOVABLE_FLAGS]
    experiment = max((i for i, a in enumerate(rest) if a.startswith("+experiment=")),
                     default=None)
    last = [a for a in rest[:experiment or 0] if a.startswith(_LAST_PRESETS)]
    if last:  # typed before the experiment: moved right after it
        rest = [a for a in rest if a not in last]
        at = rest.index(max((a for a in rest if a.startswith("+experiment=")),
                            key=rest.index)) + 1
        rest[at:at] = last
    return [argv[0], *flags, *rest]


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    """Console entry point; also ``python -m orchestrator``."""
    if "--version" in sys.argv[1:]:  # ours, before Hydra's (which prints Hydra's version)
        from orchestrator.version import version_line

        print(version_line("orchestrator"))
        return
    from orchestrator.controller import submit as detach

    if detach.requested(sys.argv):  # --detach: the same command on a controller VM
        sys.exit(detach.main(sys.argv))
    from orchestrator.config.hydra_errors import (
        blame_interpolated_field,
        check_group_overrides,
        config_error_from_hydra,
        exact_item_error,
        explain,
        open_mapping_overrides,
        path_too_long,
    )

    register_configs()
    from hydra_plugins.transient_launcher.register import register_plugins
    from orchestrator import user_repo

    register_plugins()  # the user's repository before the packaged config
    user_full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let exceptions reach us so we can format them
    signal.signal(signal.SIGTERM, _on_sigterm)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack to stderr
    from orchestrator import resume

    try:
        argv = resume.start(sys.argv)  # --resume DIR: the recorded command, after the checks
    except resume.ResumeRefused as err:
        print(err, file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    if argv is None:
        return  # a resume's dry run, printed
    sys.argv = open_mapping_overrides(normalise_argv(argv))  # provider.labels={team: ml}
    try:
        check_group_overrides([a for a in sys.argv[1:] if not a.startswith("-")])
    except ConfigError as err:
        print(err.line(), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    app = hydra.main(version_base="1.3", config_path=CONF_SEARCH_PATH,
                     config_name="config")(run_one)
    try:
        app()
    except KeyboardInterrupt:
        print("interrupted: every process was stopped and every host released", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as ex:
        overrides = [a for a in sys.argv[1:] if not a.startswith("-")]
        err = _find_config_error(ex, config_error_from_hydra) or path_too_long(ex, overrides)
        if err is None:
            from trainer.events import disk_full_fields, disk_full_line, is_disk_full

            if is_disk_full(ex) and not user_full_error:  # e.g. the run folder's disk
                folders = [os.getcwd()] + [a.split("=", 1)[1] for a in overrides
                                           if a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
                full = disk_full_fields(ex, folders)
                print(disk_full_line("the orchestrator", full.get("path"),
                                     full.get("free_bytes")), file=sys.stderr)
                sys.exit(1)
            if user_full_error:
                raise
            import traceback

            traceback.print_exc()
            sys.exit(1)
        err = blame_interpolated_field(exact_item_error(err, overrides), overrides)
        err = user_repo.explain_missing(explain(err))
        print(err.line(), file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    from orchestrator.sweep import failed_runs

    if failed_runs:
        print(f"{len(failed_runs)} run(s) did not complete: " + ", ".join(failed_runs),
              file=sys.stderr)
        sys.exit(1)


def _find_config_error(ex: BaseException, convert: Any) -> ConfigError | None:
    """Walk the cause chain: Hydra wraps our errors and OmegaConf's in its own."""
    seen: BaseException | None = ex
    while seen is not None:
        err = convert(seen)
        if err is not None:
            return err
        seen = seen.__cause__
    return None


if __name__ == "__main__":
    main()
