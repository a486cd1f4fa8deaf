"""The chief: coordinator and training loop for parameter-server training (ASP and BSP).

Run each role locally (same spec file, one terminal each; `trainer/spec.py` builds specs):

    python -m trainer --role ps        --index 0 --spec run/trainer_spec.json
    python -m trainer --role worker    --index 0 --spec run/trainer_spec.json   # and 1, 2, ...
    python -m trainer --role chief     --index 0 --spec run/trainer_spec.json   # this file
    python -m trainer --role evaluator --index 0 --spec run/trainer_spec.json

The model, the optimizer state and the step counters live on the parameter servers; the
chief only schedules closures (`ClusterCoordinator`) and never holds the weights. Both
protocols (trainer/steps.py) use the same PS variables, so a switch is an in-place
change of the step function and of two hyperparameter variables: no restart, no new
coordinator. It happens at a phase boundary, or when the orchestrator overrides the
protocol through the control file (trainer/control.py).

Budget: a phase's budget is in BSP-equivalent steps (a BSP global step = 1, an ASP global
step = 1/N for the N workers of the spec; `control.Budget`). A phase ends when its budget is
used up, so without overrides the global-step targets in `spec.phases` are hit exactly. The
units used are checkpointed, so a resumed run continues the same accounting.

Events (besides step/worker_steps/worker_failure/worker_rejoined, trainer/meter.py,
`startup`, trainer/startup.py, and `worker_unresponsive`/`ps_unresponsive`,
trainer/heartbeat.py):
- `train_start` `{"step", "workers", "resumed_from"}`: the step resumed from (0 when fresh)
  and the checkpoint path (null when fresh): the newest that restores; each newer damaged
  one is reported first as `checkpoint_skipped` (trainer/checkpoints.py).
- `phase_start` `{"protocol", "scheduled", "step", "phase", "hparams"}` (`protocol` is the one
  in force, `scheduled` the phase's own); `phase_end` `{"protocol", "step", "phase",
  "wall_s", "switch_s"}`.
- `protocol_switch` `{"from", "to", "step", "switch_s", "detect_s", "reason": "control"}`.
- `steps_per_closure` `{"steps", "auto", "protocol", "step_time_s"}`: global steps per
  worker closure, fixed by the job for both protocols (`auto` false, `protocol` null) or
  chosen per protocol from its first steps' median on-worker step time (trainer/closures.py).
- `checkpoint` `{"step", "path", "duration_s", "reason"}`, reason one of "schedule" (the
  job's checkpoint/eval frequency), "control", "notice" (this host's preemption notice),
  "final".
- `failure` `{"error", "error_kind": "ps_unavailable"}` + exit code 3 when a parameter
  server is lost (trainer/control.py); the restarted cluster resumes from the checkpoint.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer import control, events, layout, tfcompat
from trainer.asp import AspRunner
from trainer.bsp import BspRunner
from trainer.checkpoints import checkpoint_paths, restore_newest
from trainer.closures import Runner
from trainer.heartbeat import start_heartbeats
from trainer.meter import Meter, WorkerFailureEvents, watch_rejoins
from trainer.models import build_model
from trainer.optim import PSOptimizer, lr_at
from trainer.problems import get_problem, train_dataset
from trainer.spec import PhaseSpec, TrainerSpec
from trainer.startup import STARTUP, import_tensorflow
from trainer.steps import Steps
from trainer.variables import PSVariables, create_ps_variables, per_worker_ids
from trainer.waits import Membership

SERVER_WAIT_S = 120.0  # how long to wait for ps/worker ports before giving up
DONE_MARKER = layout.DONE_MARKER


def train(spec: TrainerSpec) -> None:
    """Train to the end of the last phase's budget, resuming from the latest checkpoint.

    Exits the process with code 3 (`control.ps_lost`) when a parameter server is lost.
    """
    tf = import_tensorflow()
    job, workers = spec.job, spec.num_workers
    print(f"[chief] run {spec.run_id}: {workers} workers x batch {job.batch_size} = "
          f"{workers * job.batch_size} samples per BSP step; phases "
          f"{[(p.protocol, p.end_step) for p in spec.phases]}; checkpoint every "
          f"{job.checkpoint_frequency or 'end'}, eval every {job.eval_frequency or 'end'}",
          flush=True)
    notice = control.watch_preemption_notice()

    # Work that needs no server first: the servers are still importing TensorFlow, so this
    # overlaps their start instead of following it (start-up, trainer/startup.py).
    arrays = get_problem(job.problem).load(job.data_dir, job.seed)
    STARTUP.mark("data")

    # cluster: connect to the parameter servers and workers
    wait_for_servers(spec)
    STARTUP.mark("wait_servers")
    control.start_ps_watchdog(spec.cluster[layout.ROLE_PS])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec.cluster), task_type=layout.ROLE_CHIEF, task_id=0,
        rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    tfcompat.install()  # a hung worker must not stall the others (trainer/tfcompat.py)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    membership = Membership()
    logging.getLogger("tensorflow").addHandler(WorkerFailureEvents(membership))
    watch_rejoins(coordinator, membership)
    start_heartbeats(spec.cluster[layout.ROLE_WORKER])
    # a frozen PS stalls every worker at once
    start_heartbeats(spec.cluster[layout.ROLE_PS], job=layout.ROLE_PS)
    try:
        _train(spec, tf, strategy, coordinator, notice, arrays, membership)
    except Exception as exc:
        if "job:ps" in str(exc) or "PSUnavailable" in type(exc).__name__ or (
                control.unreachable(spec.cluster[layout.ROLE_PS])):
            control.ps_lost(f"{type(exc).__name__}: {exc}")
        raise


def _train(spec: TrainerSpec, tf: Any, strategy: Any, coordinator: Any,
           notice: control.NoticeWatcher, arrays: Any, membership: Membership) -> None:
    """Connect the data, build the model on the PS, restore, trace, train every phase,
    finish: each step named below."""
    STARTUP.mark("connect")
    args = worker_inputs(spec, coordinator, arrays)
    model, optimizer, v = build_on_ps(spec, tf, strategy, arrays)
    STARTUP.mark("model")
    checkpoints = Checkpoints(spec, tf, model, optimizer, v)
    STARTUP.mark("restore")
    steps = Steps(strategy, model, optimizer, spec.job, v, spec.stragglers, spec.num_workers)
    runners = make_runners(spec, coordinator, steps, args, membership)
    loop = TrainingLoop(spec, tf, v, optimizer, steps, runners, checkpoints, notice)
    loop.warm()
    STARTUP.mark("trace")
    loop.run_phases()
    loop.finish()


def worker_inputs(spec: TrainerSpec, coordinator: Any, arrays: Any) -> tuple[Any, Any]:
    """Every worker closure's first two arguments: the per-worker dataset's iterator (the
    arrays, loaded in `train`, are shipped inside the dataset function) and the worker ids."""
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: train_dataset(arrays, spec.job.batch_size)))
    return iterator, per_worker_ids(coordinator)


def build_on_ps(spec: TrainerSpec, tf: Any, strategy: Any,
                arrays: Any) -> tuple[Any, PSOptimizer, PSVariables]:
    """The model, the optimizer and the counters: all variables on the PS."""
    job = spec.job
    tf.keras.utils.set_random_seed(job.seed)
    with strategy.scope():
        model = build_model(job.model, job.hparam_set, arrays.input_shape, arrays.num_classes)
        optimizer = PSOptimizer(job, model.trainable_variables, strategy)
        v = create_ps_variables(strategy, optimizer)
    return model, optimizer, v


class Checkpoints:
    """The run's checkpoints: resume is the normal path (a fresh run just finds nothing to
    restore). Names, not addresses, identify variables: a new cluster at new addresses
    restores. Restores the newest that restores (`resumed_from`, None when fresh)."""

    def __init__(self, spec: TrainerSpec, tf: Any, model: Any, optimizer: PSOptimizer,
                 v: PSVariables) -> None:
        self.dir = Path(spec.layout.checkpoints)  # the checkpoint store the spec names
        self.checkpoint = tf.train.Checkpoint(
            model=model, step=v.global_step, phase=v.phase_index, bsp_updates=v.bsp_updates,
            bsp_gradients=v.bsp_gradients, budget_units=v.units_used,
            **optimizer.checkpoint_items())
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(self.dir),
                                                  max_to_keep=spec.job.keep_checkpoints)
        self.resumed_from = restore_newest(
            lambda path: self.checkpoint.restore(path).assert_existing_objects_matched(),
            checkpoint_paths(self.dir))
        if self.resumed_from:
            print(f"[chief] resumed from {self.resumed_from}", flush=True)
        (self.dir / DONE_MARKER).unlink(missing_ok=True)  # a longer run resumed from a done one
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "trainer_spec.json").write_text(json.dumps(spec.to_dict(), indent=2))

    def save(self, step: int) -> str:
        return self.manager.save(checkpoint_number=step)

    def mark_done(self, record: dict[str, Any]) -> None:
        """DONE tells the evaluator to finish: written, then renamed (the evaluator polls)."""
        done = self.dir / (DONE_MARKER + ".tmp")
        done.write_text(json.dumps(record) + "\n")
        done.replace(self.dir / DONE_MARKER)


def make_runners(spec: TrainerSpec, coordinator: Any, steps: Steps, args: tuple,
                 membership: Membership) -> dict[str, Any]:
    """One runner per protocol over the same steps and arguments; an explicit steps per
    closure is announced now, an automatic one when each runner has chosen it."""
    job, workers = spec.job, spec.num_workers

    def chosen(protocol: str) -> Callable[[int, float], None]:
        def emit(steps: int, step_time_s: float) -> None:
            events.emit(events.EVENT_STEPS_PER_CLOSURE, steps=steps, auto=True, protocol=protocol,
                        step_time_s=round(step_time_s, 5))
        return emit

    if job.steps_per_closure:
        events.emit(events.EVENT_STEPS_PER_CLOSURE, steps=job.steps_per_closure, auto=False,
                    protocol=None, step_time_s=None)
    return {"asp": AspRunner(coordinator, steps.asp, args, workers, job.steps_per_closure,
                             chosen("asp"), steps.asp_unrolled),
            "bsp": BspRunner(coordinator, steps, args, workers, job.steps_per_closure,
                             membership, chosen("bsp"))}


@dataclass
class Progress:
    """Where training stands: the global step, the budget units used, the protocol in force."""

    step: int
    units: int
    protocol: str = ""


class TrainingLoop:
    """The phases, their stretches between checkpoints, switches and the side channels."""

    def __init__(self, spec: TrainerSpec, tf: Any, v: PSVariables, optimizer: PSOptimizer,
                 steps: Steps, runners: dict[str, Any], checkpoints: Checkpoints,
                 notice: control.NoticeWatcher) -> None:
        self.spec, self.tf, self.v, self.optimizer = spec, tf, v, optimizer
        self.steps, self.runners, self.checkpoints, self.notice = (
            steps, runners, checkpoints, notice)
        job = spec.job
        self.budget = control.Budget(spec.phases, spec.num_workers)
        self.channel = control.ControlChannel(spec.control_path)
        self.save_every = [f for f in (job.checkpoint_frequency, job.eval_frequency) if f > 0]
        self.writer = tf.summary.create_file_writer(spec.layout.tensorboard("train"))
        self.meter = Meter(spec, int(v.global_step.numpy()), self.writer, lambda s: lr_at(
            s, job, float(optimizer.learning_rate.numpy())))
        step = self.read_step()
        units = int(v.units_used.numpy())
        self.progress = Progress(step, units if units >= 0 else self.budget.units_at_step(step))
        self.pending: list[str] = []  # checkpoint reasons requested by the side channels
        self.scheduled = ""  # the protocol the current phase schedules
        self.train_started = 0.0
        self.acting = 0.0  # when the loop could last act on a control request
        self.previous_phase: dict[str, Any] | None = None  # its `phase_end` fields
        self.bsp_warmed = False  # BSP's functions traced and run (`warm_bsp`)

    def read_step(self) -> int:
        return int(self.v.global_step.numpy())  # one small RPC to the PS

    def runner(self, protocol: str) -> Runner:
        return self.runners[protocol]

    def warm(self) -> None:
        """The steps' traces before the clock starts, so that the first step, a later switch
        and time-based events (straggler episodes, revocations) do not pay for them: the ASP
        step always (any run may be switched to it), the BSP group when the schedule has
        BSP."""
        self.runners["asp"].warm()
        # traced now, not mid-run (a hung worker, trainer/tfcompat.py)
        self.steps.asp_open(self.tf.constant(self.progress.step, self.tf.int64))
        if any(p.protocol == "bsp" for p in self.spec.phases):
            self.warm_bsp()

    def warm_bsp(self) -> None:
        """BSP's traces, once: before training when the schedule has BSP, else at the first
        switch to it (a control's), before its first step, so that no BSP function is
        first traced and registered during its groups (seen: a worker hung right after such
        a switch held the first `bsp_open`'s registration, and the chief with it)."""
        if not self.bsp_warmed:
            self.runners["bsp"].warm(groups=self.spec.job.steps_per_closure != 1)
            self.bsp_warmed = True

    def run_phases(self) -> None:
        self.train_started = self.acting = time.time()
        self.v.train_epoch.assign(self.train_started)
        self.channel.start()
        events.emit(events.EVENT_TRAIN_START, step=self.progress.step,
                    workers=self.spec.num_workers, resumed_from=self.checkpoints.resumed_from)
        self.meter.restart(self.progress.step)
        for index, phase in enumerate(self.spec.phases):
            if self.progress.units >= self.budget.ends[index]:
                continue  # finished before the checkpoint we resumed from
            self.run_phase(index, phase)

    def run_phase(self, index: int, phase: PhaseSpec) -> None:
        """Switch in place at the phase's start (two variable writes), then stretches until
        the phase's budget is used up."""
        progress = self.progress
        self.scheduled = phase.protocol
        switch_started = time.time()
        apply_phase_hparams(phase, self.spec, self.optimizer)
        self.v.phase_index.assign(index)
        phase_started, phase_start_step = time.time(), progress.step
        switched = self.switch_to(self.channel.state.protocol or self.scheduled)
        STARTUP.done("first_step")
        if self.previous_phase:
            events.emit(events.EVENT_PHASE_END, **self.previous_phase,
                        switch_s=round(switched - switch_started, 3))
        events.emit(events.EVENT_PHASE_START, protocol=progress.protocol, scheduled=self.scheduled,
                    step=phase_start_step, phase=index, hparams=phase.hparams)
        while progress.units < self.budget.ends[index]:
            wanted = self.channel.state.protocol or self.scheduled
            if wanted != progress.protocol:  # control override (or its release)
                self.switch_by_control(wanted)
                continue
            self.run_stretch(index)
        self.previous_phase = {"protocol": progress.protocol, "step": progress.step,
                               "phase": index, "wall_s": round(time.time() - phase_started, 3)}

    def switch_by_control(self, wanted: str) -> None:
        """Switch in place to the protocol the control file asks for; `switch_s` counts
        from `self.acting`, when the loop could first act on the request."""
        before, step = self.progress.protocol, self.progress.step
        switched = self.switch_to(wanted)
        events.emit(events.EVENT_PROTOCOL_SWITCH, step=step,
                    switch_s=round(switched - self.acting, 3),
                    detect_s=round(max(0.0, self.channel.seen_at - self.channel.mtime), 3),
                    reason="control", **{"from": before, "to": wanted})

    def run_stretch(self, index: int) -> None:
        """Train up to the next checkpoint/eval boundary or the budget's end (or until a
        side channel asks for action), then checkpoint as due."""
        progress, budget = self.progress, self.budget
        run = self.runner(progress.protocol)
        stop = self.next_stop(progress.step, progress.step + budget.steps_left(
            progress.units, index, progress.protocol))
        remaining, interrupted = stop - progress.step, False
        self.open_stretch(stop)
        while remaining > 0:
            scheduled_now, results = run(remaining)
            remaining -= scheduled_now
            self.meter.observe(self.read_step, results)  # reads step/loss only when due
            if self.side_channels():
                interrupted = remaining > 0
                break
        self.account(run.drain())
        last = index == len(self.spec.phases) - 1 and progress.units >= budget.ends[index]
        if not interrupted and not last and any(stop % f == 0 for f in self.save_every):
            self.save_checkpoint("schedule")  # the evaluator picks up every checkpoint
        for reason in dict.fromkeys(self.pending):
            self.save_checkpoint(reason)
        # a switch's switch_s counts from here
        self.acting = time.time() if self.pending else self.channel.seen_at
        self.pending.clear()

    def account(self, results: list[Any] | None = None) -> None:
        """After a drain: charge the steps applied since the last call to the budget."""
        self.meter.add(results or [])
        step = self.read_step()
        progress = self.progress
        progress.units += (step - progress.step) * self.budget.weight(progress.protocol)
        progress.step = step

    def save_checkpoint(self, reason: str) -> str:
        started = time.time()
        self.v.units_used.assign(self.progress.units)
        path = self.checkpoints.save(self.progress.step)
        events.emit(events.EVENT_CHECKPOINT, step=self.progress.step, path=path, reason=reason,
                    duration_s=round(time.time() - started, 3))
        return path

    def next_stop(self, step: int, end_step: int) -> int:
        return min([end_step] + [(step // f + 1) * f for f in self.save_every])

    def side_channels(self) -> bool:
        """Poll the control file and the notice; True when the loop must act now."""
        if self.notice.take():
            self.pending.append("notice")
        if self.channel.poll() is not None and self.channel.take_checkpoint_request():
            self.pending.append("control")
        return bool(self.pending) or (
            (self.channel.state.protocol or self.scheduled) != self.progress.protocol)

    def open_stretch(self, stop: int) -> None:
        """ASP: steps past global step `stop` are dropped on the PS, so a closure run twice
        (at-least-once, after a worker loss) or finished late (a hung worker's) never takes
        the run past its budget; BSP needs nothing (one update per global step)."""
        if self.progress.protocol == "asp":
            self.steps.asp_open(self.tf.constant(stop, self.tf.int64))

    def switch_to(self, protocol: str) -> float:
        """Run one step of `protocol` (the switch ends when it has applied one)."""
        if protocol == "bsp":
            self.warm_bsp()  # at a control's switch in an ASP-only schedule: counted in it
        self.progress.protocol = protocol
        self.open_stretch(self.progress.step + 1)
        _, results = self.runner(protocol)(1)
        self.account(results)
        return time.time()

    def finish(self) -> None:
        """Final checkpoint, then DONE tells the evaluator to finish."""
        progress = self.progress
        self.account(self.runners["asp"].drain())  # every closure, not those of hung workers
        if self.previous_phase:
            events.emit(events.EVENT_PHASE_END, **self.previous_phase, switch_s=0.0)
        final_path = self.save_checkpoint("final")
        self.meter.observe(self.read_step, [], force=True)
        updates, gradients = int(self.v.bsp_updates.numpy()), int(self.v.bsp_gradients.numpy())
        groups = self.runners["bsp"].groups
        if updates:
            print(f"[chief] bsp: {updates} updates from {gradients} gradients; {groups} "
                  "multi-step groups", flush=True)
        self.checkpoints.mark_done({"step": progress.step, "checkpoint": final_path,
                                    "bsp_updates": updates, "bsp_gradients": gradients,
                                    "bsp_groups": groups, "budget_units": progress.units})
        self.writer.flush()
        events.emit(events.EVENT_TRAIN_END, step=progress.step,
                    train_time_s=round(time.time() - self.train_started, 3))


def apply_phase_hparams(phase: PhaseSpec, spec: TrainerSpec, optimizer: PSOptimizer) -> None:
    """Set the phase's learning rate and momentum on the PS (job values when not given)."""
    optimizer.learning_rate.assign(phase.hparams.get("learning_rate", spec.job.learning_rate))
    if spec.job.optimizer == "momentum":
        optimizer.momentum.assign(phase.hparams.get("momentum", spec.job.momentum))


def wait_for_servers(spec: TrainerSpec, timeout_s: float = SERVER_WAIT_S) -> None:
    """Block until every ps and worker port accepts TCP, so a slow server start is not an
    error. Raises TimeoutError naming the addresses that never came up."""
    waiting = [a for job in (layout.ROLE_PS, layout.ROLE_WORKER) for a in spec.cluster[job]]
    deadline = time.time() + timeout_s
    while waiting and time.time() < deadline:
        host, _, port = waiting[0].rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            waiting.pop(0)
        except OSError:
            time.sleep(0.2)
    if waiting:
        raise TimeoutError(f"servers not reachable after {timeout_s:.0f} s: {waiting}")
