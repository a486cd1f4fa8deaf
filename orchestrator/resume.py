"""``python -m orchestrator --resume DIR [--retry-failed] [dry_run=true]``: finish what a dead
orchestrator started.

DIR is a sweep directory (it has ``multirun.yaml``) or a run directory (``config.yaml`` and
``.hydra/``); a sweep point's own directory resumes its sweep. ``--resume`` is a flag of ours,
not a Hydra override: a resume takes no overrides (the recorded ones are the run's definition),
and ``resume=DIR`` would read as a config key. The entry point (orchestrator/__main__.py) takes
it off the command line before Hydra sees it.

What happens, in order, with nothing created before the checks pass:

1. Refuse with one line (exit 2) when a live orchestrator owns DIR or any of its runs (the run
   lock, ``run.lock``, and the sweep's, taken by :class:`orchestrator.sweep.SweepValidator`),
   when a recorded ``config.yaml`` no longer makes a valid experiment with the current code
   (the line names the field), or when a point to resume has a checkpoint store that cannot be
   read.
2. Clean up what the dead orchestrator left, as ``python -m orchestrator.release`` does: every
   process group (and VM) its journals still list as running is stopped by its own backend.
3. Decide per point, from its directory: ``completed`` → kept (not run, its runs.csv row kept
   as it is); ``killed`` / ``interrupted`` / no summary → resumed: fresh hosts, the chief
   restores the newest checkpoint in the run's store, events, metrics and TensorBoard go on in
   the same directory after a ``resumed`` event (``from_step``, ``lost_steps``); no directory →
   started; ``failed`` → kept, unless ``--retry-failed`` (then re-run from scratch, the failed
   attempt moved to ``previous/failed-<k>/`` inside its directory).
4. Make the sweep's records consistent before anything runs: ``runs.csv`` keeps exactly the
   rows of kept points (a torn last line, a killed point's row, a duplicate are dropped; a kept
   point whose row the crash cut off gets it from its summary), ``launches.jsonl`` loses a torn
   last line and gets a ``resume`` line. Each point that runs then appends its one row.
5. Replay the recorded command (task and Hydra overrides, same sweep or run directory, same
   launcher and queue) through Hydra; the task (``run_one``) and the parallel launcher ask this
   module what to do with each point (:func:`kept_summary`, :func:`prepare_point`).

A resumed run's summary is built as every run's is, by the run directory's one fold
(orchestrator/rundir/record.py) over every attempt's events, the ``resumed`` event this module
hands the run included: it keeps its ``run_id``; ``wall_time_s`` and ``cost_usd`` add up every
attempt's time (from its events; the time the orchestrator was dead is not counted, though a
cloud VM it left bills until step 2 or ``orchestrator.gc`` deletes it); the recovery counts and
phases are every attempt's; ``lost_steps`` also adds, per resume, the steps the dead attempt's
chief had recorded past the checkpoint the resume went on from, and those of a newer checkpoint
the new chief found damaged and skipped. This module decides what to keep, resume or start,
and writes nothing of the record itself. Crash points for testing:
orchestrator/killpoints.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator import killpoints, sweep
from orchestrator.rundir import index, results
from orchestrator.rundir.record import fold_events_file, make_run_id
from provisioning import catalog

#: Set (to "1", or "retry-failed") by the entry point for this process and its sweep points.
ENV = "TRANSIENT_RESUMING"
RESUMED_EVENT = results.EVENT_RESUMED
PREVIOUS_DIR = "previous"
MULTIRUN_FILE = "multirun.yaml"
#: Held by a resume from its first check to its exit: a second resume of the same directory
#: refuses before it touches anything (run.lock is taken later, by the run or the launcher).
RESUME_LOCK_FILE = "resume.lock"
_resume_lock: results.RunDirLock | None = None

KEEP, RESUME, START, RERUN = "keep", "resume", "start", "rerun"


#: What the parallel launcher sends a sweep point its queue preempts (``las``, ``gittins``).
PREEMPT_SIGNAL = signal.SIGUSR2


class Preempted(KeyboardInterrupt):
    """Raised in a sweep point's process by :data:`PREEMPT_SIGNAL`: the sweep's queue wants its
    GPUs. It stops as on Ctrl-C (status ``interrupted``, hosts released), after asking the chief
    for a checkpoint (orchestrator/runtime/supervisor.py ``checkpoint_before_stop``), and
    writes no runs.csv row: the launcher starts it again later as a resumed point."""


class ResumeRefused(Exception):
    """A check failed before anything was touched; the message is the one line to print."""


@dataclass
class PointPlan:
    """What a resume will do with one point."""

    num: int
    overrides: list[str]
    run_dir: Path
    status: str  # completed | failed | killed | interrupted | not started
    action: str  # keep | resume | start | rerun
    from_step: int = 0  # the newest checkpoint's step (resume)
    last_step: int = 0  # the last step recorded
    hourly_usd: float = 0.0
    est_train_time_s: float | None = None
    total_steps: int = 0


@dataclass
class Target:
    """The directory to resume: a sweep (``multirun.yaml``) or a single run."""

    path: Path
    is_sweep: bool
    argv: list[str]  # the command to replay, without the program name
    points: list[PointPlan] = field(default_factory=list)

    @property
    def runs_csv(self) -> Path:
        return self.path / index.RUNS_CSV


# --- the state of a point, from its directory ------------------------------------------------


def active() -> bool:
    return bool(os.environ.get(ENV))


def retry_failed() -> bool:
    return os.environ.get(ENV) == "retry-failed"


def point_status(run_dir: Path) -> str:
    """completed | failed | killed | interrupted | running | not started."""
    if not (run_dir / results.CONFIG_FILE).exists():
        return "not started"
    return results.run_status(run_dir)


def action_for(status: str, retry: bool) -> str:
    if status == results.STATUS_COMPLETED:
        return KEEP
    if status == results.STATUS_FAILED:
        return RERUN if retry else KEEP
    if status == "not started":
        return START
    return RESUME  # killed, interrupted (and running, refused before this is asked)


def kept_summary(run_dir: Path) -> dict[str, Any] | None:
    """In a resume: the summary of a point that is kept as it is (completed, or failed without
    ``--retry-failed``); None for one that runs."""
    summary = results.read_summary(run_dir)
    if summary is None or action_for(str(summary.get("status")), retry_failed()) != KEEP:
        return None
    return summary


def newest_checkpoint_step(store: Path) -> int:
    """The step of the newest checkpoint in a local store folder (0 when none). OSError when
    the folder exists but cannot be read."""
    from trainer.checkpoints import checkpoint_paths

    if not store.exists():
        return 0
    os.listdir(store)  # raises for an unreadable store
    paths = checkpoint_paths(store)
    return int(paths[0].rsplit("-", 1)[1]) if paths else 0


def bucket_checkpoint_step(storage: str, run_id: str, run_dir: Path,
                           store: Any = None, provider: dict[str, Any] | None = None) -> int:
    """The newest checkpoint step in a run's bucket mirror (``provider.storage = gs://...``,
    where a resumed chief restores from when the local folder is empty), read with the run's
    ``provider.credentials`` (`provider`: its saved provider config); refuses when the bucket
    cannot be listed."""
    import re

    from provisioning.gce.storage import checkpoint_url, is_gcs, store_for_provider

    if not is_gcs(storage):
        return 0
    url = checkpoint_url(storage, run_id)
    try:
        names = (store if store is not None else store_for_provider(provider or {})).list(url)
    except Exception as ex:  # StorageError, credentials, transport: one line
        raise ResumeRefused(f"resume: the checkpoint store {url} of {run_dir} cannot be read: "
                            f"{' '.join(str(ex).split())[:300]}") from None
    steps = [int(m.group(1)) for n in names if (m := re.search(r"-(\d+)\.index$", n))]
    return max(steps, default=0)


def _check_composes(point: PointPlan, search: list[str]) -> None:
    """The point's recorded command line composes with this code and config (an experiment
    renamed or deleted since would fail the replay after the records were rewritten)."""
    from orchestrator.config.compose import compose_config
    from orchestrator.config.errors import ConfigError
    from orchestrator.config.hydra_errors import config_error_from_hydra, explain

    try:
        compose_config(point.overrides, search)
    except Exception as ex:
        err = ex if isinstance(ex, ConfigError) else config_error_from_hydra(ex)
        if err is None:
            raise
        raise ResumeRefused(f"resume: {point.run_dir}'s command line "
                            f"({' '.join(point.overrides) or 'no overrides'}) no longer "
                            f"composes with this code: {explain(err).line()}") from None


def _plan_unstarted(point: PointPlan, search: list[str]) -> dict[str, Any]:
    """The plan of a point that never started, composed with the current code (and the
    recorded ``hydra.searchpath``: extra config dirs); refuses with the field when it no longer
    composes."""
    from orchestrator.config.compose import compose_config
    from orchestrator.config.errors import ConfigError
    from orchestrator.config.hydra_errors import config_error_from_hydra, explain
    from orchestrator.plan.load import load_and_plan

    try:
        return load_and_plan(compose_config(point.overrides, search))[1].to_dict()
    except Exception as ex:
        err = ex if isinstance(ex, ConfigError) else config_error_from_hydra(ex)
        if err is None:
            raise
        raise ResumeRefused(f"resume: sweep point {' '.join(point.overrides)} no longer "
                            f"composes with this code: {explain(err).line()}") from None


def _read_yaml(path: Path) -> Any:
    """The file's YAML; None when it is missing, unreadable, not UTF-8 or not YAML."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


# --- finding the target and its points -------------------------------------------------------


def find_target(path: Path) -> Target:
    path = Path(path).resolve()
    if not path.is_dir():
        raise ResumeRefused(f"resume: {path} is not a directory")
    if (path.parent / MULTIRUN_FILE).exists() and not (path / MULTIRUN_FILE).exists():
        path = path.parent  # a sweep point: its sweep
    multirun = _read_yaml(path / MULTIRUN_FILE)
    if isinstance(multirun, dict):
        hydra = multirun.get("hydra") or {}
        task = [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
        extra = [str(o) for o in (hydra.get("overrides") or {}).get("hydra") or []
                 if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
        target = Target(path, True, ["-m", *task, *extra, f"hydra.sweep.dir={path}"])
        params = (hydra.get("sweeper") or {}).get("params") or {}
        combos = sweep.expand_sweep([f"{k}={v}" for k, v in params.items()] + task)
        by_overrides = {tuple(index.recorded_overrides(d)): d for d in sorted(path.iterdir())
                        if (d / ".hydra" / "overrides.yaml").exists()}
        for num, combo in enumerate(combos):
            run_dir = by_overrides.get(tuple(combo), path / str(num))
            target.points.append(PointPlan(num, combo, run_dir, "", ""))
        described = {p.run_dir for p in target.points}
        strays = [d for d in by_overrides.values() if d not in described]
        if strays:  # a torn or edited multirun.yaml: its points would be dropped silently
            stray = " ".join(index.recorded_overrides(strays[0]))
            raise ResumeRefused(f"resume: {path / MULTIRUN_FILE} does not describe the sweep's "
                                f"point {strays[0]} ({stray}): "
                                "the file is damaged or was edited; restore it (Hydra writes "
                                "it when the sweep starts)")
        return target
    hydra_file = _read_yaml(path / ".hydra" / "hydra.yaml")
    if not (path / results.CONFIG_FILE).exists() or not isinstance(hydra_file, dict):
        raise ResumeRefused(f"resume: {path} is neither a sweep directory ({MULTIRUN_FILE}) "
                            f"nor a run directory ({results.CONFIG_FILE} and .hydra/)")
    task = index.recorded_overrides(path)
    extra = [str(o) for o in ((hydra_file.get("hydra") or {}).get("overrides") or {})
             .get("hydra") or [] if not o.startswith(("hydra.run.dir=", "hydra.mode="))]
    target = Target(path, False, [*task, *extra, f"hydra.run.dir={path}"])
    target.points.append(PointPlan(0, task, path, "", ""))
    return target


def inspect(target: Target, retry: bool) -> None:
    """Fill in each point's status and action; refuse when a live orchestrator owns DIR, a
    recorded config no longer composes, or a checkpoint store cannot be read."""
    from orchestrator.config.errors import ConfigError
    from orchestrator.config.load import to_experiment
    from orchestrator.config.validation import validate

    search = [a for a in target.argv if a.startswith("hydra.searchpath=")]
    for point in target.points:  # the replay composes every point's command line again
        _check_composes(point, search)
    for lock_dir in [target.path, *(p.run_dir for p in target.points)]:
        if results.is_locked(lock_dir):
            owner = results.read_lock(lock_dir / results.LOCK_FILE)
            raise ResumeRefused(f"resume: {lock_dir} is owned by a live orchestrator (pid "
                                f"{owner.get('pid', '?')} on {owner.get('host', '?')}); "
                                "wait for it to end or stop it first")
    for point in target.points:
        point.status = point_status(point.run_dir)
        point.action = action_for(point.status, retry)
        if point.action == START:
            plan = _plan_unstarted(point, [a for a in target.argv
                                           if a.startswith("hydra.searchpath=")])
        else:
            config = _read_yaml(point.run_dir / results.CONFIG_FILE)
            if not isinstance(config, dict):
                raise ResumeRefused(f"resume: {point.run_dir / results.CONFIG_FILE} cannot be "
                                    "read as the YAML mapping a run records (missing, not "
                                    "UTF-8, or damaged)")
            try:
                validate(to_experiment(config))
            except ConfigError as err:
                raise ResumeRefused(f"resume: the config recorded in {point.run_dir} no "
                                    f"longer composes with this code: {err.line()}") from None
            plan = results.read_json_object(point.run_dir / results.PLAN_FILE)
        point.hourly_usd = float(plan.get("hourly_usd") or 0.0)
        point.est_train_time_s = plan.get("est_train_time_s")
        phases = plan.get("phases") or [{}]
        point.total_steps = int(phases[-1].get("end_step") or 0)
        state = fold_events_file(point.run_dir / results.EVENTS_FILE)
        point.last_step = state.attempt_reach
        if point.est_train_time_s is None and point.total_steps:  # no model: its own speed
            sps = state.mean_steps_per_sec
            point.est_train_time_s = point.total_steps / sps if sps else None
        if point.action == RESUME:
            store = point.run_dir / results.CHECKPOINT_DIR
            try:
                point.from_step = newest_checkpoint_step(store)
            except OSError as ex:
                raise ResumeRefused(f"resume: the checkpoint store {store} of {point.run_dir} "
                                    f"cannot be read: {ex.strerror or ex}") from None
            storage = (config.get("provider") or {}).get("storage")
            run_id = results.read_json_object(point.run_dir / results.SPEC_FILE).get("run_id")
            if storage and run_id:
                point.from_step = max(point.from_step, bucket_checkpoint_step(
                    str(storage), str(run_id), point.run_dir,
                    provider=dict(config.get("provider") or {})))
            point.last_step = max(point.last_step, point.from_step)


# --- before the replay: clean up and make the records consistent ----------------------------


def clean_up(target: Target) -> list[str]:
    """Stop what the dead orchestrator's journals still list as running (``release``'s way)."""
    from orchestrator.release import find_journals, provider_configs
    from provisioning.journal import clean_up as journal_clean_up

    lines = []
    for journal in find_journals([target.path]):
        for line in journal_clean_up(journal, configs=provider_configs(journal.parent)):
            lines.append(f"{journal.parent}: {line}")
    return lines


# --- in the task: one point ------------------------------------------------------------------


@dataclass
class Resumption:
    """A point that continues: its identity, where it continues from, what came before."""

    run_id: str
    attempt: int  # 2 for the first resume
    previous_status: str
    from_step: int
    last_step: int
    earlier_s: float  # seconds the earlier attempts held hosts (recorded, for the reader)

    @property
    def cluster_id(self) -> str:
        """The name of this attempt's hosts (fresh ones, never the dead attempt's folders)."""
        return f"{self.run_id}-r{self.attempt}"

    @property
    def lost_steps(self) -> int:
        return max(0, self.last_step - self.from_step)

    def record(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "previous_status": self.previous_status,
                "from_step": self.from_step, "last_step": self.last_step,
                "lost_steps": self.lost_steps, "earlier_s": round(self.earlier_s, 3)}


def prepare_point(run_dir: Path) -> Resumption | None:
    """In a resume, before a point that runs: None to start it fresh (never started, or a
    failed one re-run: its files moved to ``previous/failed-<k>/``); a :class:`Resumption`
    for one that continues (its stale summary removed: it is running again)."""
    run_dir = Path(run_dir)
    status = point_status(run_dir)
    if status == "not started":
        return None
    if status == results.STATUS_FAILED:
        _move_aside(run_dir)
        return None

    # the run id names the checkpoint store (a bucket's folder): the one the roles were given;
    # killed before any role started, nothing was stored and a new id will do
    spec = results.read_json_object(run_dir / results.SPEC_FILE)
    run_id = str(spec.get("run_id") or make_run_id(str(recorded_config(run_dir)["name"])))
    state = fold_events_file(run_dir / results.EVENTS_FILE)  # every attempt's, one fold
    from_step = newest_checkpoint_step(run_dir / results.CHECKPOINT_DIR)
    # step events come every report_every_s: a checkpoint may be newer than the last of them
    resumption = Resumption(run_id, state.resumes + 2, status, from_step,
                            max(from_step, state.attempt_reach), state.attempts_s)
    for stale in (results.SUMMARY_FILE, results.SUMMARY_FILE + ".tmp", results.ERROR_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    killpoints.hit("resume")
    return resumption


def _move_aside(run_dir: Path) -> None:
    previous = run_dir / PREVIOUS_DIR
    k = 1
    while (previous / f"failed-{k}").exists():
        k += 1
    dest = previous / f"failed-{k}"
    dest.mkdir(parents=True)
    for item in run_dir.iterdir():
        if item.name not in (PREVIOUS_DIR, ".hydra", results.LOCK_FILE):
            shutil.move(str(item), str(dest / item.name))


def recorded_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config the run started with (a resumed run goes on with it)."""
    config = _read_yaml(Path(run_dir) / results.CONFIG_FILE)
    assert isinstance(config, dict), run_dir
    return config


# --- the command -------------------------------------------------------------------------------


def describe(target: Target) -> list[str]:
    """The dry run: one line per point (kept / resumed from step N / started) and its cost."""
    lines = []
    total = 0.0
    for p in target.points:
        remaining = max(0, p.total_steps - p.from_step) if p.total_steps else None
        cost = None
        if p.action != KEEP and p.est_train_time_s and p.total_steps and remaining is not None:
            cost = catalog.cost_usd([p.hourly_usd], p.est_train_time_s * remaining / p.total_steps)
            total += cost
        what = {KEEP: f"kept ({p.status})",
                RESUME: f"resumed from step {p.from_step} ({p.status} at step {p.last_step}, "
                        f"{max(0, p.last_step - p.from_step)} steps lost)",
                START: "started", RERUN: "re-run from scratch (failed; --retry-failed)"}[p.action]
        cost_text = "" if p.action == KEEP else (
            f"; about ${cost:.4f}" if cost is not None else "; cost: no speed estimate yet")
        lines.append(f"[{p.num + 1}/{len(target.points)}] {' '.join(p.overrides)}: "
                     f"{what}{cost_text}; {p.run_dir}")
    lines.append(f"resume of {target.path}: {sum(p.action == KEEP for p in target.points)} "
                 f"kept, {sum(p.action == RESUME for p in target.points)} resumed, "
                 f"{sum(p.action in (START, RERUN) for p in target.points)} started; "
                 f"estimated ${total:.4f} if run in the cloud")
    return lines


def parse_args(argv: list[str]) -> tuple[Path, bool, bool] | None:
    """``(DIR, retry_failed, dry_run)`` when argv asks for a resume, else None. Anything else
    on the command line is refused: a resume replays the recorded overrides."""
    args = argv[1:]
    if "--resume" not in args and not any(a.startswith("--resume=") for a in args):
        return None
    rest, path = [], None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--resume" and i + 1 < len(args):
            path, i = Path(args[i + 1]), i + 2
            continue
        if arg.startswith("--resume="):
            path = Path(arg.partition("=")[2])
        else:
            rest.append(arg)
        i += 1
    if path is None:
        raise ResumeRefused("resume: --resume needs a directory (a run or a sweep folder)")
    retry = "--retry-failed" in rest
    dry = any(a in ("dry_run=true", "dry_run=True") for a in rest)
    unknown = [a for a in rest if a not in ("--retry-failed", "dry_run=true", "dry_run=True")]
    if unknown:
        raise ResumeRefused(f"resume: {' '.join(unknown)}: a resume takes no overrides (it "
                            "replays the recorded ones); allowed: --retry-failed, dry_run=true")
    return path, retry, dry


def _hold_resume_lock(path: Path) -> None:
    """This process resumes `path` until it exits; another resume of it refuses at once."""
    global _resume_lock
    from orchestrator.config.errors import ConfigError

    try:
        _resume_lock = results.RunDirLock(path, RESUME_LOCK_FILE)
    except ConfigError:
        owner = results.read_lock(path / RESUME_LOCK_FILE)
        raise ResumeRefused(f"resume: {path} is being resumed by a live orchestrator (pid "
                            f"{owner.get('pid', '?')} on {owner.get('host', '?')}); wait for "
                            "it to end or stop it first") from None


def start(argv: list[str]) -> list[str] | None:
    """The entry point's hook: for ``--resume DIR`` check, clean up, reconcile and return the
    argv to replay through Hydra (None: it was a dry run, printed). ResumeRefused for a
    refusal (the caller prints its line and exits 2)."""
    parsed = parse_args(argv)
    if parsed is None:
        return argv
    path, retry, dry = parsed
    target = find_target(path)
    if not dry:
        _hold_resume_lock(target.path)
    inspect(target, retry)
    if dry:
        print("\n".join(describe(target)))
        return None
    for line in clean_up(target):
        print(line, file=sys.stderr)
    kept = {p.run_dir: p.overrides for p in target.points if p.action == KEEP}
    index.reconcile_runs_csv(target.runs_csv, kept)
    if target.is_sweep:
        index.repair_launches(target.path, {a: [p.num for p in target.points if p.action == a]
                                            for a in (KEEP, RESUME, START, RERUN)})
    for line in describe(target):
        print(line)
    os.environ[ENV] = "retry-failed" if retry else "1"
    return [argv[0], *target.argv]
