"""Google Cloud Storage transfers: checkpoints, results and `gs://` data, through the client.

TensorFlow's own `gs://` file system cannot be pointed at an emulator and is untested here
(gce-notes §E), so the trainer checkpoints to the host's disk and this module mirrors that folder
to `gs://BUCKET/PREFIX/<run_id>/checkpoints`; a restart on new VMs downloads it first. Results
(the run directory: logs, events, TensorBoard files) go to `.../<run_id>/results` at the end, and
a `data_dir` of `gs://...` is downloaded once into the orchestrator's data cache (`cached_copy`),
where validation reads it. The VMs download a dataset from a bucket themselves
(`GcsDatasetStore`): a `gs://` data_dir from where it is, a folder of the orchestrator's machine
from `gs://BUCKET/PREFIX/datasets/<name>-<digest>`, uploaded there once.

Transfers run in parallel threads through `transfer_manager`, whose results list holds each
object's exception (it raises nothing by default, and skips some objects with only a warning):
every result is checked, and a failure surfaces as `StorageError` naming each failed object.
Files above 8 MiB go as chunked resumable uploads and ranged chunked downloads.

Also a command: `python -m provisioning.gce.storage (upload|download|mirror) SRC DST`, where this
tool is installed (the hosts' wheel carries only `trainer`: hosts need no Google client).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioning.base import (
    CheckpointStore,
    DatasetStore,
    HostRunner,
    LocalFolderStore,
    ProvisionError,
    StagedDataset,
)
from provisioning.gce.config import CREDENTIALS_ADC

#: Chunk of a resumable upload (a multiple of 256 KiB); files above 8 MiB are uploaded
#: resumably in chunks of this size, so a dropped connection repeats one chunk, not the file.
CHUNK_SIZE = 8 * 1024 * 1024
MAX_WORKERS = 8
#: TensorFlow's checkpoint state file: uploaded last, so a reader never sees it point at data
#: that is not there yet.
CHECKPOINT_STATE = "checkpoint"
CHECKPOINTS, RESULTS, DATASETS = "checkpoints", "results", "datasets"
#: On a new chief's host, in its work dir: what its checkpoint download checks.
CHECKPOINT_MANIFEST = ".checkpoint-manifest.json"


class StorageError(Exception):
    """A transfer failed; the message names the object and the cause."""


@dataclass(frozen=True)
class GcsUrl:
    """`gs://bucket/prefix` split; `prefix` has no leading or trailing slash."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> GcsUrl:
        """ValueError for anything but ``gs://BUCKET[/PREFIX]`` (the VMs' reader's rule)."""
        from trainer.gcs import split_url

        return cls(*split_url(url))

    def child(self, *parts: str) -> GcsUrl:
        return GcsUrl(self.bucket, "/".join(p.strip("/") for p in (self.prefix, *parts) if p))

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"


def is_gcs(path: str | os.PathLike[str] | None) -> bool:
    return str(path or "").startswith("gs://")


def checkpoint_url(base: str, run_id: str) -> GcsUrl:
    """`gs://BUCKET/PREFIX/<run_id>/checkpoints` for a storage base `gs://BUCKET/PREFIX`."""
    return GcsUrl.parse(base).child(run_id, CHECKPOINTS)


def results_url(base: str, run_id: str) -> GcsUrl:
    return GcsUrl.parse(base).child(run_id, RESULTS)


def make_client(project: str | None = None, cfg: Any = None) -> Any:
    """A `storage.Client`. With `cfg` (a `GceConfig`) it acts as `provider.credentials`, the
    identity the Compute calls use (`api.resolve_credentials`: a key file, ADC or anonymous for
    a local fake); without, Application Default Credentials. Honours `STORAGE_EMULATOR_HOST`."""
    from google.auth import exceptions as auth_exceptions
    from google.cloud import storage

    credentials = None
    if cfg is not None:
        project = project or cfg.project
    if cfg is not None and cfg.credentials != CREDENTIALS_ADC:  # ADC: the client finds them
        from provisioning.gce.api import GceAuthError, resolve_credentials

        try:
            credentials, resolved = resolve_credentials(cfg)
        except GceAuthError as error:
            raise StorageError(f"{error.field}: {error.problem}") from None
        project = project or resolved
    try:
        return storage.Client(project=project, credentials=credentials)
    except auth_exceptions.DefaultCredentialsError:
        from provisioning.gce.api import AUTH_HINT

        raise StorageError("no Google credentials for Cloud Storage; " + AUTH_HINT) from None


def bucket_problem(url: str, client: Any = None, cfg: Any = None) -> str | None:
    """Why checkpoints and results could not be written under `url` (gs://BUCKET/PREFIX), or
    None: a small probe object under PREFIX is written and deleted. Only object calls, which
    Storage Object Admin (`roles/storage.objectAdmin`, `storage.objects.*`) allows; reading the
    bucket's metadata (`bucket.exists()`) needs `storage.buckets.get`, which it lacks. The
    client is `make_client(cfg=cfg)`'s: the run's own credentials."""
    from google.api_core import exceptions as gexc

    try:
        parsed = GcsUrl.parse(url)
    except ValueError:
        return f"'{url}' names no bucket, expected gs://BUCKET[/PREFIX]"
    try:
        client = client if client is not None else make_client(cfg=cfg)
        probe = client.bucket(parsed.bucket).blob(
            parsed.child(f".transient-write-probe-{os.getpid()}").prefix)
        probe.upload_from_string(b"ok")
        probe.delete()
    except StorageError as error:
        return str(error)
    except gexc.NotFound as error:
        if "bucket" in str(error).lower() or parsed.bucket in str(error):
            return (f"bucket {parsed.bucket} does not exist (gcloud storage buckets create "
                    f"gs://{parsed.bucket})")
        return f"cannot write to {url}: {' '.join(str(error).split())[:300]}"
    except Exception as error:  # a permission or transport error: say which, in one line
        return f"cannot write to {url}: {' '.join(str(error).split())[:300]}"
    return None


def store_for_provider(provider: dict[str, Any]) -> GcsStore:
    """A `GcsStore` acting as the `credentials` of a saved `provider` config (a resume reads
    the bucket as the run wrote it); keys GceConfig does not have are ignored."""
    from provisioning.gce.config import from_section

    return GcsStore(cfg=from_section(provider))


class GcsStore:
    """Parallel directory-tree transfers to and from one bucket."""

    def __init__(self, client: Any = None, max_workers: int = MAX_WORKERS,
                 cfg: Any = None) -> None:
        self.client = client if client is not None else make_client(cfg=cfg)
        self.max_workers = max_workers

    def _bucket(self, url: GcsUrl) -> Any:
        return self.client.bucket(url.bucket)

    def list(self, url: GcsUrl) -> dict[str, int]:
        """Relative name -> size of every object under `url`."""
        prefix = url.prefix + "/" if url.prefix else ""
        try:
            return {b.name[len(prefix):]: b.size or 0
                    for b in self.client.list_blobs(url.bucket, prefix=prefix)}
        except Exception as error:
            raise StorageError(f"cannot list {url}: {error}") from error

    def upload(self, local_dir: Path, url: GcsUrl, names: Sequence[str] | None = None) -> list[str]:
        """Upload `names` (relative paths; default: every file below `local_dir`) in parallel,
        files above CHUNK_SIZE as chunked resumable uploads. Returns the uploaded names."""
        from google.cloud.storage import transfer_manager

        local_dir = Path(local_dir)
        if names is None:
            names = sorted(p.relative_to(local_dir).as_posix()
                           for p in local_dir.rglob("*") if p.is_file())
        if not names:
            return []
        prefix = url.prefix + "/" if url.prefix else ""
        try:
            results = transfer_manager.upload_many_from_filenames(
                self._bucket(url), list(names), source_directory=str(local_dir),
                blob_name_prefix=prefix, blob_constructor_kwargs={"chunk_size": CHUNK_SIZE},
                raise_exception=False, worker_type=transfer_manager.THREAD,
                max_workers=self.max_workers)
        except Exception as error:
            raise StorageError(f"upload of {local_dir} to {url} failed: "
                               f"{type(error).__name__}: {error}") from error
        _check_results("upload", url, names, results)
        return list(names)

    def download(self, url: GcsUrl, local_dir: Path,
                 names: Sequence[str] | None = None) -> list[str]:
        """Download `names` (default: every object under `url`) into `local_dir` (folders
        created) in parallel; objects above CHUNK_SIZE in ranged chunks (a dropped connection
        repeats one chunk), smaller ones whole with their checksum verified. Returns the
        downloaded names; a name that failed (missing, escaping `local_dir`) fails the call."""
        from google.cloud.storage import transfer_manager

        sizes = self.list(url)
        names = sorted(sizes) if names is None else list(names)
        if not names:
            return []
        local_dir = Path(local_dir)
        escaping = [n for n in names if n.startswith("/") or ".." in Path(n).parts]
        if escaping:
            raise StorageError(f"download of {url}: object names {escaping} would land outside "
                               f"{local_dir}")
        bucket = self._bucket(url)
        pairs = []
        for name in names:
            (local_dir / name).parent.mkdir(parents=True, exist_ok=True)
            chunked = sizes.get(name, 0) > CHUNK_SIZE
            blob = bucket.blob(url.child(name).prefix, chunk_size=CHUNK_SIZE if chunked else None)
            pairs.append((blob, str(local_dir / name)))
        try:
            results = transfer_manager.download_many(
                pairs, raise_exception=False, worker_type=transfer_manager.THREAD,
                max_workers=self.max_workers)
        except Exception as error:
            raise StorageError(f"download of {url} to {local_dir} failed: "
                               f"{type(error).__name__}: {error}") from error
        _check_results("download", url, names, results)
        return names

    def read_bytes(self, url: GcsUrl, start: int = 0) -> bytes | None:
        """The object at `url` from byte `start` on (b"" when it has no more), None when there
        is no such object: a small record (a detached sweep's state) or a growing log's tail."""
        from google.api_core import exceptions as api_exceptions

        blob = self._bucket(url).blob(url.prefix)
        try:
            return blob.download_as_bytes(start=start or None)
        except api_exceptions.NotFound:
            return None
        except api_exceptions.RequestRangeNotSatisfiable:
            return b""
        except Exception as error:
            raise StorageError(f"cannot read {url}: {type(error).__name__}: {error}") from error

    def write_bytes(self, url: GcsUrl, data: bytes) -> None:
        """Write the object at `url` whole (a reader sees the old or the new bytes, never a
        mix: Cloud Storage objects are replaced atomically)."""
        try:
            self._bucket(url).blob(url.prefix).upload_from_string(data)
        except Exception as error:
            raise StorageError(f"cannot write {url}: {type(error).__name__}: {error}") from error

    def delete(self, url: GcsUrl, names: Sequence[str]) -> None:
        bucket = self._bucket(url)
        for name in names:
            blob_name = f"{url.prefix}/{name}" if url.prefix else name
            try:
                bucket.blob(blob_name).delete()
            except Exception as error:
                if getattr(error, "code", None) != 404:
                    raise StorageError(f"cannot delete {url.bucket}/{blob_name}: "
                                       f"{error}") from error


def _check_results(verb: str, url: GcsUrl, names: Sequence[str], results: Sequence[Any]) -> None:
    """transfer_manager reports each object's failure in its results list (an exception, or a
    warning for an object it skipped); any of them fails the call, naming every such object."""
    failed = [f"{name}: {type(r).__name__}: {str(r).splitlines()[0] if str(r) else ''}"
              for name, r in zip(names, results, strict=True)
              if isinstance(r, BaseException | Warning)]
    if failed:
        raise StorageError(f"{verb} of {len(failed)} of {len(names)} object(s) under {url} "
                           f"failed: " + "; ".join(failed))


def cache_folder(url: GcsUrl, cache_root: Path) -> Path:
    """Where `cached_copy` keeps the objects under `url`: `<cache_root>/gs/BUCKET/PREFIX`."""
    return Path(cache_root).expanduser() / "gs" / url.bucket / url.prefix


def cached_copy(url: str, cache_root: Path, store: GcsStore | None = None) -> Path:
    """A local copy of the objects under the `gs://` URL `url`, kept in
    `<cache_root>/gs/BUCKET/PREFIX`: only objects missing there or of another size are
    downloaded, so a second run downloads nothing. A `job.data_dir` of `gs://...` is read from
    this copy and shipped to the hosts through their runners, like a local folder (hosts need
    no credentials, and the ones of the test bed cannot reach a local emulator). Raises
    StorageError (nothing under `url`, no credentials, a failed transfer) and ValueError for a
    URL that is not `gs://BUCKET[/PREFIX]`."""
    parsed = GcsUrl.parse(url)
    folder = cache_folder(parsed, cache_root)
    store = store if store is not None else GcsStore()
    remote = store.list(parsed)
    remote = {name: size for name, size in remote.items() if name and not name.endswith("/")}
    if not remote:
        raise StorageError(f"no objects under {parsed}")
    stale = [name for name, size in sorted(remote.items())
             if not (folder / name).is_file() or (folder / name).stat().st_size != size]
    store.download(parsed, folder, stale)
    return folder


def dataset_url(base: str, name: str, files: dict[str, Any]) -> GcsUrl:
    """`gs://BUCKET/PREFIX/datasets/<name>-<digest>`: named by the files' relative paths,
    sizes and SHA-256 (`trainer.data.digests`), so equal content lands in one place and a
    changed file in another (nothing is overwritten under a VM reading it)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]
    return GcsUrl.parse(base).child(DATASETS, f"{name}-{digest}")


class GcsDatasetStore(DatasetStore):
    """`Provider.dataset_store` of `provider.storage = gs://BUCKET/PREFIX`: a folder is uploaded
    once to `dataset_url` (only objects missing there or of another size: an object exists
    only once its upload completed), and each VM downloads it with `python -m trainer data
    fetch-gcs` (standard library, the VM's service-account token; `trainer/gcs.py`). The
    client is made on the first upload, acting as `provider.credentials`."""

    def __init__(self, base_url: str, cfg: Any = None, store: GcsStore | None = None) -> None:
        self.base_url, self.cfg, self._store = base_url, cfg, store

    def _gcs(self) -> GcsStore:
        if self._store is None:
            self._store = GcsStore(cfg=self.cfg)
        return self._store

    def stage(self, local_dir: Path, files: Any) -> StagedDataset:
        url = dataset_url(self.base_url, Path(local_dir).name, dict(files))
        try:
            there = self._gcs().list(url)
            missing = sorted(rel for rel, (size, _) in files.items() if there.get(rel) != size)
            self._gcs().upload(Path(local_dir), url, missing)
        except StorageError as error:
            raise ProvisionError(str(error)) from None
        return StagedDataset(str(url), len(missing), sum(files[rel][0] for rel in missing))

    def reads(self, url: str) -> bool:
        return is_gcs(url)

    def host_args(self, url: str, manifest: str, dest: str, link: str) -> list[str]:
        return ["fetch-gcs", url, "--manifest", manifest, "--dest", dest, "--link", link,
                *_endpoint_args()]


def _endpoint_args() -> list[str]:
    """`fetch-gcs`'s ``--endpoint`` when the orchestrator's client talks to an emulator
    (tests): the VMs then read the same one."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    return ["--endpoint", emulator] if emulator else []


class CheckpointMirror:
    """Keeps `gs://.../checkpoints` equal to a local checkpoint folder, incrementally: changed
    files are uploaded (the `checkpoint` state file last), files gone locally (old checkpoints
    TensorFlow rotated out) are deleted remotely. `restore` brings it back onto a new host."""

    def __init__(self, store: GcsStore, local_dir: Path, url: GcsUrl) -> None:
        self.store, self.local_dir, self.url = store, Path(local_dir), url
        self._sent: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) uploaded

    def sync(self) -> list[str]:
        """Upload what changed since the last call; returns the names uploaded."""
        current = {}
        if self.local_dir.is_dir():
            for path in self.local_dir.rglob("*"):
                if path.is_file() and not path.name.endswith(".tmp"):
                    stat = path.stat()
                    current[path.relative_to(self.local_dir).as_posix()] = (stat.st_size,
                                                                             stat.st_mtime_ns)
        changed = sorted(n for n, sig in current.items() if self._sent.get(n) != sig)
        data = [n for n in changed if Path(n).name != CHECKPOINT_STATE]
        state = [n for n in changed if Path(n).name == CHECKPOINT_STATE]
        self.store.upload(self.local_dir, self.url, data)
        self.store.upload(self.local_dir, self.url, state)
        removed = sorted(set(self._sent) - set(current))
        self.store.delete(self.url, removed)
        self._sent = {n: current[n] for n in current}
        return changed

    def restore(self) -> list[str]:
        """Download the mirrored checkpoints into the local folder (empty remote: nothing)."""
        names = self.store.download(self.url, self.local_dir)
        for name in names:
            stat = (self.local_dir / name).stat()
            self._sent[name] = (stat.st_size, stat.st_mtime_ns)
        return names

    def watch(self, interval_s: float, stop_file: Path | None = None) -> None:
        """Sync every `interval_s` until `stop_file` exists (then one last sync)."""
        while stop_file is None or not stop_file.exists():
            self.sync()
            time.sleep(interval_s)
        self.sync()


class GcsCheckpointStore(CheckpointStore):
    """The checkpoint store of `provider.storage = gs://BUCKET/PREFIX` (`GceProvider.
    checkpoint_store`): a `LocalFolderStore` (checkpoints fetched back from the chief's host
    into `<run_dir>/checkpoints`, copied onto a new chief before it starts) whose folder is
    mirrored to `gs://BUCKET/PREFIX/<run_id>/checkpoints` after every sync, so checkpoints
    survive the orchestrator's machine too; `before_start` restores from the bucket when the
    local folder is empty, and `finish` uploads the run directory to `.../<run_id>/results`.

    A new chief's VM downloads the checkpoints from the bucket itself (`python -m trainer data
    fetch-gcs`, each file checked against the SHA-256 of the copy here, files it holds kept),
    so a PS or chief machine re-created after a loss costs the user's uplink a manifest, not
    the checkpoints (megabytes each); where that download fails (the VM may not read the
    bucket) the copy here is pushed as without a bucket."""

    def __init__(self, folder: Path, base_url: str, run_id: str,
                 store: GcsStore | None = None) -> None:
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
        if chief.shares_orchestrator_fs or not any(self.local.folder.iterdir()) \
                or not self._chief_downloads(chief):
            self.local.before_start(chief)

    def _chief_downloads(self, chief: HostRunner) -> bool:
        """Have `chief`'s host download the mirrored checkpoints into its checkpoint folder;
        False (the caller pushes) when it could not."""
        import json
        import logging

        from trainer import data, layout

        self.mirror.sync()  # the bucket holds what is here (normally nothing left to send)
        manifest = {rel: v for rel, v in data.digests(self.local.folder).items()
                    if not rel.endswith(".tmp")}
        log_path = (self.local.folder.parent / layout.LOGS_DIR
                    / f"checkpoints-{chief.host.spec.name}.log")
        try:
            chief.write_text(Path(CHECKPOINT_MANIFEST), json.dumps(manifest))
            process = chief.start(
                [*chief.trainer_command(), "data", "fetch-gcs", str(self.mirror.url),
                 "--manifest", CHECKPOINT_MANIFEST, "--dest", layout.CHECKPOINT_DIR,
                 *_endpoint_args()], chief.trainer_env(), None, log_path)
            report = [line for line in process.stdout_lines()
                      if line.startswith(data.REPORT_PREFIX)]
            code = process.wait()
        except (ProvisionError, OSError) as error:
            code, report = -1, [str(error)]
        if code != 0:
            logging.getLogger(__name__).warning(
                "%s could not download the checkpoints from %s (%s); pushing them from here",
                chief.host.spec.name, self.mirror.url, (report or [f"exit code {code}"])[-1])
        return code == 0

    def sync(self, chief: HostRunner) -> bool:
        fetched = self.local.sync(chief)
        self.mirror.sync()  # StorageError propagates: a checkpoint that is not durable is news
        return fetched

    def finish(self, run_dir: Path) -> None:
        self.mirror.sync()
        self.gcs.upload(run_dir, self.results)


def main(argv: Sequence[str] | None = None) -> int:
    """Host-side transfers: stage data, restore or mirror checkpoints, upload results."""
    from trainer.layout import version_line  # provisioning/ may not import orchestrator/

    parser = argparse.ArgumentParser(prog="python -m provisioning.gce.storage")
    parser.add_argument("--version", action="version",
                        version=version_line("provisioning.gce.storage"),
                        help="print the tool's version and exit")
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("upload", help="upload a directory tree: LOCAL gs://...")
    up.add_argument("src", type=Path)
    up.add_argument("dst")
    down = sub.add_parser("download", help="download a prefix: gs://... LOCAL")
    down.add_argument("src")
    down.add_argument("dst", type=Path)
    mirror = sub.add_parser("mirror", help="keep gs://... equal to LOCAL until --stop-file")
    mirror.add_argument("src", type=Path)
    mirror.add_argument("dst")
    mirror.add_argument("--interval-s", type=float, default=10.0)
    mirror.add_argument("--stop-file", type=Path)
    args = parser.parse_args(argv)
    try:
        store = GcsStore()
        if args.verb == "upload":
            done = store.upload(args.src, GcsUrl.parse(args.dst))
        elif args.verb == "download":
            done = store.download(GcsUrl.parse(args.src), args.dst)
        else:
            CheckpointMirror(store, args.src, GcsUrl.parse(args.dst)).watch(
                args.interval_s, args.stop_file)
            done = []
    except (StorageError, ValueError) as error:
        print(f"storage: {error}", file=sys.stderr)
        return 1
    print(f"{args.verb}: {len(done)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
