"""The sweep folder of a detached sweep, kept in the bucket (``sweeps/<id>/sweep/``).

The controller pushes its sweep folder every few seconds (:meth:`SweepMirror.push`: only the
files that changed since the last push, and deletions of files it had pushed), so what the bucket
holds is at most one push behind; the user's machine pulls it back (:meth:`SweepMirror.pull`:
only objects whose size differs from the local copy, so following a sweep costs its growth, not
its size). The mirror holds the files an attached sweep writes (``multirun.yaml``,
``runs.csv``, every point's config, plan, events, metrics, summary, logs and TensorBoard
files), except:

- lock files (``run.lock``, ``resume.lock``): an ``flock`` means something only on the machine
  that holds it; the file's content names the controller's host and pid;
- ``checkpoints/``: the checkpoint store already keeps them in the bucket
  (``<storage>/<run_id>/checkpoints``), where a resume restores them from; copying them here
  again would make every pull carry megabytes per checkpoint across the user's link;
- temporary files (``*.tmp``) of atomic writes, renamed away a moment later.

``runs.csv`` records each point's absolute ``run_dir``, a folder of the controller; a pull
rewrites those to the folder it pulled into, as an attached sweep's would read.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from orchestrator.resume import RESUME_LOCK_FILE
from orchestrator.rundir import results
from orchestrator.rundir.index import RUNS_CSV
from provisioning.gce.storage import GcsStore, GcsUrl

#: File names never mirrored (see the module's docstring).
SKIPPED_FILES = frozenset({results.LOCK_FILE, RESUME_LOCK_FILE})
#: Folders never mirrored.
SKIPPED_DIRS = frozenset({results.CHECKPOINT_DIR})
_RUN_DIR_COLUMN = "run_dir"


def mirrored(name: str) -> bool:
    """Whether the relative path `name` belongs in the mirror."""
    parts = Path(name).parts
    return (bool(parts) and parts[-1] not in SKIPPED_FILES and not parts[-1].endswith(".tmp")
            and not SKIPPED_DIRS.intersection(parts[:-1]))


class SweepMirror:
    """One sweep folder (`local_dir`) and its copy under `url` (``sweeps/<id>/sweep``)."""

    def __init__(self, store: GcsStore, local_dir: Path, url: GcsUrl) -> None:
        self.store, self.local_dir, self.url = store, Path(local_dir), url
        #: name -> (size, mtime_ns) of the local file as last pushed or pulled
        self._sent: dict[str, tuple[int, int]] = {}

    def _scan(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        if not self.local_dir.is_dir():
            return found
        for path in self.local_dir.rglob("*"):
            name = path.relative_to(self.local_dir).as_posix()
            if not mirrored(name):
                continue
            try:
                if path.is_file() and not path.is_symlink():
                    stat = path.stat()
                    found[name] = (stat.st_size, stat.st_mtime_ns)
            except OSError:  # removed while we looked
                continue
        return found

    def push(self) -> list[str]:
        """Upload the files that changed since the last push or pull (all of them the first
        time) and delete the objects of files that are gone since (a resume moves a failed
        attempt's files aside). Returns the uploaded names. A file that vanishes between the
        scan and its upload is left to the next push."""
        current = self._scan()
        changed = sorted(n for n, sig in current.items() if self._sent.get(n) != sig)
        uploaded = self._upload(changed)
        for name in uploaded:
            self._sent[name] = current[name]
        gone = sorted(set(self._sent) - set(current))
        if gone:
            self.store.delete(self.url, gone)
            for name in gone:
                del self._sent[name]
        return uploaded

    def _upload(self, names: list[str]) -> list[str]:
        """Upload `names`; those that disappeared locally meanwhile are skipped, not failed."""
        from provisioning.gce.storage import StorageError

        try:
            return self.store.upload(self.local_dir, self.url, names)
        except StorageError:
            there = [n for n in names if (self.local_dir / n).is_file()]
            if there == names:
                raise
            return self.store.upload(self.local_dir, self.url, there)

    def pull(self, dest: Path | None = None) -> list[str]:
        """Download the mirror into `dest` (default: the local folder): only objects missing
        there or of another size. Returns the names downloaded. ``runs.csv``'s ``run_dir``
        column is then made to name the points' folders under `dest`."""
        dest = Path(dest) if dest is not None else self.local_dir
        remote = {n: s for n, s in self.store.list(self.url).items()
                  if n and not n.endswith("/") and mirrored(n)}
        stale = [n for n, size in sorted(remote.items())
                 if not (dest / n).is_file() or (dest / n).stat().st_size != size]
        self.store.download(self.url, dest, stale)
        if RUNS_CSV in stale:
            rewrite_run_dirs(dest / RUNS_CSV, dest)
        if dest.resolve() == self.local_dir.resolve():
            for name in remote:  # pulled is as good as pushed: the next push skips it
                path = dest / name
                if path.is_file():
                    stat = path.stat()
                    self._sent[name] = (stat.st_size, stat.st_mtime_ns)
        return stale

    def push_file(self, path: Path, url: GcsUrl) -> bool:
        """Write one file (the console log) to the object `url` when it changed since the last
        call for it; True when it was written."""
        try:
            stat = Path(path).stat()
        except OSError:
            return False
        key, sig = f"file:{url}", (stat.st_size, stat.st_mtime_ns)
        if self._sent.get(key) == sig:
            return False
        self.store.write_bytes(url, Path(path).read_bytes())
        self._sent[key] = sig
        return True


def rewrite_run_dirs(csv_path: Path, dest: Path) -> bool:
    """Make the ``run_dir`` column of a pulled ``runs.csv`` name the point folders under `dest`
    (the controller's absolute folders mean nothing here). Only absolute paths whose last part
    is a folder of `dest` change; the rest of the file is left as it was. True when it changed."""
    try:
        with open(csv_path, newline="") as fh:
            text = fh.read()
    except OSError:
        return False
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or _RUN_DIR_COLUMN not in rows[0]:
        return False
    column = rows[0].index(_RUN_DIR_COLUMN)
    base = Path(os.path.abspath(dest))
    changed = False
    for row in rows[1:]:
        if len(row) <= column or not row[column].startswith("/"):
            continue
        point = Path(row[column]).name
        local = str(base / point)
        if row[column] != local and (base / point).is_dir():
            row[column], changed = local, True
    if changed:
        out = io.StringIO(newline="")
        csv.writer(out).writerows(rows)  # csv's defaults: the writer of runs.csv used them
        tmp = csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            fh.write(out.getvalue())
        os.replace(tmp, csv_path)
    return changed
