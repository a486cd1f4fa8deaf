"""The datasets the file-backed problems read (trainer/datasets.py): caching and fetching them.

``python -m trainer.data fetch cifar10`` downloads ahead of time, ``python -m trainer.data list``
shows the cache. The orchestrator calls :func:`fetch` before anything is provisioned when a
problem's files are missing and ``job.data_dir`` is unset (``orchestrator/data.py``). On a
remote host the deployer runs ``python -m trainer data fetch NAME --url U --md5 M --size S
--link data/NAME --report`` (the host downloads the archive itself, with the orchestrator's
checksum, into its own cache), ``fetch-gcs gs://... --manifest FILE --dest DIR`` (a VM
downloads a folder the orchestrator staged in Cloud Storage, each file checked against the
manifest's SHA-256; `trainer/gcs.py`) or ``digests DIR`` (what the host holds, so a push sends
only the rest); each answers with one ``@data {json}`` line.

Why not ``keras.utils.get_file`` (installed with TensorFlow) or tensorflow-datasets: get_file
writes the download under its final name (a killed process leaves a truncated archive there),
keeps a file whose checksum failed, re-extracts into the final folder on every call (a
half-extracted folder looks like data), cannot resume, draws Keras' own progress bar and costs
a TensorFlow import (seconds) in the orchestrator. tensorflow-datasets is not installed, pulls
many packages and converts CIFAR into its own TFRecord cache that our readers do not read. So
this module does the small part itself with the standard library, and rich's progress columns:
an HTTP ``Range`` resume of ``<archive>.part``, the published MD5, ``tarfile``'s ``data``
extraction filter into a temporary folder that is renamed into place (atomic on one
filesystem), and a lock so two runs sharing a cache do not fetch at once.

Cache layout (``cache_root()``): ``<root>/<dataset>/<archive folder>/`` (what the readers read,
present only when complete), ``<root>/<archive>.part`` while downloading, and an archive the
user placed by hand at ``<root>/<archive>`` is verified and extracted instead of downloading.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.datasets import DATASETS, MIRROR_ENV, Archive, Dataset, dataset_for, holds_files
from trainer.http_fetch import USER_AGENT, NoProgress, download_once, md5_of, sha256_of

CACHE_ENV = "TRANSIENT_DATA_CACHE"  # overrides the per-user cache folder
APP_DIR = USER_AGENT  # the tool's name: its cache folder, and its downloads' User-Agent
FETCH_ERROR_EXIT_CODE = 2  # as a config error: nothing was started, the user must act
INTERRUPTED_EXIT_CODE = 130
MAX_ATTEMPTS = 5  # a dropped connection is resumed while each attempt makes progress
RETRY_PAUSE_S = 1.0  # times the attempt number, before resuming a dropped download


class FetchError(Exception):
    """A dataset could not be obtained; ``str()`` is one line naming the URL, the cache folder
    and how to place the files by hand."""


class SourceUnreachable(FetchError):
    """Nothing arrived from the source (refused, no route, DNS, an HTTP error): the host may
    simply have no way out, so the orchestrator can bring the files another way. A download
    that arrived but does not verify is a plain FetchError: nothing is used then."""


def cache_root(configured: str | None = None) -> Path:
    """The per-user cache: the configured folder, else $TRANSIENT_DATA_CACHE, else
    ``$XDG_CACHE_HOME/transient-orchestrator/datasets`` (default ``~/.cache/...``)."""
    chosen = configured or os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / APP_DIR / "datasets"


def cached_folder(ds: Dataset, root: Path) -> Path:
    """Where ``ds`` lives in the cache (whether or not it is there yet)."""
    return root / ds.name


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def manual_hint(ds: Dataset, root: Path, archive: Archive | None = None) -> str:
    """How to place the files by hand, for error lines."""
    a = archive or ds.archive()
    return (f"download it elsewhere and put {a.filename} (MD5 {a.md5}) in {root}, or its "
            f"extracted {a.folder}/ in {cached_folder(ds, root)}, or set job.data_dir")


def fetch(ds: Dataset, root: Path, fmt: str | None = None, console: Any = None,
          progress: bool = True) -> Path:
    """The cached folder of ``ds``, downloading, verifying and extracting it when missing.

    Raises FetchError (one line) when it cannot be downloaded or does not verify; a bad
    download is deleted, an interrupted one (``<archive>.part``) is resumed by the next call.
    """
    target = cached_folder(ds, root)
    if holds_files(ds.problem, target):
        return target
    archive = ds.archive(fmt)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{ds.name}.lock"):
        if holds_files(ds.problem, target):  # another process fetched it while we waited
            return target
        placed = root / archive.filename
        if placed.is_file():
            _verify(placed, archive, ds, root, delete=False)
            _extract(placed, archive, ds, target)
            return target
        part = root / f"{archive.filename}.part"
        _download(archive, part, ds, root, console, progress)
        _verify(part, archive, ds, root, delete=True)
        try:
            _extract(part, archive, ds, target)
        except _WrongContents:
            part.unlink()  # verified, yet not what the reader needs: a wrong registry entry
            raise
        part.unlink()
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _download(archive: Archive, part: Path, ds: Dataset, root: Path, console: Any,
              show: bool) -> None:
    """Fetch ``archive`` into ``part``, resuming what is there; retry while attempts progress."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    url = archive.source_url()
    console = console or Console(stderr=True)
    started, resumed_from = time.monotonic(), part.stat().st_size if part.exists() else 0
    if resumed_from == archive.size:  # complete from an earlier call that stopped before verifying
        return
    # The bar appears with the first answer, so an offline run prints its one error line only.
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                   TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                   disable=not show)
    task = bar.add_task(f"{ds.name}: {archive.filename}", total=archive.size,
                        completed=resumed_from)

    def report(done: int, total: int | None) -> None:
        if not bar.live.is_started:
            bar.start()
        bar.update(task, completed=done, total=total or archive.size)

    try:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            have = part.stat().st_size if part.exists() else 0
            try:
                if download_once(url, part, have, report):
                    break
            except NoProgress as err:
                raise SourceUnreachable(f"could not download {url}: {err}; cache folder "
                                        f"{root}: {manual_hint(ds, root, archive)}") from None
            if attempt == MAX_ATTEMPTS:
                raise FetchError(f"could not download {url}: the connection dropped "
                                 f"{MAX_ATTEMPTS} times ({part} keeps what arrived; run again "
                                 f"to resume); cache folder {root}: "
                                 f"{manual_hint(ds, root, archive)}")
            time.sleep(min(RETRY_PAUSE_S * attempt, 10.0))
    finally:
        bar.stop()
    got = part.stat().st_size
    console.print(f"{ds.name}: downloaded {got - resumed_from:,} bytes from {url} in "
                  f"{time.monotonic() - started:.1f} s"
                  + (f" (resumed at byte {resumed_from:,})" if resumed_from else ""),
                  highlight=False)


def _verify(path: Path, archive: Archive, ds: Dataset, root: Path, delete: bool) -> None:
    got = md5_of(path)
    if got != archive.md5:
        if delete:
            path.unlink()
        fate = "deleted it" if delete else f"left it at {path}; delete or replace it"
        source = archive.source_url() if delete else "the cache folder"
        raise FetchError(f"{archive.filename} from {source} has MD5 {got}, expected "
                         f"{archive.md5} (corrupted or not the published archive; {fate}); "
                         f"cache folder {root}: {manual_hint(ds, root, archive)}")


class _WrongContents(FetchError):
    """The archive verified but lacks the reader's files."""


def _extract(path: Path, archive: Archive, ds: Dataset, target: Path) -> None:
    """Unpack into a temporary folder beside ``target`` and rename the finished folder in."""
    import tarfile

    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".extract-{archive.folder}-", dir=target))
    try:
        with tarfile.open(path, "r:*") as tar:
            tar.extractall(tmp, filter="data")  # no absolute paths, links or devices
        if not holds_files(ds.problem, tmp / archive.folder):
            raise _WrongContents(f"{path.name} does not hold {archive.folder}/ with the "
                             f"{ds.problem} files; remove it and fetch again")
        final = target / archive.folder
        if final.exists():  # an incomplete folder placed by hand: replace it
            final.rename(tmp / "incomplete")
        os.replace(tmp / archive.folder, final)
    except (tarfile.TarError, OSError) as err:
        raise FetchError(f"could not extract {path} into {target}: {err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_entries(root: Path) -> list[dict[str, Any]]:
    """What ``list`` shows: one row per dataset, plus partial downloads."""
    rows = []
    for ds in DATASETS.values():
        folder = cached_folder(ds, root)
        present = holds_files(ds.problem, folder)
        partial = [root / f"{a.filename}.part" for a in ds.archives]
        partial_bytes = sum(p.stat().st_size for p in partial if p.exists())
        rows.append({"dataset": ds.name, "problem": ds.problem, "present": present,
                     "folder": folder, "bytes": folder_bytes(folder) if folder.exists() else 0,
                     "partial_bytes": partial_bytes, "download_bytes": ds.archive().size})
    return rows


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def digests(folder: Path) -> dict[str, list[Any]]:
    """``{relative POSIX path: [size, sha256]}`` of every file under ``folder`` ({} when it is
    missing): what a host already holds, so a push sends only what differs."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): [p.stat().st_size, sha256_of(p)]
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def link_folder(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` (a symlink, replaced atomically): a run's work dir names
    the host's dataset cache, which outlives the run. A real folder there (a copy an older
    version staged into the work dir) is removed first."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)


REPORT_PREFIX = "@data "  # the one stdout line a host-side command answers with (--report)
UNREACHABLE_EXIT_CODE = 3  # --report: the source could not be reached from here


def _report(**fields: Any) -> None:
    import json

    print(REPORT_PREFIX + json.dumps(fields), flush=True)


def _host_fetch(args: argparse.Namespace, root: Path) -> int:
    """``fetch NAME --url U --md5 M --size S [--link L] --report``: what the orchestrator runs
    on a host that fetches its own copy. The URL and checksum come from the orchestrator's
    registry (the host's could be an older version); answers with one ``@data`` line."""
    from dataclasses import replace

    from rich.console import Console  # on every host: Keras depends on it

    ds = dataset_for(args.names[0])
    archive = ds.archive(args.format)
    if args.url:
        archive = replace(archive, url=args.url, md5=args.md5 or archive.md5,
                          size=args.size or archive.size)
    ds = replace(ds, archives=(archive,))
    if args.url:  # the URL given is the source: a mirror set on the host must not redirect it
        os.environ.pop(MIRROR_ENV, None)
    try:
        had = holds_files(ds.problem, cached_folder(ds, root))
        folder = fetch(ds, root, console=Console(stderr=True), progress=False)
        if args.link:
            link_folder(folder, Path(args.link))
    except SourceUnreachable as err:
        _report(status="unreachable", line=str(err))
        return UNREACHABLE_EXIT_CODE
    except (FetchError, OSError) as err:
        _report(status="failed", line=str(err))
        return FETCH_ERROR_EXIT_CODE
    _report(status="ok", folder=str(folder), cached=had, bytes=folder_bytes(folder))
    return 0


def fetch_objects(url: str, manifest: dict[str, list[Any]], dest: Path,
                  endpoint: str | None = None) -> tuple[int, int]:
    """Make ``dest`` hold every file of `manifest` (``{relative path: [size, sha256]}``, the
    orchestrator's `digests`) from the objects ``<url>/<relative path>`` (``gs://``), each
    verified against its entry; files already there with that size and digest are kept.
    Returns (files downloaded, their bytes). Each file goes to ``.<name>.part`` first and is
    renamed into place once verified; a dropped connection is resumed, a rate limit or server
    error retried. Raises SourceUnreachable when the bucket cannot be read from here (no
    route, no token, 401/403/404: the orchestrator may bring the files another way) and
    FetchError when what arrived does not verify (deleted; nothing unverified is used)."""
    from trainer import gcs

    bucket, prefix = gcs.split_url(url)
    root = gcs.storage_root(endpoint)
    bad = [rel for rel in manifest if rel.startswith("/") or ".." in Path(rel).parts]
    if bad:
        raise FetchError(f"manifest names {bad[0]!r}, which would land outside {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    fetched = fetched_bytes = 0
    with _locked(dest.parent / f".{dest.name}.lock"):  # runs sharing the host's cache
        for rel, (size, digest) in sorted(manifest.items()):
            path = dest / rel
            if path.is_file() and path.stat().st_size == size and sha256_of(path) == digest:
                continue
            name = f"{prefix}/{rel}" if prefix else rel
            where = f"gs://{bucket}/{name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_name(f".{path.name}.part")
            part.unlink(missing_ok=True)  # resumed within this call only: same object
            _fetch_object(gcs.media_url(root, bucket, name), part, where, root)
            got_size, got = part.stat().st_size, sha256_of(part)
            if (got_size, got) != (size, digest):
                part.unlink()
                raise FetchError(f"{where} has {got_size} bytes with SHA-256 {got}, expected "
                                 f"{size} bytes with {digest} (changed or corrupted since the "
                                 f"orchestrator listed it; deleted it)")
            os.replace(part, path)
            fetched, fetched_bytes = fetched + 1, fetched_bytes + size
    return fetched, fetched_bytes


def _fetch_object(media: str, part: Path, where: str, root: str) -> None:
    """Download one object into `part`, resuming a dropped connection and retrying a rate
    limit or server error (MAX_ATTEMPTS, pausing longer each time)."""
    from trainer import gcs

    for attempt in range(1, MAX_ATTEMPTS + 1):
        headers = {}
        if gcs.wants_token(root):
            try:
                headers["Authorization"] = f"Bearer {gcs.access_token()}"
            except gcs.NoToken as err:
                raise SourceUnreachable(f"cannot read {where}: {err}") from None
        have = part.stat().st_size if part.exists() else 0
        try:
            if download_once(media, part, have, lambda *_: None, headers):
                return
        except NoProgress as err:
            if err.code not in gcs.TRANSIENT_HTTP or attempt == MAX_ATTEMPTS:
                raise SourceUnreachable(f"cannot read {where}: {err}") from None
        if attempt == MAX_ATTEMPTS:
            raise FetchError(f"could not download {where}: the connection dropped "
                             f"{MAX_ATTEMPTS} times")
        time.sleep(min(RETRY_PAUSE_S * attempt, 10.0))


def _host_fetch_gcs(args: argparse.Namespace) -> int:
    """``fetch-gcs gs://... --manifest FILE --dest DIR [--link L]``: what the orchestrator runs
    on a VM that downloads a staged dataset itself; answers with one ``@data`` line."""
    import json

    dest = Path(args.dest).absolute()  # the link names it from elsewhere
    try:
        manifest = json.loads(Path(args.manifest).read_text())
        fetched, sent = fetch_objects(args.url, manifest, dest, args.endpoint)
        if args.link:
            link_folder(dest, Path(args.link))
    except SourceUnreachable as err:
        _report(status="unreachable", line=str(err))
        return UNREACHABLE_EXIT_CODE
    except (FetchError, OSError, ValueError) as err:
        _report(status="failed", line=str(err))
        return FETCH_ERROR_EXIT_CODE
    _report(status="ok", folder=str(dest), cached=not fetched, files=fetched, bytes=sent)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer.data {fetch NAME... | fetch-gcs URL | list | digests DIR | link
    TARGET LINK}``; exit 2 with one line on failure."""
    from rich.console import Console
    from rich.table import Table

    from trainer.layout import version_line

    parser = argparse.ArgumentParser(prog="python -m trainer.data",
                                     description="Fetch and list the cached datasets.")
    parser.add_argument("--version", action="version", version=version_line("trainer.data"),
                        help="print the tool's version and exit")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", help=f"cache folder (default: ${CACHE_ENV} or "
                        f"$XDG_CACHE_HOME/{APP_DIR}/datasets)")
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", parents=[common],
                         help="download, verify and extract into the cache")
    get.add_argument("names", nargs="+", help=f"dataset ({', '.join(DATASETS)}) or problem name")
    get.add_argument("--format", choices=("bin", "py"), help="archive format (default: bin)")
    # what the orchestrator passes to a host fetching its own copy (one NAME)
    get.add_argument("--url", help="fetch the archive from this URL instead")
    get.add_argument("--md5", help="the archive's MD5 (with --url)")
    get.add_argument("--size", type=int, help="the archive's size in bytes (with --url)")
    get.add_argument("--link", help="then make this path a symlink to the dataset's folder")
    get.add_argument("--report", action="store_true",
                     help="answer with one '@data {json}' line; exit 3 when unreachable")
    sub.add_parser("list", parents=[common], help="what is cached, where, and how big")
    dig = sub.add_parser("digests", help="size and SHA-256 of every file under DIR, as JSON")
    dig.add_argument("dir")
    dig.add_argument("--link", help="first make this path a symlink to DIR")
    gcs = sub.add_parser("fetch-gcs", help="download the files of a manifest from gs://... "
                         "into DIR, each verified (one '@data {json}' line; exit 3 when the "
                         "bucket cannot be read from here)")
    gcs.add_argument("url", help="gs://BUCKET/PREFIX holding the manifest's relative paths")
    gcs.add_argument("--manifest", required=True,
                     help="JSON file: {relative path: [size, sha256]}")
    gcs.add_argument("--dest", required=True, help="the folder to fill")
    gcs.add_argument("--link", help="then make this path a symlink to DIR")
    gcs.add_argument("--endpoint", help="Cloud Storage JSON API root (default: "
                     "$TRANSIENT_STORAGE_URL or https://storage.googleapis.com)")
    lnk = sub.add_parser("link", help="make LINK a symlink to the folder TARGET")
    lnk.add_argument("target")
    lnk.add_argument("link")
    args = parser.parse_args(argv)
    if args.command == "link":
        link_folder(Path(args.target), Path(args.link))
        return 0
    if args.command == "digests":
        folder = Path(args.dir)
        if args.link:
            folder.mkdir(parents=True, exist_ok=True)
            link_folder(folder, Path(args.link))
        _report(files=digests(folder))
        return 0
    if args.command == "fetch-gcs":
        return _host_fetch_gcs(args)
    root = cache_root(args.cache_dir)
    if getattr(args, "report", False):
        return _host_fetch(args, root)
    console = Console()
    if args.command == "list":
        table = Table(title=f"datasets in {root}", title_justify="left")
        for col in ("dataset", "problem", "status", "size", "folder"):
            table.add_column(col)
        for r in cache_entries(root):
            status = "cached" if r["present"] else (
                f"partial download {human_bytes(r['partial_bytes'])}" if r["partial_bytes"]
                else f"not cached ({human_bytes(r['download_bytes'])} to download)")
            table.add_row(r["dataset"], r["problem"], status,
                          human_bytes(r["bytes"]) if r["present"] else "-", str(r["folder"]))
        console.print(table)
        return 0
    try:
        for name in args.names:
            ds = dataset_for(name)
            folder = fetch(ds, root, fmt=args.format, console=console)
            console.print(f"{ds.name}: {folder} ({human_bytes(folder_bytes(folder))})",
                          highlight=False)
    except (KeyError, ValueError) as err:
        print(f"data error: {err.args[0]}", file=sys.stderr)
        return FETCH_ERROR_EXIT_CODE
    except FetchError as err:
        print(f"data error: {err}", file=sys.stderr)
        return FETCH_ERROR_EXIT_CODE
    except KeyboardInterrupt:
        print(f"interrupted: the next fetch resumes the partial download in {root}",
              file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
