"""The checkpoint store: where checkpoints live so that losing any one host loses none of them.

The chief writes checkpoints (and `DONE`) where the spec's `checkpoint_dir` says; on a restart,
possibly on other hosts, the new chief resumes from the newest one it finds there. A store
decides that location for a given chief host and keeps it durable:

- `LocalFolderStore` (the default): a folder the orchestrator owns, `<run_dir>/checkpoints`.
  A chief whose host shares the orchestrator's filesystem (`HostRunner.shares_orchestrator_fs`,
  the local backend) writes straight into it. Any other chief writes into `checkpoints/` in its
  host's work dir; the supervisor calls `sync` after each `checkpoint` event, which fetches the
  folder back through the runner, and `before_start` copies the store onto a new chief's host
  before it starts, so it resumes from the latest checkpoint whichever host it is on.
- `GcsCheckpointStore` (`orchestrator/runtime/gcs_store.py`, `provider.storage=gs://...`): the
  local folder store plus a mirror of its folder in the bucket after every sync.

A checkpoint that was still only on a host when that host was lost is lost with it; the run
resumes from the last one synced (the lost steps are counted from it).
"""

from __future__ import annotations

import abc
import contextlib
from pathlib import Path

from provisioning.base import HostLostError, HostRunner
from trainer import layout


class CheckpointStore(abc.ABC):
    """Where a run's checkpoints are kept (see the module docstring)."""

    @abc.abstractmethod
    def location(self, chief: HostRunner) -> str:
        """The spec's `checkpoint_dir` for a cluster whose chief runs on `chief`'s host."""

    @abc.abstractmethod
    def before_start(self, chief: HostRunner) -> None:
        """Make the latest checkpoint readable at `location(chief)` before the chief starts."""

    @abc.abstractmethod
    def sync(self, chief: HostRunner) -> bool:
        """Make what the chief wrote durable; False if nothing could be brought back."""

    def finish(self, run_dir: Path) -> None:
        """Once the run has ended (summary written): archive what the store keeps durable
        elsewhere (the bucket store uploads the run directory). Default: nothing."""
        return None


class LocalFolderStore(CheckpointStore):
    """A folder on the orchestrator's machine (default `<run_dir>/checkpoints`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def location(self, chief: HostRunner) -> str:
        if chief.shares_orchestrator_fs:
            return str(self.folder.resolve())
        return str(chief.host.workdir / layout.CHECKPOINT_DIR)

    def before_start(self, chief: HostRunner) -> None:
        if not chief.shares_orchestrator_fs and any(self.folder.iterdir()):
            chief.copy(self.folder, Path(layout.CHECKPOINT_DIR))

    def sync(self, chief: HostRunner) -> bool:
        if chief.shares_orchestrator_fs:
            return True
        with contextlib.suppress(HostLostError, OSError):
            return chief.fetch(Path(layout.CHECKPOINT_DIR), self.folder)
        return False
