"""Damaged checkpoints are skipped, not fatal (issue 12): real checkpoint files, truncated or
overwritten on disk, restored by the same code the chief and the evaluator use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_harness import make_spec

from trainer.checkpoints import checkpoint_paths, restore_newest
from trainer.events import parse_event
from trainer.spec import PhaseSpec


def _events(text: str, kind: str) -> list[dict]:
    found = [parse_event(line) for line in text.splitlines()]
    return [e for e in found if e and e["kind"] == kind]


def truncate(prefix: str) -> None:
    """Cut every data shard of a checkpoint in half, as a host lost mid-write leaves it."""
    for shard in Path(prefix).parent.glob(Path(prefix).name + ".data-*"):
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2])


def garble_index(prefix: str) -> None:
    index = Path(prefix + ".index")
    data = bytearray(index.read_bytes())
    data[len(data) // 3: len(data) // 3 + 16] = b"\xff" * 16
    index.write_bytes(bytes(data))


def test_newest_restorable_checkpoint_wins(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import tensorflow as tf

    value = tf.Variable(tf.zeros([1000]))
    ckpt = tf.train.Checkpoint(value=value)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=5)
    for step in (100, 200, 300):
        value.assign(tf.fill([1000], float(step)))
        manager.save(checkpoint_number=step)
    paths = checkpoint_paths(tmp_path)
    assert [p.rsplit("-", 1)[1] for p in paths] == ["300", "200", "100"]
    truncate(paths[0])
    garble_index(paths[1])
    value.assign(tf.zeros([1000]))

    used = restore_newest(lambda p: ckpt.restore(p).assert_existing_objects_matched(), paths)

    assert used == paths[2]
    assert float(value[0]) == 100.0  # the older checkpoint's values, not a partial mix
    skipped = _events(capsys.readouterr().out, "checkpoint_skipped")
    assert [s["path"] for s in skipped] == paths[:2]
    assert all(s["used"] == paths[2] and s["error"] for s in skipped), skipped


def test_nothing_restorable_is_a_fresh_start(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(value=tf.Variable(1.0))
    path = ckpt.save(str(tmp_path / "ckpt"))
    Path(path + ".index").write_bytes(b"")
    assert restore_newest(lambda p: ckpt.restore(p).assert_existing_objects_matched(),
                          [path]) is None
    assert _events(capsys.readouterr().out, "checkpoint_skipped")[0]["used"] is None


def test_evaluator_falls_back_from_an_unreadable_final_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tensorflow as tf

    from trainer.evaluator import run_evaluator
    from trainer.models import build_model
    from trainer.problems import get_problem

    spec = make_spec(tmp_path, 1, [PhaseSpec("asp", 20)])
    arrays = get_problem("digits").load(None, 0)
    model = build_model("cnn", "cnn_small", arrays.input_shape, arrays.num_classes)
    ckpt_dir = tmp_path / "checkpoints"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(ckpt_dir), 3)
    manager.save(checkpoint_number=10)
    final = manager.save(checkpoint_number=20)
    truncate(final)
    (ckpt_dir / "DONE").write_text(json.dumps({"step": 20, "checkpoint": final}))

    result = run_evaluator(spec, max_wait_s=30)

    assert result["final"] and result["step"] == 10 and result["checkpoint"].endswith("-10")
    skipped = _events(capsys.readouterr().out, "checkpoint_skipped")
    assert [s["path"] for s in skipped] == [final], skipped


def test_an_evaluator_that_was_away_evaluates_every_checkpoint_it_missed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Started (again) after the chief saved three checkpoints and finished: each of them is
    evaluated, oldest first, the last one labelled final; none is passed over."""
    import tensorflow as tf

    from trainer.evaluator import run_evaluator
    from trainer.models import build_model
    from trainer.problems import get_problem

    spec = make_spec(tmp_path, 1, [PhaseSpec("asp", 30)])
    arrays = get_problem("digits").load(None, 0)
    model = build_model("cnn", "cnn_small", arrays.input_shape, arrays.num_classes)
    ckpt_dir = tmp_path / "checkpoints"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(ckpt_dir), 3)
    for step in (10, 20):
        manager.save(checkpoint_number=step)
    final = manager.save(checkpoint_number=30)
    (ckpt_dir / "DONE").write_text(json.dumps({"step": 30, "checkpoint": final}))

    result = run_evaluator(spec, max_wait_s=30)

    evals = _events(capsys.readouterr().out, "eval")
    assert [(e["step"], e["final"]) for e in evals] == [(10, False), (20, False), (30, True)]
    assert result["final"] and result["checkpoint"] == final
