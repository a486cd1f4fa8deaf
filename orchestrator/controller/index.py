"""The user's own list of detached sweeps, so a command can name one by its id.

``--detach`` records each sweep it submits in
``$XDG_CACHE_HOME/transient-orchestrator/sweeps/<sweep_id>.json`` (default ``~/.cache/...``):
``{"url": "gs://BUCKET/PREFIX/sweeps/<id>", "cwd": "<folder the command ran from>"}``. The URL is
what the commands need; the folder is where ``pull`` puts the results by default (where an
attached sweep would have written them). Another machine has no such record: there the commands
take the ``gs://`` URL itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.controller import layout
from trainer.data import APP_DIR

SWEEPS_DIR = "sweeps"


def index_dir() -> Path:
    """Where the records are (beside the tool's other caches)."""
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / APP_DIR / SWEEPS_DIR


def remember(urls: layout.SweepUrls, cwd: Path) -> Path:
    """Record a submitted sweep; returns the record's path. Written via a temporary file, so a
    reader never sees half a record."""
    folder = index_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{urls.sweep_id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"url": urls.root, "cwd": str(Path(cwd).resolve())}) + "\n")
    os.replace(tmp, path)
    return path


def lookup(sweep_id: str) -> tuple[layout.SweepUrls, Path | None] | None:
    """The sweep's URLs and the folder it was submitted from (None when not recorded), or
    None when this machine has no (readable) record of `sweep_id`."""
    if layout.sweep_id_problem(sweep_id):
        return None  # not an id: never a path outside the index
    try:
        data = json.loads((index_dir() / f"{sweep_id}.json").read_text())
        urls = layout.SweepUrls.parse(str(data["url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    cwd = data.get("cwd")
    return urls, Path(cwd) if isinstance(cwd, str) and cwd else None
