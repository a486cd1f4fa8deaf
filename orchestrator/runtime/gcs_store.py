"""The checkpoint store with a Cloud Storage mirror: `provider.storage = gs://BUCKET/PREFIX`.

It keeps the local folder store's behaviour (checkpoints fetched back from the chief's host into
`<run_dir>/checkpoints`, copied onto a new chief before it starts) and mirrors that folder to
`gs://BUCKET/PREFIX/<run_id>/checkpoints` after every sync, so the checkpoints survive the
orchestrator's machine too; `before_start` restores from the bucket when the local folder is
empty. TensorFlow writes on the host's disk (its own `gs://` cannot be pointed at an emulator,
gce-notes §E). At the end, `finish` uploads the run directory to `.../<run_id>/results`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.runtime.checkpoints import CheckpointStore, LocalFolderStore
from provisioning.base import HostRunner


class GcsCheckpointStore(CheckpointStore):
    """A `LocalFolderStore` whose folder is mirrored to a bucket (see the module docstring)."""

    def __init__(self, folder: Path, base_url: str, run_id: str, store: Any = None) -> None:
        from provisioning.gce.storage import (
            CheckpointMirror,
            GcsStore,
            checkpoint_url,
            results_url,
        )

        self.local = LocalFolderStore(folder)
        self.gcs = store if store is not None else GcsStore()
        self.mirror = CheckpointMirror(self.gcs, self.local.folder,
                                       checkpoint_url(base_url, run_id))
        self.results = results_url(base_url, run_id)

    def location(self, chief: HostRunner) -> str:
        return self.local.location(chief)

    def before_start(self, chief: HostRunner) -> None:
        if not any(self.local.folder.iterdir()):
            self.mirror.restore()
        self.local.before_start(chief)

    def sync(self, chief: HostRunner) -> bool:
        fetched = self.local.sync(chief)
        self.mirror.sync()  # StorageError propagates: a checkpoint that is not durable is news
        return fetched

    def finish(self, run_dir: Path) -> None:
        self.mirror.sync()
        self.gcs.upload(run_dir, self.results)


def checkpoint_store(provider_config: Any, run_dir: Path, run_id: str,
                     folder: Path) -> CheckpointStore:
    """The run's store: mirrored to `provider.storage` when the backend has one set."""
    base = getattr(provider_config, "storage", None)
    if base:
        return GcsCheckpointStore(folder, base, run_id)
    return LocalFolderStore(folder)
