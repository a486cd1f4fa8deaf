"""TensorBoard, as installed by the project's setup, reads a real run's event files.

One small run of the embedded default through the real CLI, then two readers: TensorBoard's own
``EventAccumulator`` (every tag the README promises, tagged for the scalars dashboard, with values
that agree with the run's config and summary), and the ``tensorboard`` program itself, started
on loopback as ``tensorboard --logdir`` would be and asked over HTTP for its scalar tags.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tf_cluster]

LEARNING_RATE = 0.03  # not the default: the value in the event files must come from the config
TRAIN_TAGS = {"loss", "steps_per_sec", "learning_rate", "worker_step_time_s/0",
              "worker_step_time_s/1"}
EVAL_TAGS = {"accuracy", "loss"}
SERVE_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def run_dir(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tb") / "run"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "+experiment=digits_local", "progress=false",
         "job.train_steps=300", "job.eval_frequency=150", f"job.learning_rate={LEARNING_RATE}",
         f"hydra.run.dir={out}"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _scalars(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """Every tag's (step, value) series, read by TensorBoard's own reader, and the tags that
    are not marked for the scalars dashboard."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(str(logdir),
                                             size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    series, not_scalars = {}, set()
    for tag in acc.Tags()[event_accumulator.TENSORS]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            not_scalars.add(tag)
        series[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                       for e in acc.Tensors(tag)]
    return series, not_scalars


def test_event_files_hold_the_promised_scalars(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    train, odd = _scalars(run_dir / "tensorboard" / "train")
    assert set(train) >= TRAIN_TAGS, sorted(train)
    assert not odd, f"not shown as scalars: {odd}"
    rates = [v for _, v in train["learning_rate"]]
    assert rates == pytest.approx([LEARNING_RATE] * len(rates))  # constant schedule
    speeds = [v for _, v in train["steps_per_sec"]]
    assert min(speeds) >= 0 and max(speeds) > 0  # a final report may come after the last step
    assert all(v > 0 for tag in ("worker_step_time_s/0", "worker_step_time_s/1")
               for _, v in train[tag])
    assert all(math.isfinite(v) for _, v in train["loss"])
    assert max(s for s, _ in train["steps_per_sec"]) <= summary["global_steps"]

    evals, odd = _scalars(run_dir / "tensorboard" / "eval")
    assert set(evals) >= EVAL_TAGS, sorted(evals)
    assert not odd, f"not shown as scalars: {odd}"
    assert len(evals["accuracy"]) >= 2  # at step 150 and at the end
    last_step, last_accuracy = max(evals["accuracy"])
    assert last_step >= 300
    assert last_accuracy == pytest.approx(summary["final_accuracy"], abs=1e-4)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_tensorboard_program_serves_the_run(run_dir: Path) -> None:
    """What `make tensorboard` starts: the console script next to this interpreter."""
    program = Path(sys.executable).parent / "tensorboard"
    assert program.exists(), f"{program} missing: the cpu/gpu extra installs tensorboard"
    proc = subprocess.Popen([str(program), "--logdir", str(run_dir), "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        url, seen = None, []
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"TensorBoard \S+ at (http://\S+?)/? ", line)
            url = match.group(1) if match else None
        assert url, "tensorboard did not start:\n" + "".join(seen[-20:])
        tags: dict = {}
        while time.monotonic() < deadline:  # the data server loads the logdir in the background
            tags = _get_json(f"{url}/data/plugin/scalars/tags")
            if set(tags.get("tensorboard/eval", {})) >= EVAL_TAGS:
                break
            time.sleep(1)
        assert set(tags.get("tensorboard/train", {})) >= TRAIN_TAGS, tags
        assert set(tags.get("tensorboard/eval", {})) >= EVAL_TAGS, tags
        query = urllib.parse.urlencode({"run": "tensorboard/eval", "tag": "accuracy"})
        points = _get_json(f"{url}/data/plugin/scalars/scalars?{query}")
        assert len(points) >= 2 and all(0.0 <= p[2] <= 1.0 for p in points)  # [time, step, value]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
