"""Sweep-level pieces: validate every sweep point up front, and the sweep's ``runs.csv``."""

from __future__ import annotations

import csv
import fcntl
import io
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from orchestrator import killpoints, record, results

RUNS_CSV = "runs.csv"
#: The concurrent launcher's record of when each point was queued, started and ended.
LAUNCHES_FILE = "launches.jsonl"

# Number of runs in the current multirun (set by SweepValidator; None for a single run).
sweep_size: int | None = None
# Run directories whose run did not complete (this process's); the entry point exits 1 if any.
failed_runs: list[str] = []
# The sweep directory's lock, held by the sweep's orchestrator while it lives: a resume
# (orchestrator/resume.py) refuses a sweep whose orchestrator is alive, between points too.
_sweep_lock: results.RunDirLock | None = None


def sweep_id(sweep_dir: str | Path) -> str:
    """The id that names a sweep's resources (GCE's ``sweep-id`` label): the sweep folder's
    parent and own name, ``<experiment>-<time>-<pid>`` for the default ``hydra.sweep.dir``."""
    path = Path(sweep_dir).resolve()
    return f"{path.parent.name}-{path.name}"


def point_error_exit(ex: BaseException, point: Sequence[str]) -> None:
    """Print a sweep point's config error as one line naming the field and the point, and exit
    2; re-raise ``ex`` when it is not a config error."""
    from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
    from orchestrator.config.hydra_errors import (
        config_error_from_hydra,
        exact_item_error,
        explain,
    )

    err = config_error_from_hydra(ex)
    if err is None:
        raise ex
    err = explain(exact_item_error(err, list(point)))
    print(ConfigError(err.path, err.problem, err.allowed).line()
          + f" [sweep point: {' '.join(point)}]", file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def expand_sweep(overrides: Sequence[str], config_loader: Any = None) -> list[list[str]]:
    """Every combination of a command line's sweep overrides (BasicSweeper's cross product).

    ``config_loader`` lists a group's options for ``glob()`` (Hydra's while it runs; else one
    made here, for a resume's replay and the simulated sweep). A sweep
    that cannot be expanded, or that has no point (``glob(*)`` of a setting that is not a
    group, ``range(3,1)``), raises :class:`ConfigError` naming its key: the sweep would
    otherwise fail with a traceback, or launch nothing and exit 0.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra

    from orchestrator.config.errors import ConfigError

    if config_loader is None and GlobalHydra.instance().is_initialized():
        config_loader = GlobalHydra.instance().config_loader()
    if config_loader is None and any("glob(" in o for o in overrides):
        from hydra import initialize_config_module

        from hydra_plugins.transient_launcher import user_repo
        from orchestrator.config.schema import register_configs
        from orchestrator.paths import CONF_PACKAGE

        register_configs()
        user_repo.register()  # the user's groups are globbed too (not the launcher: a circle)
        with initialize_config_module(version_base="1.3", config_module=CONF_PACKAGE):
            return expand_sweep(overrides, GlobalHydra.instance().config_loader())
    parser = OverridesParser.create(config_loader=config_loader)
    parsed = []
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        value = text.split("=", 1)[1] if "=" in text else ""
        try:
            override = parser.parse_overrides([text])[0]
            values = list(override.sweep_string_iterator()) \
                if override.is_sweep_override() and override.is_discrete_sweep() else None
        except ValueError as ex:  # range(1,3,0): Hydra's own argument check
            raise ConfigError(key, f"'{value}' is not a sweep: {ex}",
                              "e.g. range(1,9,2), or list the values: 1,3,5,7") from None
        except HydraException as ex:
            if "ConfigLoader is not set" not in str(ex):
                raise
            raise ConfigError(key, f"'{value}' needs the config groups' options",
                              "list the options: a,b,c") from None
        if override.is_sweep_override() and values is None:
            raise ConfigError(key, f"'{value}' is a continuous interval, which only an "
                              "optimizing sweeper samples; this one runs listed points",
                              "list the values (1,2,4) or use range(start,stop,step)")
        if values == []:
            hint = ("glob() chooses among a config group's options, as in sync=glob(*); "
                    "list this setting's values: a,b,c") if "glob(" in value \
                else "list the values: a,b,c"
            raise ConfigError(key, f"'{value}' gives no value: the sweep has no points", hint)
        parsed.append(override)
    batches = BasicSweeper.split_arguments(parsed, None)
    return [list(combo) for combo in batches[0]]


class SweepValidator(Callback):
    """Hydra callback: compose and validate every sweep point before the first run starts.

    Without it a bad value in the third point of a sweep would surface only after two runs had
    provisioned servers and trained. Exits 2 with the one-line error naming the field: Hydra
    turns a callback's exceptions into warnings, so SystemExit is the only way to stop here.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # as typed: `name=${x}` is an override's text, not an interpolation of this list
        task = [str(o) for o in OmegaConf.to_container(
            OmegaConf.select(config, "hydra.overrides.task") or OmegaConf.create([]),
            resolve=False)]
        try:
            self._validate(config, task)
        except SystemExit:
            raise
        except Exception as ex:  # anything else would be a warning, and the sweep would run
            stop_sweep(ex, task)

    def _validate(self, config: DictConfig, task: list[str]) -> None:
        from hydra import compose
        from hydra.core.global_hydra import GlobalHydra

        from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE, ConfigError
        from orchestrator.config.hydra_errors import check_group_change, check_group_overrides
        from orchestrator.config.load import to_experiment
        from orchestrator.config.validation import validate

        global sweep_size, _sweep_lock
        params = OmegaConf.select(config, "hydra.sweeper.params") or {}
        task = [f"{k}={v}" for k, v in params.items()] + task
        combos = expand_sweep(task, GlobalHydra.instance().config_loader())
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            _sweep_lock = results.RunDirLock(sweep_dir)
        except ConfigError as err:
            print(ConfigError("hydra.sweep.dir", err.problem, err.allowed).line(),
                  file=sys.stderr)
            sys.exit(CONFIG_ERROR_EXIT_CODE)
        sweep_size = len(combos)
        # compose() builds its own search path: the command line's extra config dirs with it
        search = [str(p) for p in OmegaConf.select(config, "hydra.searchpath") or []]
        extra = [f"hydra.searchpath=[{','.join(search)}]"] if search else []
        for combo in combos:  # every point, before the first runs
            try:
                check_group_overrides(combo)  # sync=glob(*) takes the schema base_sync too
                composed = compose(config_name="config", overrides=[*combo, *extra])
                check_group_change(combo, composed.sync)
                validate(to_experiment(composed))
            except Exception as ex:
                point_error_exit(ex, combo)


def stop_sweep(ex: BaseException, task: Sequence[str]) -> None:
    """A sweep that cannot be expanded or whose folder cannot be made: one line and exit 2 for
    a config error (the field named), 1 for anything else; never a traceback, never a run."""
    from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE
    from orchestrator.config.hydra_errors import (
        blame_interpolated_field,
        config_error_from_hydra,
        path_too_long,
    )

    err = config_error_from_hydra(ex) or path_too_long(ex, task)
    if err is None:
        print(f"error: the sweep could not be validated: {type(ex).__name__}: {ex}",
              file=sys.stderr)
        sys.exit(1)
    print(blame_interpolated_field(err, list(task)).line(), file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT_CODE)


def override_columns(overrides: Sequence[str]) -> dict[str, str]:
    """``key=value`` task overrides as columns (``+`` / ``~`` prefixes dropped)."""
    cols: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        cols[key.lstrip("+~")] = value
    return cols


def append_run_row(csv_path: Path, overrides: Sequence[str], run_dir: Path,
                   summary: Mapping[str, Any]) -> None:
    """Append one run's row under a file lock (parallel launchers may finish together).

    Columns: the overrides that define the run, ``run_dir``, then the summary fields. The header
    is written once; a row with new columns is still written, matched by name.
    """
    row: dict[str, Any] = {**override_columns(overrides), "run_dir": str(run_dir)}
    for key in (*results.SUMMARY_FIELDS, *results.TRANSIENT_SUMMARY_FIELDS):
        if key == "phases":
            continue  # a list: summary.json holds it
        value = summary.get(key)
        row[key] = "" if value is None else value
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "a+", newline="") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        existing = fh.read()
        header = next(csv.reader([existing.splitlines()[0]])) if existing.strip() else None
        fieldnames = header or list(row)
        extra = [k for k in row if k not in fieldnames]
        writer = csv.DictWriter(fh, fieldnames=fieldnames + extra, extrasaction="ignore")
        if header is None:
            writer.writeheader()
        killpoints.hit("runs_csv_row", torn=lambda: _torn_row(fh, writer.fieldnames, row))
        writer.writerow(row)
        fh.flush()  # before the unlock: the next writer must see this header and row
        fcntl.flock(fh, fcntl.LOCK_UN)


def _torn_row(fh: Any, fieldnames: Sequence[str], row: Mapping[str, Any]) -> None:
    """The first half of ``row`` as its line would be written (a crash inside the write)."""
    import io

    text = io.StringIO()
    csv.DictWriter(text, fieldnames=list(fieldnames), extrasaction="ignore").writerow(row)
    fh.write(text.getvalue()[: len(text.getvalue()) // 2])
    fh.flush()


def mark_killed(run_dir: Path) -> dict[str, Any] | None:
    """Record a run whose orchestrator died (``kill -9``, power loss) as ``killed``.

    Only a run directory that has a config but no summary and that no live process owns (its
    lock is free) qualifies; taking the lock keeps a concurrent caller out. Writes summary.json
    (status ``killed``, from what is on disk), a ``killed`` event, and the run's row in
    ``runs.csv`` (the sweep's, or the run's own). Returns the summary, None when not killed.
    Idempotent: once the summary exists, nothing more happens.
    """
    from orchestrator.config.errors import ConfigError

    run_dir = Path(run_dir)
    ours = (results.CONFIG_FILE, results.PLAN_FILE, results.EVENTS_FILE)
    if not all((run_dir / name).is_file() for name in ours) or \
            (run_dir / results.SUMMARY_FILE).exists():
        return None
    try:
        lock = results.RunDirLock(run_dir)
    except ConfigError:
        return None  # alive
    try:
        if (run_dir / results.SUMMARY_FILE).exists():
            return None
        summary = record.killed_summary(run_dir).to_dict()
        with open(run_dir / results.EVENTS_FILE, "a") as fh:
            fh.write(json.dumps({results.EVENT_TIME: time.time(), results.EVENT_KIND: "killed",
                                 results.EVENT_ROLE: "orchestrator",
                                 "error": summary["error"]}) + "\n")
        results.write_atomic(run_dir / results.SUMMARY_FILE,
                             json.dumps(summary, indent=2, sort_keys=True) + "\n")
        sweep_dir = run_dir.parent if (run_dir.parent / "multirun.yaml").exists() else None
        append_run_row((sweep_dir or run_dir) / RUNS_CSV, _overrides(run_dir), run_dir, summary)
        return summary
    finally:
        lock.release()


def mark_killed_runs(root: Path) -> list[Path]:
    """:func:`mark_killed` for ``root`` and every run directory below it; the ones marked."""
    root = Path(root)
    candidates = [root, *sorted(p.parent for p in root.rglob(results.PLAN_FILE))]
    return [d for d in dict.fromkeys(candidates) if mark_killed(d) is not None]


def mark_killed_siblings(run_dir: Path) -> list[Path]:
    """Before a run starts: earlier runs beside it (the same sweep, or the same experiment's
    outputs folder) whose orchestrator was killed are marked so, with their runs.csv row."""
    parent = Path(run_dir).parent
    if not parent.is_dir():
        return []
    return [d for d in sorted(parent.iterdir())
            if d.is_dir() and d != Path(run_dir) and mark_killed(d) is not None]


def _overrides(run_dir: Path) -> list[str]:
    """The run's command-line overrides, as Hydra recorded them."""
    import yaml

    try:
        data = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    return [str(o) for o in data] if isinstance(data, list) else []


# --- a resume's repair of the sweep's index (orchestrator/resume.py) ---------------------


def reconcile_runs_csv(path: Path, kept_points: Mapping[Path, Sequence[str]]) -> None:
    """A resume's repair of ``runs.csv`` (at `path`): one intact row per kept point (its run
    folder → its overrides), nothing else; a kept point without a row (the crash came between
    its summary and its row) gets it now."""
    kept = {str(d): d for d in kept_points}
    text = path.read_text() if path.exists() else ""
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header, body = (rows[0], rows[1:]) if rows else ([], [])
    out = io.StringIO()
    writer = csv.writer(out)
    have: set[str] = set()
    if header:
        writer.writerow(header)
        col = header.index("run_dir") if "run_dir" in header else None
        for row in body:
            if col is None or len(row) != len(header):
                continue  # torn
            if row[col] in kept and row[col] not in have:
                have.add(row[col])
                writer.writerow(row)
    if header and len(have) == 0:
        path.unlink()
    elif header:
        results.write_atomic(path, out.getvalue())
    for run_dir, folder in kept.items():
        summary = results.read_summary(folder)
        if run_dir not in have and summary is not None:
            append_run_row(path, _overrides(folder) or list(kept_points[folder]), folder,
                           summary)


def repair_launches(sweep_dir: Path, actions: Mapping[str, list[int]]) -> None:
    """Drop a torn last line of launches.jsonl and record the resume (`actions`: what it does
    with which point: keep, resume, start, rerun)."""
    path = sweep_dir / LAUNCHES_FILE
    if not path.exists():
        return
    lines = path.read_text().split("\n")
    good = []
    for line in lines:
        try:
            json.loads(line)
            good.append(line)
        except ValueError:
            continue
    entry = {"time": time.time(), "kind": "resume", **actions}
    results.write_atomic(path, "".join(line + "\n" for line in good) + json.dumps(entry) + "\n")
