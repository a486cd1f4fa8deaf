"""The concurrent sweep: ``-m hydra/launcher=parallel``, every sweep point in its own process.

Hydra's basic launcher runs a sweep's points one after another. This launcher (the Hydra plugin
``hydra_plugins/transient_launcher``, which only hands over to :func:`launch`) starts each point
as a process of its own, ``python -m orchestrator.parallel``, that re-enters the same task
(``run_one``) through Hydra's ``run_job`` exactly as the basic launcher does in-process: each
point has its own run directory (and lock), provider, hosts, journal and ``summary.json``, and
appends its row to the sweep's ``runs.csv`` under that file's lock.

Which points run is decided by the simulated quota queue's policy object
(:class:`orchestrator.simulate.queue.Scheduler`, the same code ``schedule`` simulates with),
asked at every poll, while at most ``queue.max_concurrent`` are live and their GPUs fit under
``queue.quota_gpus``. ``fifo`` and ``spf`` only choose which waiting point starts next.
``las`` and ``gittins`` (Tiresias' 2D-LAS and 2D-Gittins index) also preempt: a live point that
falls behind a waiting one gets :data:`orchestrator.resume.PREEMPT_SIGNAL` (SIGUSR2). It asks
its chief for a checkpoint and waits until it is in the store (``Supervisor.
checkpoint_before_stop``), releases its hosts and exits as interrupted without a runs.csv row;
the point then waits in the queue and is started again later as a resumed point, in the same
run directory, exactly as ``python -m orchestrator --resume`` resumes one
(:func:`orchestrator.resume.prepare_point`: a ``resumed`` event with ``from_step`` and
``lost_steps``, events, metrics and TensorBoard continuing). Its GPUs count as held until its
process has exited.

Service, for ``las`` and ``gittins``: the point's GPUs (``queue.run_gpus``, else its plan's) ×
the wall time its processes were live, every attempt added up (provisioning and the stop
included: the GPUs are held then too). A point of 0 GPUs never receives service, so these two
policies refuse it (``queue.run_gpus``: CPU workers on this machine hold 0). ``gittins`` needs
a distribution of run lengths: the band the simulator predicts for each point (p10, p50, p90 of
its time to result × its GPUs; for CPU workers here from this machine's cached calibration),
else its predicted time: a sweep's points are the only runs it knows before any ends, and the
band carries the spread (start-up, revocations) that the single predicted time hides. With
neither it orders as ``las``.

Before the first point starts, every point is composed, validated and planned, and what a run
checks before provisioning (credentials, data) is checked: a config error in any point stops
the sweep with one line and exit 2, with nothing provisioned for any point. Ctrl-C or SIGTERM
stops every live run (each gets SIGTERM: the same clean-up as a single run's Ctrl-C), waits for
all of them to release, starts nothing more, and exits 130. A point's process also gets SIGTERM
if the orchestrator dies (parent-death signal), so no run outlives it unreleased.

Output: the points' processes have no terminal (so no live progress bars); their lines are
relayed whole, each prefixed with ``[i/n]``, and the launcher prints one line per state change
(queued, started, preempted, stopped, resumed, ended). ``launches.jsonl`` in the sweep folder
records the same changes with times, GPUs, predictions and, for preemptions and resumes, the
service received (``attained_gpu_s``) and the queue.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchestrator.config.errors import CONFIG_ERROR_EXIT_CODE
from trainer.layout import EXIT_INTERRUPTED

#: How often the launcher looks at its runs' processes.
POLL_S = 0.2


@dataclass
class Point:
    """One sweep point as the launcher schedules it."""

    num: int  # Hydra's job number (the run's subfolder)
    overrides: list[str]
    config: Any  # the sweep config of this point (DictConfig, ``hydra`` node included)
    run_dir: Path
    gpus: int  # held against queue.quota_gpus while it runs
    predicted_s: float  # the speed model's prediction; inf when no fitted model covers it
    dry_run: bool = False
    lengths_s: list[float] = field(default_factory=list)  # gittins: its band of run times

    def label(self, total: int) -> str:
        return f"[{self.num + 1}/{total}]"


@dataclass
class _Live:
    point: Point
    proc: subprocess.Popen[bytes]
    relays: list[threading.Thread]
    since: float = 0.0  # monotonic start of this process
    service_before: float = 0.0  # GPU-seconds of its earlier (preempted) processes
    stopping: bool = False  # preempted: stopping to be resumed later


class _Output:
    """Whole lines from every run and from the launcher, never interleaved mid-line; a run's
    stderr goes to stderr (config and data errors, tracebacks), the rest to stdout."""

    def __init__(self, stream: IO[str] | None = None, errors: IO[str] | None = None) -> None:
        self._stream = stream or sys.stdout
        self._errors = errors or sys.stderr
        self._lock = threading.Lock()

    def line(self, text: str, error: bool = False) -> None:
        stream = self._errors if error else self._stream
        with self._lock:
            stream.write(text + "\n")
            stream.flush()

    def relay(self, source: IO[bytes], prefix: str, error: bool) -> None:
        for raw in iter(source.readline, b""):
            self.line(f"{prefix} {raw.decode(errors='replace').rstrip()}", error)
        source.close()


# --- before anything starts -----------------------------------------------------------------


def prepare(config: Any, loader: Any, job_overrides: Sequence[Sequence[str]],
            initial_job_idx: int) -> tuple[list[Point], Any]:
    """Compose, validate and plan every point, check what a run checks before provisioning,
    and check the sweep's queue settings; the points and the sweep's ``queue`` config. Exits 2
    with the one-line error naming the field and the point on the first problem (nothing has
    started yet)."""
    from omegaconf import open_dict

    from orchestrator.config.errors import ConfigError
    from orchestrator.config.simulate import QueuePolicy
    from orchestrator.plan.load import load_and_plan
    from orchestrator.runtime.run import before_provisioning
    from orchestrator.simulate.models import NoModelError, SimModels
    from orchestrator.simulate.queue import predict_time_s
    from orchestrator.sweep import point_error_exit

    models = SimModels.load()
    points, exps = [], []
    for offset, overrides in enumerate(job_overrides):
        num = initial_job_idx + offset
        try:
            sweep_config = loader.load_sweep_config(config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = num
                sweep_config.hydra.job.num = num
                # resolved here: ${now:} and ${pid:} would give another folder in the child
                sweep_config.hydra.sweep.dir = str(sweep_config.hydra.sweep.dir)
                sweep_config.hydra.sweep.subdir = str(sweep_config.hydra.sweep.subdir)
            exp, plan = load_and_plan(_task(sweep_config))
            if not exp.dry_run:
                before_provisioning(exp, plan)
            try:
                predicted = predict_time_s(exp, plan, models)
            except NoModelError:
                predicted = math.inf  # spf starts it after every predicted run
            gpus = plan.gpus if exp.queue.run_gpus is None else exp.queue.run_gpus
            run_dir = Path(sweep_config.hydra.sweep.dir) / str(sweep_config.hydra.sweep.subdir)
            lengths = (_band_times_s(exp, plan, predicted)
                       if exp.queue.policy == QueuePolicy.gittins else [])
            points.append(Point(num, list(overrides), sweep_config, run_dir, gpus, predicted,
                                exp.dry_run, lengths))
            exps.append(exp)
        except Exception as ex:
            point_error_exit(ex, list(overrides))
    for point, exp in zip(points, exps, strict=True):
        try:
            _check_queue(exp, exps[0], point)
        except ConfigError as ex:
            point_error_exit(ex, point.overrides)
    return points, exps[0].queue if exps else None


def _band_times_s(exp: Any, plan: Any, predicted_s: float) -> list[float]:
    """The run times ``gittins`` takes its distribution of run lengths from, for one point:
    the simulator's band of its time to result (p10, p50, p90: the prediction with its spread,
    the revocations and start-ups a single number hides; CPU workers here from this machine's
    cached calibration, never measured now), else its predicted time, else none."""
    import dataclasses

    from orchestrator.simulate.band import predict_band

    band = predict_band(dataclasses.replace(exp, dry_run=True), plan) or {}
    times = band.get("time_to_result_s") or {}
    found = [float(times[k]) for k in ("p10", "p50", "p90") if times.get(k)]
    return found or ([predicted_s] if math.isfinite(predicted_s) else [])


def _check_queue(exp: Any, first: Any, point: Point) -> None:
    """One queue setting per sweep, a run that fits, and one that a preemptive policy can
    measure (service = GPUs × time: a run of 0 GPUs never gets any)."""
    from orchestrator.config.errors import ConfigError
    from orchestrator.config.simulate import QueuePolicy

    for name in ("policy", "quota_gpus", "max_concurrent", "las_threshold_gpu_h"):
        mine, theirs = getattr(exp.queue, name), getattr(first.queue, name)
        if mine != theirs:
            raise ConfigError(f"queue.{name}", f"differs between sweep points ({theirs} and "
                              f"{mine})", "a sweep has one value: set it outside the sweep")
    if exp.queue.policy in (QueuePolicy.las, QueuePolicy.gittins) and point.gpus <= 0:
        raise ConfigError("queue.run_gpus", f"the run holds {point.gpus} GPUs, so it never "
                          f"receives service and {exp.queue.policy} would never preempt it "
                          "(CPU workers on this machine hold 0)",
                          "queue.run_gpus=1 or more")
    quota = exp.queue.quota_gpus
    if quota is not None and point.gpus > quota:
        raise ConfigError("queue.quota_gpus", f"the run needs {point.gpus} GPUs, more than "
                          f"the quota of {quota}: it could never start",
                          "raise the quota, or make the run smaller")


# --- running the points -----------------------------------------------------------------------


def launch(points: Sequence[Point], queue: Any, hydra_context: Any, task_function: Any,
           sweep_dir: Path, output: IO[str] | None = None) -> list[int | None]:
    """Run every point in its own process under the sweep's ``queue`` settings; each point's
    exit code (0 completed, 1 failed, 2 config error, 130 interrupted), None for one never
    started.

    Which points run is asked of :class:`orchestrator.simulate.queue.Scheduler` at every poll
    (see the module docstring); a point it preempts is stopped with :data:`resume.
    PREEMPT_SIGNAL`, waits, and is started again as a resumed point.

    Raises KeyboardInterrupt (Ctrl-C, SIGTERM) once every live run has stopped and released."""
    from hydra.core.singleton import Singleton

    from orchestrator import resume, sweep
    from orchestrator.rundir import index, results
    from orchestrator.simulate.queue import Job, Scheduler, admit

    if not points:
        return []
    quota, policy = queue.quota_gpus, queue.policy
    total = sweep.sweep_size or len(points)
    out = _Output(output)
    record = _Recorder(sweep_dir / index.LAUNCHES_FILE)
    all_points, kept_codes = list(points), {}
    if resume.active():  # a resume: kept points are not run again (orchestrator/resume.py)
        for p in all_points:
            summary = resume.kept_summary(p.run_dir)
            if summary is not None:
                kept_codes[p.num] = 0 if summary["status"] == results.STATUS_COMPLETED else 1
                if kept_codes[p.num]:
                    sweep.failed_runs.append(str(p.run_dir))
                record.write("kept", p, status=summary["status"])
                out.line(f"{p.label(total)} kept: {summary['status']}; {p.run_dir}")
        points = [p for p in all_points if p.num not in kept_codes]
    payload = {"context": hydra_context, "task": _task_reference(task_function),
               "instances": Singleton.get_state()["instances"], "sweep_size": total}
    # gittins' distribution of run lengths: the points' bands (see the module docstring)
    scheduler = Scheduler(policy, quota, queue.las_threshold_gpu_h,
                          [p.gpus * t for p in points for t in p.lengths_s], queue.max_concurrent)
    jobs = {p.num: Job(p.num, p.gpus, p.predicted_s, p.num) for p in points}
    by_num = {p.num: p for p in points}
    codes: dict[int, int | None] = {p.num: None for p in points}
    codes.update(kept_codes)
    live: dict[int, _Live] = {}
    preempted: set[int] = set()  # stopped by the queue, to be resumed
    order = sorted(points, key=lambda p: scheduler.priority(jobs[p.num]))
    out.line(f"sweep of {len(points)} runs, at most {queue.max_concurrent} at once"
             + (f" under a quota of {quota} GPUs" if quota is not None else "")
             + f", {policy} order: " + " ".join(p.label(total) for p in order))
    for p in order:
        record.write("queued", p)
    try:
        while any(codes[p.num] is None for p in points):
            now = time.monotonic()
            for num, run in live.items():  # service so far: GPUs × wall time live
                jobs[num].attained = run.service_before + run.point.gpus * (now - run.since)
            for num, job in jobs.items():  # a point stopping for a preemption waits already
                job.running = num in live and not live[num].stopping
            want = scheduler.running_set(
                [j for j in jobs.values() if codes[j.key] is None])
            for num, run in live.items():
                if not run.stopping and jobs[num] not in want:
                    _preempt(run, jobs[num], scheduler, record, out, total)
            used = sum(r.point.gpus for r in live.values())
            free = math.inf if quota is None else quota - used
            for job in admit([j for j in want if j.key not in live], free, lambda j: j.gpus,
                             queue.max_concurrent - len(live)):
                p = by_num[job.key]
                again = p.num in preempted
                live[p.num] = _start(p, payload, out, total, resumed=again,
                                     service=job.attained)
                used += p.gpus
                record.write("resumed" if again else "started", p, pid=live[p.num].proc.pid,
                             attained_gpu_s=round(job.attained, 3))
                out.line(f"{p.label(total)} {'resumed' if again else 'started'}: "
                         f"{' '.join(p.overrides)} ({p.gpus} GPUs"
                         + (f", {used} of {quota} in use" if quota is not None else "") + ")")
            time.sleep(POLL_S)
            for num in [n for n, r in live.items() if r.proc.poll() is not None]:
                run = live.pop(num)
                jobs[num].attained = run.service_before + run.point.gpus * (
                    time.monotonic() - run.since)
                if run.stopping and _requeue(run, record, out, total):
                    preempted.add(num)
                else:
                    codes[num] = _finish(run, record, out, total)
    except BaseException:  # Ctrl-C, SIGTERM, or the launcher's own failure: stop them all
        _stop(live, codes, record, out, total)
        pending = [p for p in points if codes[p.num] is None]
        for p in pending:
            if p.num in preempted:  # stopped at a checkpoint, its summary says interrupted
                _record_row(p, sweep_dir)
                codes[p.num] = EXIT_INTERRUPTED
            record.write("not_resumed" if p.num in preempted else "not_started", p)
        if pending:
            out.line("not started: " + ", ".join(f"{p.label(total)} {' '.join(p.overrides)}"
                                                 for p in pending))
        raise
    return [codes[p.num] for p in all_points]


def _preempt(run: _Live, job: Any, scheduler: Any, record: _Recorder, out: _Output,
             total: int) -> None:
    """The queue wants this point's GPUs: ask it to checkpoint, release and stop."""
    from orchestrator import resume

    run.stopping = True
    if run.proc.poll() is None:
        run.proc.send_signal(resume.PREEMPT_SIGNAL)
    level = scheduler.level(job.attained)
    record.write("preempted", run.point, pid=run.proc.pid,
                 attained_gpu_s=round(job.attained, 3), queue=level)
    out.line(f"{run.point.label(total)} preempted ({job.attained / 3600:.4f} GPU-h received, "
             f"queue {level}): checkpointing and releasing its hosts")


def _requeue(run: _Live, record: _Recorder, out: _Output, total: int) -> bool:
    """A preempted point's process ended: True when it stopped to be resumed (exit 130 and
    not completed or failed meanwhile), recorded as ``stopped``; False: it ended for good."""
    from orchestrator import resume
    from orchestrator.rundir import results

    code = run.proc.wait()
    for relay in run.relays:
        relay.join(timeout=5)
    status = (results.read_summary(run.point.run_dir) or {}).get("status")
    if code == -resume.PREEMPT_SIGNAL:  # before its handler was set: nothing had started
        code = EXIT_INTERRUPTED
    if code != EXIT_INTERRUPTED or status in (results.STATUS_COMPLETED,
                                               results.STATUS_FAILED):
        return False
    record.write("stopped", run.point, exit_code=code, status=status)
    out.line(f"{run.point.label(total)} stopped: hosts released, waits to resume")
    return True


def _record_row(point: Point, sweep_dir: Path) -> None:
    """runs.csv row of a preempted point the sweep will not resume (its process skipped it)."""
    from orchestrator.rundir import index, results

    summary = results.read_summary(point.run_dir)
    if summary is not None:
        index.append_run_row(sweep_dir / index.RUNS_CSV, point.overrides,
                             point.run_dir, summary)


def _task(config: Any) -> Any:
    from omegaconf import OmegaConf, open_dict, read_write

    task = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def _task_reference(task_function: Any) -> str:
    """``module:name`` of the task, importable in a fresh process (``python -m orchestrator``
    runs it as ``__main__``; its real name is ``orchestrator.__main__``)."""
    module = task_function.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None:
            raise RuntimeError("the parallel launcher needs a task function it can import "
                               "again (run it with python -m)")
        module = spec.name
    return f"{module}:{task_function.__qualname__}"


def _start(point: Point, payload: dict[str, Any], out: _Output, total: int,
           resumed: bool = False, service: float = 0.0) -> _Live:
    """The point's process; ``resumed``: a preempted point, which goes on from its checkpoint
    in the same run directory as ``--resume`` does (:func:`orchestrator.resume.prepare_point`:
    a ``resumed`` event, events and metrics continuing)."""
    from orchestrator import resume
    from provisioning.local import parent_death_preexec

    # wide enough that rich does not wrap a run's lines (the terminal wraps them, prefixed)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}
    if resumed:
        env[resume.ENV] = os.environ.get(resume.ENV) or "1"
    proc = subprocess.Popen(  # own session: a terminal's Ctrl-C reaches the launcher only
        [sys.executable, "-m", "orchestrator.parallel"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
        preexec_fn=parent_death_preexec(os.getpid(), signal.SIGTERM))
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    relays = [threading.Thread(target=out.relay, args=(source, point.label(total), error),
                               daemon=True)
              for source, error in ((proc.stdout, False), (proc.stderr, True))]
    for relay in relays:
        relay.start()
    data = pickle.dumps({**payload, "config": point.config})
    threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()
    return _Live(point, proc, relays, time.monotonic(), service)


def _feed(stdin: IO[bytes], data: bytes) -> None:
    """The payload, written while the child starts (it is larger than a pipe's buffer)."""
    try:
        stdin.write(data)
        stdin.close()
    except (BrokenPipeError, OSError):
        pass  # it died at once; its exit code says so


def _finish(run: _Live, record: _Recorder, out: _Output, total: int) -> int:
    from orchestrator import sweep
    from orchestrator.rundir import results

    code = run.proc.wait()
    for relay in run.relays:
        relay.join(timeout=5)
    if code in (-signal.SIGINT, -signal.SIGTERM):  # stopped before its handlers were set
        code = EXIT_INTERRUPTED  # (a Ctrl-C during its start): interrupted, not failed
    summary = results.read_summary(run.point.run_dir) or {}
    status = summary.get("status") or {
        0: results.STATUS_COMPLETED, CONFIG_ERROR_EXIT_CODE: "config error",
        EXIT_INTERRUPTED: results.STATUS_INTERRUPTED}.get(code, results.STATUS_FAILED)
    if code != 0 or status != results.STATUS_COMPLETED:
        sweep.failed_runs.append(str(run.point.run_dir))
    record.write("ended", run.point, exit_code=code, status=status)
    out.line(f"{run.point.label(total)} ended: {status} (exit {code}); {run.point.run_dir}")
    return code


def _stop(live: dict[int, _Live], codes: dict[int, int | None], record: _Recorder,
          out: _Output, total: int) -> None:
    """SIGTERM every live run and wait until each has released everything; a repeated Ctrl-C
    cannot cut the wait short (a run killed mid-release would leave servers behind)."""
    if live:
        out.line(f"stopping {len(live)} live run(s) and releasing their hosts")
    for run in live.values():
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
    while live:
        try:
            time.sleep(POLL_S)
            for num in [n for n, r in live.items() if r.proc.poll() is not None]:
                codes[num] = _finish(live.pop(num), record, out, total)
        except KeyboardInterrupt:
            out.line(f"still releasing {len(live)} run(s): "
                     + ", ".join(r.point.label(total) for r in live.values()))


class _Recorder:
    """``launches.jsonl``: one JSON line per state change of a point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, point: Point, **fields: Any) -> None:
        entry = {"time": time.time(), "kind": kind, "num": point.num,
                 "overrides": point.overrides, "gpus": point.gpus,
                 "predicted_s": None if math.isinf(point.predicted_s)
                 else round(point.predicted_s, 1), **fields}
        from orchestrator import killpoints

        line = json.dumps(entry) + "\n"
        killpoints.hit("launches", torn=killpoints.torn_write(self.path, line))
        with open(self.path, "a") as fh:
            fh.write(line)


# --- inside a point's process -------------------------------------------------------------------


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _on_preempt(signum: int, frame: object) -> None:
    from orchestrator import resume

    raise resume.Preempted(f"signal {signum}")


def child_main() -> int:
    """One sweep point (``python -m orchestrator.parallel``, its payload on stdin): Hydra's
    state as the launcher had it, then ``run_job`` with the task, as the basic launcher runs
    it. Exit code: 0 completed, 1 failed, 2 config error, 130 interrupted."""
    import importlib
    import traceback

    from orchestrator import resume

    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(resume.PREEMPT_SIGNAL, _on_preempt)
    try:
        payload = pickle.load(sys.stdin.buffer)
        from hydra.core.singleton import Singleton
        from hydra.core.utils import JobStatus, run_job, setup_globals

        from orchestrator import sweep
        from orchestrator.config.schema import register_configs

        setup_globals()
        register_configs()  # the ${pid:} resolver (resolvers are not pickled)
        Singleton.set_state({"instances": payload["instances"],
                             "omegaconf_resolvers": Singleton.get_state()["omegaconf_resolvers"]})
        sweep.sweep_size = payload["sweep_size"]
        module, _, name = payload["task"].partition(":")
        task = getattr(importlib.import_module(module), name)
        ret = run_job(hydra_context=payload["context"], task_function=task,
                      config=payload["config"], job_dir_key="hydra.sweep.dir",
                      job_subdir_key="hydra.sweep.subdir")
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if ret.status == JobStatus.FAILED:
        error = ret._return_value
        traceback.print_exception(error)
        return 1
    return 1 if sweep.failed_runs else 0


if __name__ == "__main__":
    sys.exit(child_main())
