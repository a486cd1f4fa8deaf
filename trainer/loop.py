"""The chief: coordinator and training loop for parameter-server training (ASP and BSP).

Run each role locally (same spec file, one terminal each; `trainer/spec.py` builds specs):

    python -m trainer --role ps        --index 0 --spec run/trainer_spec.json
    python -m trainer --role worker    --index 0 --spec run/trainer_spec.json   # and 1, 2, ...
    python -m trainer --role chief     --index 0 --spec run/trainer_spec.json   # this file
    python -m trainer --role evaluator --index 0 --spec run/trainer_spec.json

The model, the optimizer state and the step counters live on the parameter servers; the
chief only schedules closures (`ClusterCoordinator`) and never holds the weights. Both
protocols (trainer/protocols.py) use the same PS variables, so a switch is an in-place
change of the step function and of two hyperparameter variables: no restart, no new
coordinator. It happens at a phase boundary, or when the orchestrator overrides the
protocol through the control file (trainer/control.py).

Budget: a phase's budget is in BSP-equivalent steps (a BSP global step = 1, an ASP global
step = 1/N for the N workers of the spec; `control.Budget`). A phase ends when its budget is
used up, so without overrides the global-step targets in `spec.phases` are hit exactly. The
units used are checkpointed, so a resumed run continues the same accounting.

Events (besides step/worker_steps/worker_failure/worker_rejoined, trainer/meter.py,
`startup`, trainer/startup.py, and `worker_unresponsive`, trainer/heartbeat.py):
- `train_start` `{"step", "workers", "resumed_from"}`: the step resumed from (0 when fresh)
  and the checkpoint path (null when fresh): the newest that restores; each newer damaged
  one is reported first as `checkpoint_skipped` (trainer/checkpoints.py).
- `phase_start` `{"protocol", "scheduled", "step", "phase", "hparams"}` (`protocol` is the one
  in force, `scheduled` the phase's own); `phase_end` `{"protocol", "step", "phase",
  "wall_s", "switch_s"}`.
- `protocol_switch` `{"from", "to", "step", "switch_s", "detect_s", "reason": "control"}`.
- `steps_per_closure` `{"steps", "auto", "protocol", "step_time_s"}`: global steps per
  worker closure, fixed by the job for both protocols (`auto` false, `protocol` null) or
  chosen per protocol from its first steps' median on-worker step time (trainer/protocols.py).
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
from pathlib import Path
from typing import Any

from trainer import control, events, layout, tfcompat
from trainer.checkpoints import checkpoint_paths, restore_newest
from trainer.heartbeat import start_heartbeats
from trainer.meter import Meter, WorkerFailureEvents, watch_rejoins
from trainer.models import build_model
from trainer.optim import PSOptimizer, lr_at
from trainer.problems import get_problem, train_dataset
from trainer.protocols import (
    BSP_CLOSED,
    Membership,
    asp_runner,
    bsp_runner,
    build_steps,
    per_worker_ids,
)
from trainer.spec import PhaseSpec, TrainerSpec
from trainer.startup import STARTUP, import_tensorflow

SERVER_WAIT_S = 120.0  # how long to wait for ps/worker ports before giving up
DONE_MARKER = layout.DONE_MARKER


class _Vars:
    """The PS variables shared by both protocols (attributes set in `train`)."""


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
    control.start_ps_watchdog(spec.cluster["ps"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    tfcompat.install()  # a hung worker must not stall the others (trainer/tfcompat.py)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    membership = Membership()
    logging.getLogger("tensorflow").addHandler(WorkerFailureEvents(membership))
    watch_rejoins(coordinator, membership)
    start_heartbeats(spec.cluster["worker"])
    try:
        _train(spec, tf, strategy, coordinator, notice, arrays, membership)
    except Exception as exc:
        if "job:ps" in str(exc) or "PSUnavailable" in type(exc).__name__ or (
                control.unreachable(spec.cluster["ps"])):
            control.ps_lost(f"{type(exc).__name__}: {exc}")
        raise


def _train(spec: TrainerSpec, tf: Any, strategy: Any, coordinator: Any,
           notice: control.NoticeWatcher, arrays: Any, membership: Membership) -> None:
    job, workers = spec.job, spec.num_workers
    ckpt_dir = Path(spec.layout.checkpoints)  # the checkpoint store the spec names
    save_every = [f for f in (job.checkpoint_frequency, job.eval_frequency) if f > 0]
    budget = control.Budget(spec.phases, workers)
    channel = control.ControlChannel(spec.control_path)

    # data: the arrays (loaded in `train`) are shipped inside the per-worker dataset function
    STARTUP.mark("connect")
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: train_dataset(arrays, job.batch_size)))
    worker_ids = per_worker_ids(coordinator, workers)

    # model, optimizer and counters: all variables on the PS
    tf.keras.utils.set_random_seed(job.seed)
    v = _Vars()
    with strategy.scope():
        model = build_model(job.model, job.hparam_set, arrays.input_shape, arrays.num_classes)
        optimizer = PSOptimizer(job, model.trainable_variables, strategy)

        def counter(name: str, value: Any = 0, dtype: Any = tf.int64) -> Any:
            return tf.Variable(value, dtype=dtype, trainable=False, name=name)

        v.global_step, v.phase_index = counter("global_step"), counter("phase_index")
        v.bsp_updates, v.bsp_gradients = counter("bsp_updates"), counter("bsp_gradients")
        v.units_used = counter("budget_units_used", -1)  # -1: not in an old checkpoint
        v.grad_count = counter("grad_count", 0.0, tf.float32)
        v.train_epoch = counter("train_epoch", 0.0, tf.float64)  # not checkpointed
        # the BSP group's state (trainer/protocols.py), not checkpointed either
        v.bsp_group, v.bsp_stop = counter("bsp_group", BSP_CLOSED), counter("bsp_stop")
        v.bsp_joined, v.bsp_tickets = counter("bsp_joined"), counter("bsp_tickets")
        # ASP's step tickets and the stretch's last one (trainer/protocols.py), not
        # checkpointed: every stretch sets them
        v.asp_tickets, v.asp_stop = counter("asp_tickets"), counter("asp_stop")
        v.accumulators = []  # not checkpointed: a restarted cluster starts them at zero
        for p in optimizer.variables:
            with strategy.extended.colocate_vars_with(p):
                v.accumulators.append(tf.Variable(tf.zeros(p.shape, p.dtype),
                                                  trainable=False))

    STARTUP.mark("model")

    # checkpoint: resume is the normal path (a fresh run just finds nothing to restore).
    # Names, not addresses, identify variables: a new cluster at new addresses restores.
    checkpoint = tf.train.Checkpoint(
        model=model, step=v.global_step, phase=v.phase_index, bsp_updates=v.bsp_updates,
        bsp_gradients=v.bsp_gradients, budget_units=v.units_used,
        **optimizer.checkpoint_items())
    manager = tf.train.CheckpointManager(checkpoint, str(ckpt_dir),
                                         max_to_keep=job.keep_checkpoints)
    resumed_from = restore_newest(
        lambda path: checkpoint.restore(path).assert_existing_objects_matched(),
        checkpoint_paths(ckpt_dir))
    if resumed_from:
        print(f"[chief] resumed from {resumed_from}", flush=True)
    (ckpt_dir / DONE_MARKER).unlink(missing_ok=True)  # a longer run resumed from a done one
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "trainer_spec.json").write_text(json.dumps(spec.to_dict(), indent=2))

    STARTUP.mark("restore")
    steps = build_steps(strategy, model, optimizer, job, v, spec.stragglers, workers)

    def chosen(protocol: str) -> Callable[[int, float], None]:
        def emit(steps: int, step_time_s: float) -> None:
            events.emit("steps_per_closure", steps=steps, auto=True, protocol=protocol,
                        step_time_s=round(step_time_s, 5))
        return emit

    if job.steps_per_closure:
        events.emit("steps_per_closure", steps=job.steps_per_closure, auto=False,
                    protocol=None, step_time_s=None)
    args = (iterator, worker_ids)
    runners = {"asp": asp_runner(coordinator, steps.asp, args, workers,
                                 job.steps_per_closure, chosen("asp"), steps.asp_unrolled),
               "bsp": bsp_runner(coordinator, steps, args, workers, job.steps_per_closure,
                                 membership, chosen("bsp"))}
    writer = tf.summary.create_file_writer(spec.layout.tensorboard("train"))
    meter = Meter(spec, int(v.global_step.numpy()), writer, lambda s: lr_at(
        s, job, float(optimizer.learning_rate.numpy())))

    def read_step() -> int:
        return int(v.global_step.numpy())  # one small RPC to the PS

    class P:  # progress: global step, budget units used, protocol in force
        step = read_step()
        units = int(v.units_used.numpy())
        protocol = ""

    if P.units < 0:
        P.units = budget.units_at_step(P.step)

    def account(results: list[Any] | None = None) -> None:
        """After a drain: charge the steps applied since the last call to the budget."""
        meter.add(results or [])
        step = read_step()
        P.units += (step - P.step) * budget.weight(P.protocol)
        P.step = step

    def save_checkpoint(reason: str) -> str:
        started = time.time()
        v.units_used.assign(P.units)
        path = manager.save(checkpoint_number=P.step)
        events.emit("checkpoint", step=P.step, path=path, reason=reason,
                    duration_s=round(time.time() - started, 3))
        return path

    def next_stop(step: int, end_step: int) -> int:
        return min([end_step] + [(step // f + 1) * f for f in save_every])

    pending: list[str] = []  # checkpoint reasons requested by the side channels

    def side_channels() -> bool:
        """Poll the control file and the notice; True when the loop must act now."""
        if notice.take():
            pending.append("notice")
        if channel.poll() is not None and channel.take_checkpoint_request():
            pending.append("control")
        return bool(pending) or (channel.state.protocol or scheduled) != P.protocol

    def open_stretch(stop: int) -> None:
        """ASP: steps past global step `stop` are dropped on the PS, so a closure run twice
        (at-least-once, after a worker loss) or finished late (a hung worker's) never takes
        the run past its budget; BSP needs nothing (one update per global step)."""
        if P.protocol == "asp":
            steps.asp_open(tf.constant(stop, tf.int64))

    def switch_to(protocol: str) -> float:
        """Run one step of `protocol` (the switch ends when it has applied one)."""
        P.protocol = protocol
        open_stretch(P.step + 1)
        _, results = runners[protocol](1)
        account(results)
        return time.time()

    # The steps' traces before the clock starts, so that the first step, a later switch and
    # time-based events (straggler episodes, revocations) do not pay for them: the ASP step
    # always (any run may be switched to it), the BSP group when the schedule has BSP.
    runners["asp"].warm()  # type: ignore[attr-defined]
    steps.asp_open(tf.constant(P.step, tf.int64))  # traced now (a hung worker, tfcompat.py)
    if any(p.protocol == "bsp" for p in spec.phases):
        runners["bsp"].warm(groups=job.steps_per_closure != 1)  # type: ignore[attr-defined]
    STARTUP.mark("trace")
    train_started = time.time()
    v.train_epoch.assign(train_started)
    start_step = P.step
    channel.start()
    events.emit("train_start", step=start_step, workers=workers, resumed_from=resumed_from)
    meter.restart(start_step)
    previous_phase: dict[str, Any] | None = None
    acting = train_started
    for index, phase in enumerate(spec.phases):
        if P.units >= budget.ends[index]:
            continue  # finished before the checkpoint we resumed from
        scheduled = phase.protocol

        # phase switch at the phase's budget end: in place, two variable writes
        switch_started = time.time()
        apply_phase_hparams(phase, spec, optimizer)
        v.phase_index.assign(index)
        phase_started, phase_start_step = time.time(), P.step
        switched = switch_to(channel.state.protocol or scheduled)
        STARTUP.done("first_step")
        if previous_phase:
            events.emit("phase_end", **previous_phase,
                        switch_s=round(switched - switch_started, 3))
        events.emit("phase_start", protocol=P.protocol, scheduled=scheduled,
                    step=phase_start_step, phase=index, hparams=phase.hparams)

        while P.units < budget.ends[index]:
            wanted = channel.state.protocol or scheduled
            if wanted != P.protocol:  # control override (or its release): switch in place
                before, step = P.protocol, P.step
                switched = switch_to(wanted)
                events.emit("protocol_switch", step=step, switch_s=round(switched - acting, 3),
                            detect_s=round(max(0.0, channel.seen_at - channel.mtime), 3),
                            reason="control", **{"from": before, "to": wanted})
                continue
            # train step(s): schedule up to the next checkpoint/eval boundary or budget end
            run = runners[P.protocol]
            stop = next_stop(P.step, P.step + budget.steps_left(P.units, index, P.protocol))
            remaining, interrupted = stop - P.step, False
            open_stretch(stop)
            while remaining > 0:
                scheduled_now, results = run(remaining)
                remaining -= scheduled_now
                meter.observe(read_step, results)  # reads step/loss only when a report is due
                if side_channels():
                    interrupted = remaining > 0
                    break
            account(run.drain())
            last = index == len(spec.phases) - 1 and P.units >= budget.ends[index]
            if not interrupted and not last and any(stop % f == 0 for f in save_every):
                save_checkpoint("schedule")  # the evaluator picks up every checkpoint
            for reason in dict.fromkeys(pending):
                save_checkpoint(reason)
            acting = time.time() if pending else channel.seen_at  # switch_s starts here
            pending.clear()

        previous_phase = {"protocol": P.protocol, "step": P.step, "phase": index,
                          "wall_s": round(time.time() - phase_started, 3)}

    # termination: final checkpoint, then DONE tells the evaluator to finish
    account(runners["asp"].drain())  # every closure, but not those of hung workers
    if previous_phase:
        events.emit("phase_end", **previous_phase, switch_s=0.0)
    final_path = save_checkpoint("final")
    meter.observe(read_step, [], force=True)
    updates, gradients = int(v.bsp_updates.numpy()), int(v.bsp_gradients.numpy())
    groups = runners["bsp"].groups  # type: ignore[attr-defined]
    if updates:
        print(f"[chief] bsp: {updates} updates from {gradients} gradients; {groups} "
              "multi-step groups", flush=True)
    done = ckpt_dir / (DONE_MARKER + ".tmp")  # write, then rename: the evaluator polls it
    done.write_text(json.dumps({"step": P.step, "checkpoint": final_path,
                                "bsp_updates": updates, "bsp_gradients": gradients,
                                "bsp_groups": groups,
                                "budget_units": P.units}) + "\n")
    done.replace(ckpt_dir / DONE_MARKER)
    writer.flush()
    events.emit("train_end", step=P.step, train_time_s=round(time.time() - train_started, 3))


def apply_phase_hparams(phase: PhaseSpec, spec: TrainerSpec, optimizer: PSOptimizer) -> None:
    """Set the phase's learning rate and momentum on the PS (job values when not given)."""
    optimizer.learning_rate.assign(phase.hparams.get("learning_rate", spec.job.learning_rate))
    if spec.job.optimizer == "momentum":
        optimizer.momentum.assign(phase.hparams.get("momentum", spec.job.momentum))


def wait_for_servers(spec: TrainerSpec, timeout_s: float = SERVER_WAIT_S) -> None:
    """Block until every ps and worker port accepts TCP, so a slow server start is not an
    error. Raises TimeoutError naming the addresses that never came up."""
    waiting = [a for job in ("ps", "worker") for a in spec.cluster[job]]
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
