"""Preflight: one training step of the exact job on this machine before paying for servers.

Most failed training jobs on shared clusters fail in their first iteration from a user error (a
model/batch that does not fit, a wrong problem name, unreadable data), so before a remote
provider acquires anything the job's model, problem and batch train one step locally, in a
subprocess (TensorFlow stays out of the orchestrator's process), and the run fails fast with the
trainer's own error. ``preflight: false`` skips it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

from orchestrator.config.schema import ExperimentConfig

#: Seconds the local step may take (model build + one step; ResNet-32 on 2 CPU cores ≈ 20 s).
PREFLIGHT_TIMEOUT_S = 300.0

_STEP = """
import json, sys, time
started = time.perf_counter()
import numpy as np
import tensorflow as tf
from trainer import models, problems
job, timed = json.loads(sys.argv[1]), int(sys.argv[2])
data = problems.get_problem(job["problem"]).load(job.get("data_dir"), job["seed"])
batch = job["batch_size"]
x = data.x_train[:batch].astype("float32")
if data.mean is not None:
    x = (x - data.mean) / data.std
y = data.y_train[:batch]
model = models.build_model(job["model"], job["hparam_set"], data.input_shape, data.num_classes)
opt = tf.keras.optimizers.SGD(job["learning_rate"])
def step():
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss
loss = step()
if not np.isfinite(float(loss)):
    raise FloatingPointError(f"loss is {float(loss)} after one step")
print(f"preflight ok: one step of {job['model']}/{job['hparam_set']}, loss {float(loss):.4f}")
if timed:  # calibration: the benchmarks' single-process loop, and one checkpoint write
    import statistics, tempfile
    from trainer.baseline import measure_single_process
    from trainer.spec import JobSpec
    ready = time.perf_counter() - started
    rate = measure_single_process(JobSpec(**job), timed)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    writes = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            t1 = time.perf_counter()
            ckpt.write(f"{tmp}/ckpt-{i}")
            writes.append(time.perf_counter() - t1)
    print(json.dumps({"step_s": 1.0 / rate, "steps_timed": timed, "ready_s": ready,
                      "checkpoint_s": statistics.median(writes),
                      "weights": int(model.count_params())}))
"""


class PreflightError(RuntimeError):
    """The job failed its local training step; the message is the trainer's error."""


def run_preflight(cfg: ExperimentConfig, timeout_s: float = PREFLIGHT_TIMEOUT_S,
                  timed_steps: int = 0) -> str:
    """Train one step of ``cfg.job`` locally; returns the step's report line.

    With ``timed_steps`` it then times that many steps of the benchmarks' single-process loop
    (``trainer.baseline``) and three checkpoint writes, and returns their JSON line instead (the calibration of
    :mod:`orchestrator.simulate.calibrate`). Raises PreflightError with the last line of the
    trainer's error (and the job fields that shaped it) when the step fails or does not finish
    within ``timeout_s``."""
    job = json.dumps(asdict(cfg.job))  # the trainer spec's ``job`` text (Contract 1)
    try:
        proc = subprocess.run([sys.executable, "-c", _STEP, job, str(timed_steps)],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"preflight: one training step of {cfg.job.model}/"
                             f"{cfg.job.hparam_set} took over {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise PreflightError(f"preflight: one local training step of model={cfg.job.model} "
                             f"hparam_set={cfg.job.hparam_set} problem={cfg.job.problem} "
                             f"batch_size={cfg.job.batch_size} failed: "
                             f"{lines[-1] if lines else f'exit {proc.returncode}'} "
                             "(skip with preflight=false)")
    return proc.stdout.strip().splitlines()[-1]
