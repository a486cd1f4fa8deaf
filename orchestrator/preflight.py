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

#: Providers that run on this machine (or nowhere): a preflight would only repeat the run's start.
LOCAL_PROVIDERS = ("local", "sim")
#: Seconds the local step may take (model build + one step; ResNet-32 on 2 CPU cores ≈ 20 s).
PREFLIGHT_TIMEOUT_S = 300.0

_STEP = """
import json, sys
import numpy as np
import tensorflow as tf
from trainer import models, problems
job = json.loads(sys.argv[1])
data = problems.get_problem(job["problem"]).load(job.get("data_dir"), job["seed"])
batch = job["batch_size"]
x = data.x_train[:batch].astype("float32")
if data.mean is not None:
    x = (x - data.mean) / data.std
model = models.build_model(job["model"], job["hparam_set"], data.input_shape, data.num_classes)
opt = tf.keras.optimizers.SGD(job["learning_rate"])
with tf.GradientTape() as tape:
    logits = model(x, training=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        data.y_train[:batch], logits, from_logits=True))
grads = tape.gradient(loss, model.trainable_variables)
opt.apply_gradients(zip(grads, model.trainable_variables))
if not np.isfinite(float(loss)):
    raise FloatingPointError(f"loss is {float(loss)} after one step")
print(f"preflight ok: one step of {job['model']}/{job['hparam_set']}, loss {float(loss):.4f}")
"""


class PreflightError(RuntimeError):
    """The job failed its local training step; the message is the trainer's error."""


def run_preflight(cfg: ExperimentConfig, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> str:
    """Train one step of ``cfg.job`` locally; returns the step's report line.

    Raises PreflightError with the last line of the trainer's error (and the job fields that
    shaped it) when the step fails or does not finish within ``timeout_s``."""
    job = {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(cfg.job).items()}
    try:
        proc = subprocess.run([sys.executable, "-c", _STEP, json.dumps(job)], capture_output=True,
                              text=True, timeout=timeout_s)
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
