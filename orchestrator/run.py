"""One run, start to end: provision → deploy → train → record → release.

Reads top to bottom as the state machine it is. Whatever happens (completion, a crashed role,
an exception, Ctrl-C or SIGTERM), the ``finally`` block stops every process and releases every
host, and ``summary.json`` is written atomically with the status.
"""

from __future__ import annotations

import sys
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import results
from orchestrator.deploy import EVENT_PROCESS_EXIT, Deployment, TrainerEvent
from orchestrator.journal import JOURNAL_FILE, Journal
from orchestrator.plan import RunPlan
from orchestrator.progress import RunProgress
from orchestrator.schema import ExperimentConfig
from provisioning.base import Cluster, ClusterRequest, HostSpec
from provisioning.registry import get_provider
from trainer.spec import JobSpec, PhaseSpec, TrainerSpec

EVENT_POLL_S = 0.5  # how long one wait for a trainer event lasts before checking processes
FINAL_EVAL_TIMEOUT_S = 120.0  # how long the evaluator may take after the chief is done


@dataclass
class RunState:
    """What the event stream has told us so far."""

    start_time: float = field(default_factory=time.time)
    global_step: int = 0
    train_start: float | None = None
    train_end: float | None = None
    train_time_s: float | None = None
    last_loss: float | None = None
    last_sps: float | None = None
    final_accuracy: float | None = None
    chief_done: bool = False
    evaluator_done: bool = False
    error: str | None = None


def make_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def build_trainer_spec(cfg: ExperimentConfig, plan: RunPlan, cluster: Cluster, run_id: str,
                       run_dir: Path) -> TrainerSpec:
    """The launch spec every role reads: addresses from the cluster, steps from the plan."""
    job = asdict(cfg.job)
    job = {k: (v.value if hasattr(v, "value") else v) for k, v in job.items()}
    job["train_steps"] = plan.total_steps
    return TrainerSpec(
        run_id=run_id,
        cluster={role: cluster.endpoints(role) for role in ("ps", "worker", "chief")},
        job=JobSpec(**job),
        phases=[PhaseSpec(p.protocol, p.end_step, dict(p.hparams)) for p in plan.phases],
        run_dir=str(run_dir),
        report_every_s=cfg.report_every_s,
    )


def cluster_request(plan: RunPlan, run_id: str, run_dir: Path) -> ClusterRequest:
    hosts = [HostSpec(name=h.name, role=h.role, machine_type=h.machine_type, gpu=h.gpu,
                      zone=h.zone, transient=h.transient) for h in plan.hosts]
    return ClusterRequest(run_id=run_id, hosts=hosts, workdir=run_dir / "hosts")


def _handle(event: TrainerEvent, state: RunState, rec: results.RunRecorder,
            progress: RunProgress) -> None:
    """Record one trainer event and fold it into the run state."""
    f = event.fields
    rec.event(event.kind, role=event.role, time_s=event.time, index=event.index, **f)
    wall = event.time - state.start_time
    step = f.get("step")
    if isinstance(step, int | float):
        state.global_step = max(state.global_step, int(step))
    if event.kind == "train_start":
        state.train_start = event.time
        progress.status("training")
    elif event.kind == "step":
        state.last_loss = _num(f.get("loss"))
        state.last_sps = _num(f.get("steps_per_sec"))
        rec.metric(wall, int(f.get("step", 0)), state.last_sps, state.last_loss)
        progress.update(state.global_step, state.last_sps, state.last_loss)
    elif event.kind == "eval":
        acc = _num(f.get("accuracy"))
        state.final_accuracy = acc
        rec.metric(wall, int(f.get("step", 0)), eval_accuracy=acc)
        progress.update(accuracy=acc)
        if f.get("final"):
            state.evaluator_done = True
    elif event.kind == "train_end":
        state.train_end = event.time
        state.train_time_s = _num(f.get("train_time_s"))
        progress.update(state.global_step)
    elif event.kind == "failure" and state.error is None:
        state.error = f"{event.role} {event.index}: {f.get('error')}"
    elif event.kind == EVENT_PROCESS_EXIT:
        code = f.get("exit_code")
        if event.role == "chief":
            state.chief_done = code == 0
        if event.role == "evaluator" and code == 0:
            state.evaluator_done = True
        if not f.get("expected", True) and state.error is None:
            state.error = f"{event.role} {event.index} exited with code {code}; see logs/"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def execute_run(cfg: ExperimentConfig, plan: RunPlan, run_dir: Path,
                resolved_config: dict[str, Any], title: str) -> dict[str, Any]:
    """Run one experiment in ``run_dir`` and return its summary (also written to disk).

    Never raises for a failed training run: the status says so. KeyboardInterrupt (Ctrl-C,
    SIGTERM via the entry point) is recorded as ``interrupted`` and re-raised after clean-up.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    rec = results.RunRecorder(run_dir)
    run_id = make_run_id(cfg.name)
    state = RunState()
    status = results.STATUS_FAILED
    interrupted: BaseException | None = None
    rec.write_config(resolved_config)
    rec.write_json(results.PLAN_FILE, plan.to_dict())
    provider = get_provider(cfg.provider.name, journal=Journal(run_dir / JOURNAL_FILE))
    cluster: Cluster | None = None
    deployment: Deployment | None = None
    progress = RunProgress(title, plan.total_steps, enabled=cfg.progress)
    try:
        with progress:
            # provision
            progress.status("provisioning")
            rec.event("provision", hosts=len(plan.hosts), provider=provider.name)
            cluster = provider.acquire(cluster_request(plan, run_id, run_dir))
            rec.event("provisioned", hosts=[f"{h.spec.name}={h.endpoint}" for h in cluster.hosts])
            spec = build_trainer_spec(cfg, plan, cluster, run_id, run_dir)
            spec_path = run_dir / results.SPEC_FILE
            spec.to_json(spec_path)
            # deploy: servers first, then evaluator and chief
            progress.status("starting roles")
            deployment = Deployment(provider, cluster, run_dir, spec_path,
                                    python=cfg.provider.python or sys.executable,
                                    ready_timeout_s=cfg.provider.ready_timeout_s)
            rec.event("start", roles={r: len(cluster.hosts_for(r)) for r in
                                      ("ps", "worker", "chief", "evaluator")})
            deployment.start()
            rec.event("ready")
            # train: follow events until the chief and the evaluator are done, or a failure
            eval_deadline: float | None = None
            while state.error is None:
                event = deployment.next_event(EVENT_POLL_S)
                if event is not None:
                    _handle(event, state, rec, progress)
                    continue
                if state.chief_done and (state.evaluator_done or not cfg.cluster.evaluator):
                    break
                if state.chief_done and eval_deadline is None:
                    eval_deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
                if eval_deadline is not None and time.monotonic() > eval_deadline:
                    state.error = "evaluator did not report the final accuracy in time"
            status = results.STATUS_COMPLETED if state.error is None else results.STATUS_FAILED
    except KeyboardInterrupt as ex:
        status, interrupted = results.STATUS_INTERRUPTED, ex
        state.error = "interrupted by the user (Ctrl-C or SIGTERM)"
    except Exception as ex:
        status = results.STATUS_FAILED
        state.error = f"{type(ex).__name__}: {ex}"
        rec.write_error(traceback.format_exc())
    finally:
        if state.error:
            rec.event("failure", error=state.error)
            if not (run_dir / results.ERROR_FILE).exists():
                rec.write_error(state.error + "\n")
        _release(deployment, provider, cluster, rec)
        summary = make_summary(cfg, plan, run_id, status, state)
        rec.write_summary(summary)
        rec.close()
    if interrupted is not None:
        raise interrupted
    return summary


def _release(deployment: Deployment | None, provider: Any, cluster: Cluster | None,
             rec: results.RunRecorder) -> None:
    """Stop every process and release every host; repeated Ctrl-C cannot skip it."""
    for attempt in range(3):
        try:
            if deployment is not None:
                deployment.teardown()
            if cluster is not None:
                provider.release(cluster)
            rec.event("teardown")
            return
        except KeyboardInterrupt:
            if attempt == 2:
                raise


def make_summary(cfg: ExperimentConfig, plan: RunPlan, run_id: str, status: str,
                 state: RunState) -> dict[str, Any]:
    wall = time.time() - state.start_time
    train_time = state.train_time_s
    if train_time is None and state.train_start is not None:
        train_time = (state.train_end or time.time()) - state.train_start
    protocols = [p.protocol for p in plan.phases]
    return {
        "schema_version": results.SCHEMA_VERSION,
        "run_id": run_id,
        "status": status,
        "experiment": cfg.name,
        "provider": cfg.provider.name,
        "protocol": ">".join(protocols),
        "workers": plan.workers,
        "parameter_servers": plan.parameter_servers,
        "global_steps": state.global_step,
        "wall_time_s": round(wall, 3),
        "train_time_s": None if train_time is None else round(train_time, 3),
        "final_accuracy": state.final_accuracy,
        "steps_per_sec": (round(state.global_step / train_time, 4)
                          if train_time else None),
        "cost_usd": round(plan.hourly_usd * wall / 3600.0, 6),
        "error": state.error,
    }
