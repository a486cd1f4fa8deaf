"""The chief: coordinator and training loop for parameter-server training (ASP and BSP).

Run each role locally (same spec file, one terminal each; `trainer/spec.py` builds specs):

    python -m trainer --role ps        --index 0 --spec run/trainer_spec.json
    python -m trainer --role worker    --index 0 --spec run/trainer_spec.json   # and 1, 2, ...
    python -m trainer --role chief     --index 0 --spec run/trainer_spec.json   # this file
    python -m trainer --role evaluator --index 0 --spec run/trainer_spec.json

The model, the optimizer state and the step counters live on the parameter servers; the
chief only schedules closures (`ClusterCoordinator`) and never holds the weights. Both
protocols use the same PS variables, so a phase switch is an in-place change of the step
function and of two hyperparameter variables: no restart and no new coordinator.

- ASP: every closure computes a gradient on a worker and applies it to the PS directly.
- BSP: a global step schedules one accumulate closure per worker, waits for all of them
  (`coordinator.join()` is the barrier), then one apply on the PS averages the accumulated
  gradients by their count and updates the weights. A lost worker's closure is rescheduled
  on a survivor by the coordinator, so the barrier never waits on a dead worker; dividing
  by the count (not by the worker count) keeps the average right if that closure ran twice.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import events
from trainer.models import build_model
from trainer.optim import PSOptimizer, lr_at, lr_tensor
from trainer.problems import get_problem, train_dataset
from trainer.spec import PhaseSpec, TrainerSpec
from trainer.summaries import write_scalar

CLOSURES_PER_CHUNK_PER_WORKER = 8  # ASP closures scheduled between two host syncs
SERVER_WAIT_S = 120.0  # how long to wait for ps/worker ports before giving up
DONE_MARKER = "DONE"


def train(spec: TrainerSpec) -> None:
    """Train to `spec.job.train_steps`, resuming from the latest checkpoint if there is one."""
    import tensorflow as tf

    job, workers = spec.job, spec.num_workers
    run_dir = Path(spec.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    save_every = [f for f in (job.checkpoint_frequency, job.eval_frequency) if f > 0]
    print(f"[chief] run {spec.run_id}: {workers} workers x batch {job.batch_size} = "
          f"{workers * job.batch_size} samples per BSP step; phases "
          f"{[(p.protocol, p.end_step) for p in spec.phases]}; checkpoint every "
          f"{job.checkpoint_frequency or 'end'}, eval every {job.eval_frequency or 'end'}",
          flush=True)

    # cluster: connect to the parameter servers and workers
    wait_for_servers(spec)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    logging.getLogger("tensorflow").addHandler(WorkerFailureEvents())

    # data: arrays are loaded here and shipped inside the per-worker dataset function
    problem = get_problem(job.problem)
    arrays = problem.load(job.data_dir, job.seed)
    per_worker_iterator = iter(coordinator.create_per_worker_dataset(
        lambda: train_dataset(arrays, job.batch_size)))

    # model, optimizer and counters: all variables on the PS
    tf.keras.utils.set_random_seed(job.seed)
    with strategy.scope():
        model = build_model(job.model, job.hparam_set, arrays.input_shape, arrays.num_classes)
        params = model.trainable_variables
        optimizer = PSOptimizer(job, params, strategy)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        phase_index = tf.Variable(0, dtype=tf.int64, trainable=False, name="phase_index")
        bsp_updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="bsp_updates")
        bsp_gradients = tf.Variable(0, dtype=tf.int64, trainable=False, name="bsp_gradients")
        grad_count = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="grad_count")
        accumulators = []
        for p in optimizer.variables:
            with strategy.extended.colocate_vars_with(p):
                accumulators.append(tf.Variable(tf.zeros(p.shape, p.dtype), trainable=False))
    kernels = [v for v in params if len(v.shape) > 1]  # weight decay skips biases and BN

    # checkpoint: resume is the normal path (a fresh run just finds nothing to restore)
    checkpoint = tf.train.Checkpoint(
        model=model, step=global_step, phase=phase_index, bsp_updates=bsp_updates,
        bsp_gradients=bsp_gradients, **optimizer.checkpoint_items())
    manager = tf.train.CheckpointManager(checkpoint, str(ckpt_dir),
                                         max_to_keep=job.keep_checkpoints)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        print(f"[chief] resumed from {manager.latest_checkpoint}", flush=True)
    (ckpt_dir / DONE_MARKER).unlink(missing_ok=True)  # a longer run resumed from a done one
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / "trainer_spec.json").write_text(json.dumps(spec.to_dict(), indent=2))

    # step functions: the same PS variables, two protocols
    def loss_and_grads(batch: Any) -> tuple[Any, list[Any]]:
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits))
            if job.weight_decay:
                loss += job.weight_decay * tf.add_n([tf.nn.l2_loss(k) for k in kernels])
        return loss, tape.gradient(loss, params)

    def current_lr() -> Any:
        return lr_tensor(global_step, job, optimizer.learning_rate)

    @tf.function
    def asp_step(iterator: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            loss, grads = loss_and_grads(batch)
            optimizer.apply(grads, current_lr())
            global_step.assign_add(1)
            return loss
        return strategy.run(replica_fn, args=(next(iterator),))

    @tf.function
    def bsp_accumulate(iterator: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            loss, grads = loss_and_grads(batch)
            for acc, grad in zip(accumulators, grads, strict=True):
                acc.assign_add(grad)
            grad_count.assign_add(1.0)
            return loss
        return strategy.run(replica_fn, args=(next(iterator),))

    @tf.function
    def bsp_apply() -> None:
        # Runs on the chief, but every op is placed with its PS variable: one RPC round trip,
        # no weights or gradients travel. Auto control deps order read -> apply -> reset.
        count = grad_count.read_value()
        means = []
        for acc in accumulators:
            with tf.device(acc.device):
                means.append(acc.read_value() / count)
        optimizer.apply(means, current_lr())
        for acc in accumulators:
            acc.assign(tf.zeros_like(acc))
        grad_count.assign(0.0)
        bsp_gradients.assign_add(tf.cast(count, tf.int64))
        bsp_updates.assign_add(1)
        global_step.assign_add(1)

    # timing and metrics: TensorBoard and `step` events at most every report_every_s
    writer = tf.summary.create_file_writer(str(run_dir / "tensorboard" / "train"))
    meter = _Meter(spec, int(global_step.numpy()), writer, lambda s: lr_at(
        s, job, float(optimizer.learning_rate.numpy())))

    def save_checkpoint() -> str:
        started = time.time()
        step = int(global_step.numpy())
        path = manager.save(checkpoint_number=step)
        events.emit("checkpoint", step=step, path=path, duration_s=round(time.time() - started, 3))
        return path

    def next_stop(step: int, end_step: int) -> int:
        return min([end_step] + [(step // f + 1) * f for f in save_every])

    def read_step() -> int:
        return int(global_step.numpy())  # one small RPC to the PS

    start_step = read_step()
    train_started = time.time()
    events.emit("train_start", step=start_step, workers=workers)
    meter.restart(start_step)
    previous_phase: dict[str, Any] | None = None
    step = start_step
    for index, phase in enumerate(spec.phases):
        if step >= phase.end_step:
            continue  # finished before the checkpoint we resumed from

        # phase switch (BSP/ASP) at global-step targets: in place, two variable writes
        switch_started = time.time()
        apply_phase_hparams(phase, spec, optimizer)
        phase_index.assign(index)
        if phase.protocol == "bsp":
            run_steps = _bsp_runner(coordinator, bsp_accumulate, bsp_apply,
                                    per_worker_iterator, workers)
        else:
            run_steps = _asp_runner(coordinator, asp_step, per_worker_iterator, workers)
        phase_started, phase_start_step = time.time(), step
        _, loss = run_steps(1)  # the switch ends when the new protocol has applied a step
        if previous_phase:
            events.emit("phase_end", **previous_phase,
                        switch_s=round(time.time() - switch_started, 3))
        events.emit("phase_start", protocol=phase.protocol, step=phase_start_step, phase=index,
                    hparams=phase.hparams)
        step = read_step()

        while step < phase.end_step:
            # train step(s): schedule up to the next checkpoint/eval boundary or phase end
            stop = next_stop(step, phase.end_step)
            remaining = stop - step
            while remaining > 0:
                scheduled, loss = run_steps(remaining)
                remaining -= scheduled
                meter.observe(read_step, loss)  # reads step and loss only when a report is due
            coordinator.join()
            step = read_step()

            # evaluate and checkpoint: the evaluator picks up every saved checkpoint
            if stop < job.train_steps and any(stop % f == 0 for f in save_every):
                save_checkpoint()

        previous_phase = {"protocol": phase.protocol, "step": step, "phase": index,
                          "wall_s": round(time.time() - phase_started, 3)}

    # termination: final checkpoint, then DONE tells the evaluator to finish
    coordinator.join()
    if previous_phase:
        events.emit("phase_end", **previous_phase, switch_s=0.0)
    final_path = save_checkpoint()
    final_step = read_step()
    meter.observe(read_step, loss, force=True)
    if bsp_updates.numpy():
        print(f"[chief] bsp: {int(bsp_updates.numpy())} updates from "
              f"{int(bsp_gradients.numpy())} gradients", flush=True)
    done = ckpt_dir / (DONE_MARKER + ".tmp")  # write, then rename: the evaluator polls it
    done.write_text(json.dumps({"step": final_step, "checkpoint": final_path,
                                "bsp_updates": int(bsp_updates.numpy()),
                                "bsp_gradients": int(bsp_gradients.numpy())}) + "\n")
    done.replace(ckpt_dir / DONE_MARKER)
    writer.flush()
    events.emit("train_end", step=final_step, train_time_s=round(time.time() - train_started, 3))


def apply_phase_hparams(phase: PhaseSpec, spec: TrainerSpec, optimizer: PSOptimizer) -> None:
    """Set the phase's learning rate and momentum on the PS (job values when not given)."""
    optimizer.learning_rate.assign(phase.hparams.get("learning_rate", spec.job.learning_rate))
    if spec.job.optimizer == "momentum":
        optimizer.momentum.assign(phase.hparams.get("momentum", spec.job.momentum))


def _asp_runner(coordinator: Any, asp_step: Callable, iterator: Any,
                workers: int) -> Callable[[int], tuple[int, Any]]:
    """Schedule up to `n` ASP closures (one chunk); return (scheduled, last loss RemoteValue).

    Chunks are double-buffered: after scheduling chunk k we wait for the end of chunk k-1,
    so workers never idle while the queue (and so the step overshoot) stays bounded.
    """
    chunk = CLOSURES_PER_CHUNK_PER_WORKER * workers
    previous: list[Any] = []

    def run(n: int) -> tuple[int, Any]:
        count = min(n, chunk)
        last = None
        for _ in range(count):
            last = coordinator.schedule(asp_step, args=(iterator,))
        if previous:
            previous.pop().fetch()  # waits for the previous chunk; a tiny scalar transfer
        previous.append(last)
        if count == n:  # end of a stretch: drain so that the global step is exact
            coordinator.join()
            previous.clear()
        return count, last

    return run


def _bsp_runner(coordinator: Any, accumulate: Callable, apply: Callable, iterator: Any,
                workers: int) -> Callable[[int], tuple[int, Any]]:
    """Run one BSP global step: one gradient per worker, barrier, one apply on the PS."""

    def run(n: int) -> tuple[int, Any]:
        last = None
        for _ in range(workers):
            last = coordinator.schedule(accumulate, args=(iterator,))
        coordinator.join()  # the barrier; a dead worker's closure is rerun on a survivor
        apply()
        return 1, last

    return run


class _Meter:
    """Throttled `step` events and TensorBoard scalars.

    Fetching a loss forces a host sync with a worker, so it happens only when a report is due.
    A step may run twice after a worker loss: rates come from the PS global step, which
    counts what was applied, not what was scheduled.
    """

    def __init__(self, spec: TrainerSpec, step: int, writer: Any,
                 lr_of: Callable[[int], float]) -> None:
        self.every_s = spec.report_every_s
        self.writer, self.lr_of = writer, lr_of
        self.last_time, self.last_step = time.time(), step

    def restart(self, step: int) -> None:
        self.last_time, self.last_step = time.time(), step

    def observe(self, read_step: Callable[[], int], loss: Any, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last_time < self.every_s:
            return
        step = read_step()
        rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
        value = float(loss.fetch()) if loss is not None else None
        lr = float(f"{self.lr_of(step):.6g}")  # the PS holds float32; drop its noise digits
        events.emit("step", step=step, loss=value, steps_per_sec=round(rate, 2), lr=lr)
        with self.writer.as_default():
            if value is not None:
                write_scalar("loss", value, step)
            write_scalar("steps_per_sec", rate, step)
            write_scalar("learning_rate", lr, step)
        self.last_time, self.last_step = now, step


class WorkerFailureEvents(logging.Handler):
    """Turn the coordinator's "Worker ... failed with ..." log record into a
    `worker_failure` event. The coordinator recovers by itself (it reschedules the closure
    and re-creates the worker's dataset when it returns); this only makes the loss visible.
    """

    PATTERN = re.compile(r"/job:worker/replica:\d+/task:(\d+)")

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("Worker %s failed with"):
            return
        device = str(record.args[0]) if record.args else ""
        match = self.PATTERN.search(device)
        error = str(record.args[1]) if record.args and len(record.args) > 1 else ""
        events.emit("worker_failure", worker=int(match.group(1)) if match else device,
                    error=error[:300])


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
