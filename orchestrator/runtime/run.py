"""One run, start to end: provision → deploy → train → record → release.

Reads top to bottom as the state machine it is. Whatever happens (completion, a crashed role,
an exception, Ctrl-C or SIGTERM), the ``finally`` block stops every process and releases every
host, and ``summary.json`` is written atomically with the status.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import killpoints
from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig
from orchestrator.plan import RunPlan
from orchestrator.preflight import run_preflight
from orchestrator.resume import Preempted
from orchestrator.rundir import results
from orchestrator.rundir.record import RunState, fold_events_file, make_run_id, summarize
from orchestrator.runtime.control import ControlChannel
from orchestrator.runtime.deploy import TF_EXTRAS, role_lease_s
from orchestrator.runtime.fleet import Fleet, gpu_tasks
from orchestrator.runtime.progress import RunProgress
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.transient.revocation import RevocationSchedule
from orchestrator.transient.stragglers import InjectionSchedule
from provisioning import catalog
from provisioning.base import Cluster, ClusterRequest, ContactLostError
from provisioning.journal import JOURNAL_FILE, Journal
from provisioning.registry import get_provider
from trainer.events import EVENT_FAILURE, disk_full_fields, disk_full_line, is_disk_full
from trainer.layout import CHECKPOINT_DIR, CLUSTER_JOBS, CONTROL_FILE
from trainer.spec import PhaseSpec, StragglerSpec, TrainerSpec


def before_provisioning(cfg: ExperimentConfig, plan: RunPlan) -> None:
    """What a real run checks and fetches before anything is provisioned: cloud credentials
    (before a download), then the dataset (a bad ``job.data_dir`` or a failed download stops
    here). A simulated run (its backend ``simulated``) provisions nothing and reads no data."""
    from orchestrator.config.validation import validate_run_start
    from orchestrator.runtime import data

    if not plan.backend.simulated:
        validate_run_start(cfg)
        check_tensorflow_here(cfg, plan)
        data.prepare(cfg)


def check_tensorflow_here(cfg: ExperimentConfig, plan: RunPlan) -> None:
    """TensorFlow where this machine trains: in the roles' interpreter of a `hosts_here`
    backend (this one, or ``provider.python``), and in this one for a remote run's preflight
    step. The bare install has none; without this the run would end "ps 0 exited with code 1
    before it was ready", the cause only in a role's log."""
    import importlib.util
    import subprocess

    if plan.backend.hosts_here:
        python = getattr(cfg.provider, "python", None) or sys.executable
        if python == sys.executable:
            found = importlib.util.find_spec("tensorflow") is not None
        else:  # another interpreter: ask it (a missing one is the provider's error to give)
            probe = "import importlib.util as u, sys; sys.exit(u.find_spec('tensorflow') is None)"
            try:
                found = subprocess.run([python, "-c", probe], capture_output=True,
                                       timeout=60).returncode != 1
            except (OSError, subprocess.TimeoutExpired):
                found = True
        if not found:
            field = "provider.python" if python != sys.executable else "provider"
            raise ConfigError(field, f"provider={cfg.provider.name} runs the roles with "
                              f"{python}, which has no TensorFlow", TF_EXTRAS)
    elif cfg.preflight and importlib.util.find_spec("tensorflow") is None:
        raise ConfigError("preflight", "the preflight step trains on this machine, whose "
                          f"Python ({sys.executable}) has no TensorFlow",
                          f"{TF_EXTRAS}; or preflight=false")


def build_trainer_spec(cfg: ExperimentConfig, plan: RunPlan, cluster: Cluster, run_id: str,
                       run_dir: str = ".", control_file: str | None = None,
                       checkpoint_dir: str | None = None,
                       gpus_checked: bool = False) -> TrainerSpec:
    """The launch spec every role reads: addresses from the cluster, steps from the plan.

    Paths are host paths: `run_dir` "." is each role's working directory (its host's work
    dir), where the control file, TensorBoard and the spec itself live; `checkpoint_dir` is
    where the chief writes checkpoints (the checkpoint store's location for this cluster).
    `gpus_checked` (`Provider.gpus_checked`): the servers of hosts with a GPU must see it."""
    return TrainerSpec(
        run_id=run_id,
        cluster={job: cluster.endpoints(job) for job in CLUSTER_JOBS},
        job=replace(cfg.job, train_steps=plan.total_steps),
        phases=[PhaseSpec(p.protocol, p.end_step, dict(p.hparams)) for p in plan.phases],
        run_dir=run_dir,
        report_every_s=cfg.report_every_s,
        stragglers=straggler_specs(cfg),
        control_file=control_file,
        checkpoint_dir=checkpoint_dir,
        gpu_tasks=gpu_tasks(cluster) if gpus_checked else {},
    )


def straggler_specs(cfg: ExperimentConfig) -> list[StragglerSpec]:
    """The injection schedule in the trainer's terms (run seconds since train_start, or a
    global step from which an injection lasts to the end)."""
    if not cfg.straggler.enabled:
        return []
    specs = [StragglerSpec(list(e.workers), e.delay_s, start_s=e.start_s, end_s=e.end_s)
             for e in InjectionSchedule(cfg.straggler.injections).episodes()]
    specs += [StragglerSpec(list(inj.workers), inj.delay_s, start_step=inj.start_step)
              for inj in cfg.straggler.injections
              if inj.start_s is None and inj.start_step is not None]
    return specs


def cluster_request(plan: RunPlan, run_id: str, run_dir: Path,
                    sweep_id: str | None = None) -> ClusterRequest:
    return ClusterRequest(run_id=run_id, hosts=plan.host_specs(), workdir=run_dir,
                          sweep_id=sweep_id)


def execute_run(cfg: ExperimentConfig, plan: RunPlan, run_dir: Path,
                resolved_config: dict[str, Any], title: str,
                sweep_id: str | None = None, resumption: Any = None) -> dict[str, Any]:
    """Run one experiment for real in ``run_dir`` and return its summary (also written to
    disk). One of the two players of a plan (the other: :func:`orchestrator.simulate.run.
    execute_sim`, same signature); the entry point picks one from the backend's class.

    Never raises for a failed training run: the status says so. KeyboardInterrupt (Ctrl-C,
    SIGTERM via the entry point) is recorded as ``interrupted`` and re-raised after clean-up.
    ``sweep_id`` (a sweep point's) reaches the provider on the cluster request. A
    ``resumption`` (orchestrator/resume.py) continues a run whose orchestrator died, in the same
    directory: same run id and checkpoint store, fresh hosts, a ``resumed`` event first.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    # the run's fold, which its summary is built from: a resumed run's holds its earlier
    # attempts' events first (events.jsonl), then every event this attempt records
    state = fold_events_file(run_dir / results.EVENTS_FILE) if resumption is not None \
        else RunState()
    rec = results.RunRecorder(run_dir, on_event=state.apply)
    run_id = make_run_id(cfg.name) if resumption is None else resumption.run_id
    cluster_id = run_id if resumption is None else resumption.cluster_id
    status = results.STATUS_FAILED
    interrupted: BaseException | None = None
    error: str | None = None
    if resumption is not None:
        rec.event(results.EVENT_RESUMED, **resumption.record())
    rec.write_config(resolved_config)
    rec.write_json(results.PLAN_FILE, plan.to_dict())
    killpoints.hit("run_dir")
    provider = get_provider(cfg.provider.name, cfg.provider,
                            journal=Journal(run_dir / JOURNAL_FILE))
    revocations = RevocationSchedule.from_config(cfg.revocation, plan.hosts)
    control = ControlChannel(run_dir / CONTROL_FILE)
    fleet: Fleet | None = None
    supervisor: Supervisor | None = None
    progress = RunProgress(title, plan.total_steps, enabled=cfg.progress)
    started = time.time()
    try:
        with progress:
            # provision
            progress.status("provisioning")
            rec.event(results.EVENT_PROVISION, hosts=len(plan.hosts), provider=provider.name,
                      sweep_id=sweep_id,
                      planned_revocations=[e.to_record() for e in revocations.pending])
            if cfg.preflight and not provider.hosts_here:
                run_preflight(cfg)  # one local training step before paying for servers
            cluster = provider.acquire(cluster_request(plan, cluster_id, run_dir, sweep_id))
            killpoints.hit("provisioning")
            fleet = Fleet(provider, cluster, run_dir,
                          build_trainer_spec(cfg, plan, cluster, run_id,
                                             gpus_checked=provider.gpus_checked),
                          provider.checkpoint_store(run_id, run_dir / CHECKPOINT_DIR),
                          control, rec=rec,
                          ready_timeout_s=cfg.provider.ready_timeout_s,
                          lease_s=role_lease_s(cfg.provider.contact_grace_s()))
            rec.event(results.EVENT_PROVISIONED,
                      hosts=[f"{h.spec.name}={h.endpoint}" for h in cluster.hosts])
            # deploy: servers first, then evaluator and chief; a machine lost on the way is
            # recovered as any later loss (replaced, shrunk, or its machine re-acquired)
            progress.status("starting roles")
            control.reset()
            supervisor = Supervisor(cfg, fleet, rec, progress, control, revocations)
            supervisor.deploy()
            # train: follow events, host losses and recovery until done or failed
            supervisor.follow()
            error = supervisor.state.error
            status = results.STATUS_COMPLETED if error is None else results.STATUS_FAILED
    except ContactLostError as ex:  # our network, not the machines: resumable, no restart spent
        status = results.STATUS_INTERRUPTED
        error = (f"lost contact with every machine: {ex}; `python -m orchestrator --resume "
                 f"{run_dir}` continues from the last checkpoint")
    except KeyboardInterrupt as ex:
        status, interrupted = results.STATUS_INTERRUPTED, ex
        error = "interrupted by the user (Ctrl-C or SIGTERM)"
        if isinstance(ex, Preempted):  # resumed later from the store: checkpoint first
            error = "preempted by the sweep's queue (queue.policy): to resume from its checkpoint"
            if supervisor is not None:
                supervisor.checkpoint_before_stop()
    except Exception as ex:
        status = results.STATUS_FAILED
        error = f"{type(ex).__name__}: {ex}"
        if is_disk_full(ex):  # our own write: one line naming the folder, no restart spent
            full = disk_full_fields(ex, [str(run_dir)])
            error = disk_full_line("the orchestrator", full.get("path"), full.get("free_bytes"))
        with contextlib.suppress(OSError):  # the disk may be the full one
            rec.write_error(traceback.format_exc())
    finally:
        if error:
            with contextlib.suppress(OSError):  # full disk: the release below must still run
                rec.event(EVENT_FAILURE, error=error)
                if not (run_dir / results.ERROR_FILE).exists():
                    rec.write_error(error + "\n")
        killpoints.hit("teardown")
        _release(fleet, rec)
        summary = make_summary(plan, run_id, status, started, state, error)
        rec.write_summary(summary)
        rec.close()
        killpoints.hit("archive")
        if fleet is not None:
            try:
                fleet.store.finish(run_dir)  # e.g. results to the bucket
            except Exception as ex:  # the run's outcome stands; say what was not archived
                print(f"warning: results not archived: {type(ex).__name__}: {ex}",
                      file=sys.stderr)
    if interrupted is not None:
        raise interrupted
    return summary


def _release(fleet: Fleet | None, rec: results.RunRecorder) -> None:
    """Fetch TensorBoard, stop every process and release every host; repeated Ctrl-C cannot
    skip it."""
    for attempt in range(3):
        try:
            if fleet is not None:
                fleet.release()
            rec.event(results.EVENT_TEARDOWN)
            return
        except KeyboardInterrupt:
            if attempt == 2:
                raise


def make_summary(plan: RunPlan, run_id: str, status: str, started: float,
                 state: RunState | None, error: str | None) -> dict[str, Any]:
    """The real run's summary: the fold of the events the run recorded (``state``, the
    recorder's: every attempt's for a resumed run), with this attempt priced for its wall time
    (the cluster's price from the command's start to the teardown's end)."""
    ended = time.time()
    wall = ended - started
    return summarize(state or RunState(), plan.to_dict(), run_id=run_id, status=status, wall_s=wall,
                     cost_usd=catalog.cost_usd([plan.hourly_usd], wall), error=error,
                     ended_at=ended).to_dict()
