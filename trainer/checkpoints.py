"""Restore the newest checkpoint that restores: a damaged one is skipped, never fatal.

A host lost mid-write or a half-uploaded object leaves a checkpoint whose index or data
file is truncated or corrupt (TensorFlow's bundle checksums catch it as DataLossError, a
cut index as a parse error). The chief and the evaluator both go on with the next older
checkpoint and record `checkpoint_skipped` `{"path", "error", "used"}` (`used`: the one
restored instead, null if none). A network error is not a damaged checkpoint: it is
re-raised (the chief's parameter-server loss path handles it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import events

_NUMBERED = re.compile(r"^(.*-(\d+))\.index$")


def checkpoint_paths(ckpt_dir: str | Path) -> list[str]:
    """Every checkpoint prefix in `ckpt_dir` (from its `.index` files), newest step first.

    Read from the files, not from the `checkpoint` state file: that file may itself be the
    damaged one, or name a checkpoint whose files are gone."""
    found = []
    for index in Path(ckpt_dir).glob("*.index"):
        match = _NUMBERED.match(str(index))
        if match:
            found.append((int(match.group(2)), match.group(1)))
    return [prefix for _, prefix in sorted(found, reverse=True)]


def damaged(exc: BaseException) -> bool:
    """True for the errors a damaged or vanished checkpoint raises on restore."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.CancelledError,
                        tf.errors.AbortedError, tf.errors.DeadlineExceededError)):
        return False  # the cluster, not the files
    # IndexError: the reader's "Read less bytes than requested" for a cut data shard
    return isinstance(exc, (tf.errors.OpError, ValueError, AssertionError, OSError,
                            IndexError, KeyError, DecodeError))


def restore_newest(restore: Callable[[str], Any], candidates: list[str]) -> str | None:
    """Call `restore(path)` on each candidate, newest first, until one succeeds; returns it
    (None when none restores). Each failure is recorded as `checkpoint_skipped`."""
    skipped: list[tuple[str, str]] = []
    used = None
    for path in candidates:
        try:
            restore(path)
        except Exception as exc:
            if not damaged(exc):
                raise
            skipped.append((path, f"{type(exc).__name__}: {str(exc)[:300]}"))
            print(f"[{events.role()}] skipping checkpoint {path}: {skipped[-1][1]}", flush=True)
            continue
        used = path
        break
    for path, error in skipped:
        events.emit(events.EVENT_CHECKPOINT_SKIPPED, path=path, error=error, used=used)
    return used
