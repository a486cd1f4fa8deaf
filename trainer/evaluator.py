"""The evaluator role: a sidecar that evaluates each new checkpoint on the held-out split.

It needs no parameter server: it restores the weights into a local copy of the model, so it
keeps working while the cluster is being replaced. It exits 0 after evaluating the final
checkpoint, which the chief names in `DONE` in the checkpoint store (`spec.layout.done`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainer import events, layout
from trainer.checkpoints import checkpoint_paths, restore_newest
from trainer.models import build_model
from trainer.problems import eval_dataset, get_problem
from trainer.spec import TrainerSpec
from trainer.startup import STARTUP, import_tensorflow
from trainer.summaries import write_scalar

POLL_INTERVAL_S = 0.5
DONE_MARKER = layout.DONE_MARKER  # written by the chief after the final save


def run_evaluator(spec: TrainerSpec, max_wait_s: float | None = None) -> dict[str, Any]:
    """Poll, evaluate every unseen checkpoint oldest first, repeat; return the final `eval`.

    Every checkpoint, not only the newest: an evaluator started again after a loss (or one
    slower than the chief's checkpoints) evaluates those it missed that still exist, oldest
    first. One it cannot evaluate is reported as `eval_skipped` `{"step", "checkpoint",
    "reason"}`: deleted by the chief's rotation (`job.keep_checkpoints`) before its turn, or
    damaged (`checkpoint_skipped` says why). The run's summary lists every checkpoint never
    evaluated (`eval_skipped`, orchestrator/rundir/record.py), those deleted while no evaluator ran
    included. Raises TimeoutError after `max_wait_s` without a DONE marker (None = wait for
    ever, the orchestrator stops us).
    """
    tf = import_tensorflow()
    job = spec.job
    ckpt_dir = Path(spec.layout.checkpoints)
    arrays = get_problem(job.problem).load(job.data_dir, job.seed)
    model = build_model(job.model, job.hparam_set, arrays.input_shape, arrays.num_classes)
    dataset = eval_dataset(arrays)
    writer = tf.summary.create_file_writer(spec.layout.tensorboard("eval"))
    events.emit(events.EVENT_READY, address=None)
    STARTUP.done("model")

    @tf.function
    def batch_metrics(images: Any, labels: Any) -> tuple[Any, Any]:
        logits = model(images, training=False)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                            logits=logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                                                 labels), tf.float32))
        return loss, correct

    def evaluate(path: str, step: int, final: bool) -> dict[str, Any]:
        # expect_partial: the checkpoint also holds optimizer slots and counters we don't need
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
        total_loss = total_correct = 0.0
        for images, labels in dataset:
            loss, correct = batch_metrics(images, labels)
            total_loss += float(loss)
            total_correct += float(correct)
        n = len(arrays.y_test)
        accuracy, mean_loss = total_correct / n, total_loss / n
        with writer.as_default():
            write_scalar("accuracy", accuracy, step)
            write_scalar("loss", mean_loss, step)
        writer.flush()
        return events.emit(events.EVENT_EVAL, step=step, accuracy=round(accuracy, 5),
                           loss=round(mean_loss, 5), final=final, checkpoint=path)

    def evaluate_newest(candidates: list[str], final: bool) -> dict[str, Any] | None:
        """Evaluate the newest candidate that restores (damaged ones are skipped)."""
        result: dict[str, Any] = {}

        def run(path: str) -> None:
            result.update(evaluate(path, _step_of(path), final))

        return result if restore_newest(run, candidates) else None

    handled: set[int] = set()  # steps evaluated or skipped by this process

    def evaluate_pending(upto: int, final_step: int | None) -> dict[str, Any] | None:
        """Each checkpoint up to step `upto` not handled yet, oldest first (`final_step`
        excluded: the final evaluation labels it); the last `eval` event, if any."""
        last = None
        for path in reversed(checkpoint_paths(ckpt_dir)):
            step = _step_of(path)
            if step > upto or step in handled or step == final_step:
                continue
            handled.add(step)
            result = evaluate_newest([path], final=False)
            if result is not None:
                last = result
            elif not Path(f"{path}.index").exists():
                events.emit(events.EVENT_EVAL_SKIPPED, step=step, checkpoint=path,
                            reason="deleted by the chief's rotation (job.keep_checkpoints) "
                                   "before the evaluator reached it")
            else:
                events.emit(events.EVENT_EVAL_SKIPPED, step=step, checkpoint=path,
                            reason="damaged (see checkpoint_skipped)")
        return last

    started, last_path, last_event = time.time(), None, None
    while True:
        done = _read_done(ckpt_dir)
        if done is not None:
            final_step = _step_of(done["checkpoint"])
            pending = evaluate_pending(final_step, final_step)  # the missed ones first
            if pending is not None:
                last_event, last_path = pending, pending.get("checkpoint")
            if last_event and last_path == done["checkpoint"]:  # already evaluated: re-label
                fields = {k: v for k, v in last_event.items()
                          if k not in ("kind", "time", "role", "index", "final")}
                return events.emit(events.EVENT_EVAL, **fields, final=True)
            final = done["checkpoint"]
            older = [p for p in checkpoint_paths(ckpt_dir) if _step_of(p) < _step_of(final)]
            result = evaluate_newest([final, *older], final=True)
            if result is None:
                raise RuntimeError(f"no checkpoint in {ckpt_dir} restores (see the "
                                   "checkpoint_skipped events)")
            return result
        latest = tf.train.latest_checkpoint(str(ckpt_dir))
        if latest:  # up to the newest the chief has finished writing (its state file)
            result = evaluate_pending(_step_of(latest), None)
            if result is not None:
                last_event, last_path = result, result.get("checkpoint")
        if max_wait_s is not None and time.time() - started > max_wait_s:
            raise TimeoutError(f"no {DONE_MARKER} in {ckpt_dir} after {max_wait_s:.0f} s")
        time.sleep(POLL_INTERVAL_S)


def _read_done(ckpt_dir: Path) -> dict[str, Any] | None:
    path = ckpt_dir / DONE_MARKER
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None  # caught mid-write; the next poll reads it whole


def _step_of(checkpoint_path: str) -> int:
    """The chief saves with checkpoint_number = global step, so `ckpt-1200` is step 1200."""
    return int(checkpoint_path.rsplit("-", 1)[-1])
