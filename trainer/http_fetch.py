"""Resumable HTTP(S) downloads with the standard library: one request from a byte offset, with
progress, and the file digests that verify them. The dataset fetcher (trainer/data.py) and the
hosts' bucket reader use it; it knows nothing of datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

USER_AGENT = "transient-orchestrator"
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60.0  # per socket operation, not for the whole download


class NoProgress(Exception):
    """An attempt that received nothing (refused, HTTP error, DNS): retrying will not help
    (a registry source); `code` is the HTTP status when there was one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def download_once(url: str, part: Path, have: int, report: Any,
                   extra_headers: dict[str, str] | None = None) -> bool:
    """One request from byte ``have``; True when complete, False when it dropped after
    receiving some bytes. Raises NoProgress when nothing arrived."""
    import http.client
    import urllib.error
    import urllib.request

    headers = {"User-Agent": USER_AGENT, **(extra_headers or {})}
    if have:
        headers["Range"] = f"bytes={have}-"
    received = 0
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=TIMEOUT_S) as resp:
            if have and resp.status != 206:  # the server ignored the range: start again
                have = 0
            length = resp.headers.get("Content-Length")
            total = have + int(length) if length is not None else None
            report(have, total)
            with open(part, "ab" if have else "wb") as out:
                while chunk := resp.read1(CHUNK_BYTES):  # what has arrived, at most this
                    out.write(chunk)
                    received += len(chunk)
                    report(have + received, total)
            # http.client returns b"" at an early EOF instead of raising: compare the length
            return total is None or have + received >= total
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # asked past the end: the part file is stale
            part.unlink()
            return download_once(url, part, 0, report, extra_headers)
        raise NoProgress(f"HTTP {err.code} {err.reason}", err.code) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        if received:
            return False
        reason = getattr(err, "reason", err)
        raise NoProgress(getattr(reason, "strerror", None) or str(reason)) from None


def md5_of(path: Path) -> str:
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
