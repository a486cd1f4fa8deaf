"""The data step of a run: the problem's files are here before anything is provisioned.

``job.data_dir`` wins when given (it must hold the files). Left unset, a file-backed problem
reads its dataset from the per-user cache (``data_cache``, ``$TRANSIENT_DATA_CACHE``, or
``~/.cache/transient-orchestrator/datasets``), downloaded into it first when missing
(``trainer/data.py``); the run's trainer spec then names that folder. A ``gs://BUCKET/PREFIX``
data_dir is downloaded once into the same cache (``<cache>/gs/BUCKET/PREFIX``, only what changed
on later runs) and read from there: a URL is fetched by the backend that lists its scheme
(`Provider.fetch_dataset`; gs:// by gce, whichever backend runs the hosts).

Remote machines that read the files get them through the deployer (:class:`DataStager`, per
machine, on every deployment): a dataset from the registry is downloaded by the host itself
from its source URL and verified against the registry's checksum, into the host's dataset
cache (kept across runs and restarts, so a restart transfers nothing); a folder of the user's,
or a host that cannot reach the source, is downloaded by the host from the provider's dataset
store (`Provider.dataset_store`, gce: `provider.storage`), uploaded there once per run, or a
`gs://` data_dir from where it is; without a store the host gets a push of only the files it
lacks.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import ExperimentConfig
from provisioning.base import (
    DATA_SOURCES,
    Cluster,
    DatasetStore,
    Host,
    HostLostError,
    HostRunner,
    ProvisionError,
    Role,
    StagedDataset,
    url_scheme,
)
from provisioning.registry import dataset_reader
from trainer import layout

STAGED_DATA_DIR = "data"  # on a remote host, relative to its work dir
ORIGIN_FILE = ".origin.json"  # in a cache folder: the registry archive it came from
MANIFEST_FILE = ".data-manifest.json"  # on a host, in its work dir: what a store download checks
# The roles that read the files: they load the arrays and ship them into each worker's dataset
# function (trainer/problems.py), so parameter servers and workers need no copy.
READING_ROLES = (Role.CHIEF, Role.EVALUATOR)


class DataError(ConfigError):
    """The dataset could not be obtained: one line and exit 2 like a config error, since
    nothing was started and the user must act (go online, or place the files by hand)."""

    def __init__(self, message: str) -> None:
        super().__init__("job.data_dir", message)

    def line(self) -> str:
        return f"data error: {self.problem}"


def _dataset(cfg: ExperimentConfig):  # -> trainer.datasets.Dataset | None
    """The downloadable dataset the run would read from the cache, None when it reads none."""
    from trainer import datasets
    from trainer.problems import get_problem

    if cfg.job.data_dir or not get_problem(cfg.job.problem).requires_data_dir:
        return None
    return datasets.dataset_for_problem(cfg.job.problem)


def describe(cfg: ExperimentConfig) -> str | None:
    """The dry run's data line: where the files are and how big, or what will be fetched."""
    from rich.markup import escape

    from orchestrator.config.validation import validate_data_dir
    from trainer import data, datasets

    try:
        validate_data_dir(cfg)
    except ConfigError as err:
        return f"[yellow]{escape(err.line())}[/yellow] (the run stops there)"
    if cfg.job.data_dir and url_scheme(cfg.job.data_dir):
        folder = _fetch(cfg, download=False)
        return (f"{cfg.job.problem} from {cfg.job.data_dir}: the run first downloads what "
                f"{folder} lacks")
    if cfg.job.data_dir:
        folder = Path(cfg.job.data_dir).expanduser()
        return f"{cfg.job.problem} from job.data_dir {folder} " \
               f"({data.human_bytes(data.folder_bytes(folder))})"
    ds = _dataset(cfg)
    if ds is None:
        return None
    root = data.cache_root(cfg.data_cache)
    folder = data.cached_folder(ds, root)
    if datasets.holds_files(ds.problem, folder):
        return f"{ds.problem} cached in {folder} ({data.human_bytes(data.folder_bytes(folder))})"
    archive = ds.archive()
    return (f"{ds.problem} not cached: the run first downloads {archive.filename} "
            f"({data.human_bytes(archive.size)}) from {archive.source_url()} into {folder}")


def prepare(cfg: ExperimentConfig, console=None) -> Path | None:
    """Make the files available and point ``cfg.job.data_dir`` at them; fetch when missing.

    Raises ConfigError for a bad ``job.data_dir``, DataError when the download fails. Returns
    the folder the run reads (None for problems without files).
    """
    from orchestrator.config.validation import validate_data_dir
    from trainer import data

    validate_data_dir(cfg)
    if cfg.job.data_dir:  # absolute: the roles run in their hosts' work dirs
        given = _fetch(cfg)
        cfg.job.data_dir = str(given)
        return given
    ds = _dataset(cfg)
    if ds is None:
        return None
    try:
        folder = data.fetch(ds, data.cache_root(cfg.data_cache), console=console,
                            progress=cfg.progress)
    except data.FetchError as err:
        raise DataError(str(err)) from None
    mark_origin(folder, ds)  # remote hosts fetch the same archive themselves (DataStager)
    cfg.job.data_dir = str(folder)
    return folder


def _fetch(cfg: ExperimentConfig, download: bool = True) -> Path:
    """The local folder of a given ``job.data_dir``: a folder as it is, a URL (``gs://...``)
    through the backend that reads its scheme (`Provider.fetch_dataset`), downloaded into the
    data cache as needed (`download` False: where it would be). DataError when the URL cannot
    be read or does not hold the problem's files."""
    from trainer import data, datasets

    url = str(cfg.job.data_dir)
    reader = dataset_reader(url, cfg.provider.name)
    try:
        folder = reader.fetch_dataset(url, data.cache_root(cfg.data_cache), download)
    except ProvisionError as err:
        raise DataError(f"cannot download {url}: {err}") from None
    if download and url_scheme(url) and not datasets.holds_files(cfg.job.problem, folder):
        raise DataError(f"{url} does not hold the {cfg.job.problem} files (downloaded into "
                        f"{folder}; see python -m trainer.data list)")
    if download and url_scheme(url):  # VMs may download it from there themselves (DataStager)
        _write_origin(url_origin_file(folder), {"url": url})
    return folder


def reads_data(cluster: Cluster, host: Host) -> bool:
    """Whether a role on `host`'s machine reads the dataset (colocated roles share a copy)."""
    return any(h.machine == host.machine and h.role in READING_ROLES for h in cluster.hosts)


def staged_path(local_dir: Path) -> str:
    """Where a staged dataset lies on a host: relative to its work dir (the trainer's cwd
    there), so one spec serves every host. With a host dataset cache it is a link into it."""
    return str(Path(STAGED_DATA_DIR) / local_dir.name)


def mark_origin(folder: Path, ds, fmt: str | None = None) -> None:  # ds: trainer.datasets.Dataset
    """Note in a cache folder which registry archive it was unpacked from (ORIGIN_FILE): a
    host can then fetch the same archive itself instead of receiving the files from here."""
    from trainer import datasets

    fmt = fmt or datasets.find_cifar_files(ds.problem, str(folder))[2]
    _write_origin(folder / ORIGIN_FILE, {"dataset": ds.name, "format": fmt})


def url_origin_file(folder: Path) -> Path:
    """Where the URL a downloaded ``job.data_dir`` came from is noted: beside its folder, not
    in it (the folder mirrors the bucket's objects exactly)."""
    return folder.parent / f".{folder.name}{ORIGIN_FILE}"


def _write_origin(path: Path, mark: dict[str, str]) -> None:
    import json

    with contextlib.suppress(OSError, ValueError):  # a read-only cache: the hosts get a push
        if not path.is_file() or json.loads(path.read_text()) != mark:
            path.write_text(json.dumps(mark))


def origin_of(local_dir: Path):  # -> trainer.datasets.Dataset | None
    """The registry dataset (with only the archive ``local_dir`` came from) when it carries
    ORIGIN_FILE, else None (a folder of the user's: only a push brings it to a host)."""
    import json
    from dataclasses import replace

    from trainer import datasets

    try:
        mark = json.loads((local_dir / ORIGIN_FILE).read_text())
        ds = datasets.dataset_for(str(mark["dataset"]))
        return replace(ds, archives=(ds.archive(str(mark["format"])),))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def url_origin_of(local_dir: Path) -> str | None:
    """The URL (``gs://...``) that ``local_dir`` is a downloaded copy of (a ``job.data_dir``
    URL, `url_origin_file`), else None."""
    import json

    try:
        return str(json.loads(url_origin_file(local_dir).read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class Staged:
    """How one machine got the dataset: ``fetched`` (the host downloaded it from the source),
    ``bucket`` (the host downloaded it from the provider's dataset store), ``cached`` (the
    host had it), ``pushed`` (sent from here; `pushed_bytes` of file data, 0 when every file
    was already there), ``shared`` (another machine at the same address and folder did it).
    `uploaded_bytes`: what this machine's staging uploaded to the store (None: it uploaded
    nothing; the one upload of a run is counted on the first machine that needed it)."""

    how: str
    pushed_bytes: int = 0
    note: str = ""
    uploaded_bytes: int | None = None


class DataStager:
    """Brings the dataset to the machines that read it, at most once per host folder.

    With a host dataset cache (`HostRunner.dataset_cache`, kept across runs) and a dataset
    from the registry (ORIGIN_FILE), the host fetches the archive itself from its source URL
    with the registry's checksum: nothing crosses the user's uplink, and a host that already
    holds it downloads nothing. Otherwise (a folder of the user's, a source the host cannot
    reach), with a dataset `store` (`Provider.dataset_store`), the folder is uploaded there
    once per stager (only what the store lacks; a ``gs://`` data_dir is read where it is) and
    each host downloads it itself, every file checked against the SHA-256 computed here.
    `source` ``auto`` (the default) tries the source, then the store, then pushes;
    ``origin`` never pushes a registry dataset, nor anything when a store exists; ``push``
    always pushes. A push (no store, a host without a way out, a backend without a cache)
    sends only the files whose size and SHA-256 differ on the host (one listing command
    first). The work dir's ``data/<name>`` links to the cached folder. Machines at the same
    address staging into the same folder are served once."""

    def __init__(self, local_dir: Path, run_dir: Path, source: str = "auto",
                 store: DatasetStore | None = None) -> None:
        if source not in DATA_SOURCES:
            raise ValueError(f"data source {source!r}: one of {', '.join(DATA_SOURCES)}")
        self.local_dir = local_dir
        self.run_dir = run_dir
        self.source = source
        self.origin = origin_of(local_dir)
        self.store = store
        self._stored: StagedDataset | str | None = None  # the store's copy, or why there is none
        self._upload_counted = False
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._done: set[tuple[str, str]] = set()  # (address, folder) holding the files
        self._linked: set[tuple[str, str]] = set()  # (address, work dir) whose link is made
        self._guard = threading.Lock()
        self._stage_lock = threading.Lock()  # held through the store upload
        self._local: dict[str, list[Any]] | None = None  # digests of local_dir, once

    def _local_digests(self) -> dict[str, list[Any]]:
        from trainer import data

        with self._guard:
            if self._local is None:
                self._local = data.digests(self.local_dir)
            return self._local

    def _folder(self, cache: Path) -> Path:
        """The host folder: the registry name for a registry dataset (where the host's own
        fetch unpacks it), else the local folder's name and a digest of its path (two folders
        of one name from two places do not overwrite each other)."""
        if self.origin is not None:
            return cache / self.origin.name
        tag = hashlib.sha256(str(self.local_dir.resolve()).encode()).hexdigest()[:8]
        return cache / f"{self.local_dir.name}-{tag}"

    def stage(self, host: Host, runner: HostRunner) -> Staged:
        """Make ``staged_path`` on `host`'s machine hold the dataset. Raises DataError (one
        line) when the host's download does not verify or the source is unreachable and
        pushing is off; HostLostError as the runner does."""
        cache = runner.dataset_cache()
        target = str(self._folder(cache)) if cache is not None else staged_path(self.local_dir)
        # the files' place: one per address and cache folder (or work dir, without a cache)
        key = (host.address, target if cache is not None else str(host.workdir))
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._done:
                staged = self._stage(host, runner, target, cache is not None)
                self._done.add(key)
                self._linked.add((host.address, str(host.workdir)))
                return staged
        if cache is not None and (host.address, str(host.workdir)) not in self._linked:
            code, _ = self._host_data(host, runner, ["link", target,
                                                     staged_path(self.local_dir)])
            if code != 0:
                raise DataError(f"host {host.spec.name}: linking {target} failed (exit code "
                                f"{code}; see {self._log(host)})")
            self._linked.add((host.address, str(host.workdir)))
        return Staged("shared")

    def _stage(self, host: Host, runner: HostRunner, target: str, cached: bool) -> Staged:
        link = staged_path(self.local_dir)
        note = ""
        if cached and self.origin is not None and self.source != "push":
            archive = self.origin.archive()
            code, report = self._host_data(host, runner, [
                "fetch", self.origin.name, "--cache-dir", str(Path(target).parent),
                "--format", archive.fmt, "--url", archive.source_url(), "--md5", archive.md5,
                "--size", str(archive.size), "--link", link, "--report"])
            if code == 0:
                return Staged("cached" if report.get("cached") else "fetched")
            line = str(report.get("line") or f"exit code {code}, see {self._log(host)}")
            if report.get("status") != "unreachable" or self.source == "origin":
                raise DataError(f"host {host.spec.name} could not fetch {self.origin.name}: "
                                f"{line}")
            note = f"source unreachable from the host ({line})"
        if cached and self.store is not None and self.source != "push":
            staged = self._from_store(host, runner, target, link, note)
            if isinstance(staged, Staged):
                return staged
            note = staged
        return Staged("pushed", self._push(host, runner, target, link if cached else None),
                      f"{note}; pushed from here" if note else "")

    def _stored_copy(self) -> tuple[StagedDataset | str, int | None]:
        """The store's copy (a ``gs://`` data_dir as it is, else uploaded on the first call:
        only what the store lacks) or why there is none; the bytes uploaded, for the first
        caller only. Called under `_stage_lock`."""
        assert self.store is not None
        if self._stored is None:
            url = url_origin_of(self.local_dir)
            if url is not None and self.store.reads(url):
                self._stored = StagedDataset(url)
            else:
                try:
                    self._stored = self.store.stage(self.local_dir, self._manifest())
                except ProvisionError as err:
                    self._stored = f"staging in the dataset store failed ({err})"
        if isinstance(self._stored, str) or self._upload_counted:
            return self._stored, None
        self._upload_counted = True
        return self._stored, self._stored.uploaded_bytes

    def _manifest(self) -> dict[str, list[Any]]:
        """What a host's store download checks: the local digests, less our marker file."""
        return {rel: v for rel, v in self._local_digests().items() if rel != ORIGIN_FILE}

    def _from_store(self, host: Host, runner: HostRunner, target: str, link: str,
                    note: str) -> Staged | str:
        """The host downloads the store's copy itself: Staged, or why it did not (the caller
        pushes then; DataError for a download that does not verify, and with ``origin``)."""
        import json

        assert self.store is not None
        with self._stage_lock:  # one upload per stager, whichever host needs it first
            stored, uploaded = self._stored_copy()
        if isinstance(stored, str):
            return self._no_store(host, f"{note}; {stored}" if note else stored)
        runner.write_text(Path(MANIFEST_FILE), json.dumps(self._manifest()))
        code, report = self._host_data(host, runner, self.store.host_args(
            stored.url, MANIFEST_FILE, target, link))
        if code == 0:
            return Staged("cached" if report.get("cached") else "bucket", note=note,
                          uploaded_bytes=uploaded)
        line = str(report.get("line") or f"exit code {code}, see {self._log(host)}")
        if report.get("status") != "unreachable":
            raise DataError(f"host {host.spec.name} could not download {stored.url}: {line}")
        why = f"{stored.url} unreachable from the host ({line})"
        return self._no_store(host, f"{note}; {why}" if note else why)

    def _no_store(self, host: Host, why: str) -> str:
        if self.source == "origin":
            raise DataError(f"host {host.spec.name}: {why}; provider.data_source=origin "
                            f"pushes nothing")
        return why

    def _push(self, host: Host, runner: HostRunner, target: str, link: str | None) -> int:
        """Copy the files the host lacks (size and SHA-256 compared); the file bytes sent."""
        args = ["digests", target, *(["--link", link] if link else [])]
        code, report = self._host_data(host, runner, args)
        if code != 0 or "files" not in report:
            raise DataError(f"host {host.spec.name}: listing {target} failed (exit code {code}; "
                            f"see {self._log(host)})")
        there = report["files"]
        sent = 0
        for rel, (size, digest) in self._local_digests().items():
            if there.get(rel) != [size, digest]:
                runner.copy(self.local_dir / rel, Path(posixpath.join(target, rel)))
                sent += size
        return sent

    def _host_data(self, host: Host, runner: HostRunner,
                   args: list[str]) -> tuple[int, dict[str, Any]]:
        """Run ``python -m trainer data ARGS`` on the host; its exit code and ``@data`` line
        (stderr goes to ``logs/data-<host>.log`` in the run dir)."""
        import json

        from trainer import data

        process = runner.start([*runner.trainer_command(), "data", *args],
                               runner.trainer_env(), None, self._log(host))
        report: dict[str, Any] = {}
        for line in process.stdout_lines():
            if line.startswith(data.REPORT_PREFIX):
                with contextlib.suppress(ValueError):
                    report = json.loads(line[len(data.REPORT_PREFIX):])
        code = process.wait()
        if not report and not runner.alive():  # lost meanwhile: a loss, not a data error
            raise HostLostError(host.id, f"host {host.id} was lost while it staged the data")
        return code, report

    def _log(self, host: Host) -> Path:
        return self.run_dir / layout.LOGS_DIR / f"data-{host.spec.name}.log"

