"""Test helpers: CIFAR archives in the real layouts and a local HTTP server that can misbehave.

The archives hold small files written in exactly the real formats (by the writers of
test_trainer_cifar.py) under the real top-level folder names, plus the real side files. The
server runs on 127.0.0.1 in a thread, answers ``Range`` requests like the real one (206), and
can drop a response halfway, ignore ranges, or answer an HTTP error, to order.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from test_trainer_cifar import (
    write_cifar10_bin,
    write_cifar100_bin,
    write_cifar_pickle,
)

# archive file name -> (dataset, format, folder inside)
REAL_ARCHIVES = {
    "cifar-10-binary.tar.gz": ("cifar10", "bin", "cifar-10-batches-bin"),
    "cifar-10-python.tar.gz": ("cifar10", "py", "cifar-10-batches-py"),
    "cifar-100-binary.tar.gz": ("cifar100", "bin", "cifar-100-binary"),
    "cifar-100-python.tar.gz": ("cifar100", "py", "cifar-100-python"),
}
SIDE_FILES = {  # what the real archives hold besides the batches
    "cifar-10-batches-bin": ["batches.meta.txt", "readme.html"],
    "cifar-10-batches-py": ["batches.meta", "readme.html"],
    "cifar-100-binary": ["coarse_label_names.txt", "fine_label_names.txt"],
    "cifar-100-python": ["meta", "file.txt~"],
}


@dataclass
class ServedArchive:
    name: str
    data: bytes
    truth: dict[str, tuple]  # file name -> (images, labels), as the reader should return them

    @property
    def md5(self) -> str:
        return hashlib.md5(self.data).hexdigest()


def make_archive(name: str, seed: int = 0, skip: str | None = None) -> ServedArchive:
    """The ``name`` archive (a real file name) with small batches; ``skip`` leaves a file out."""
    _, fmt, folder = REAL_ARCHIVES[name]
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if fmt == "bin":
            truth = (write_cifar10_bin if "-10-" in name else write_cifar100_bin)(root, rng)
        else:
            truth = write_cifar_pickle(root, rng, hundred="-100-" in name)
        for side in SIDE_FILES[folder]:
            (root / folder / side).write_text("side file\n")
        if skip:
            (root / folder / skip).unlink()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(root / folder, arcname=folder)
    return ServedArchive(name, buf.getvalue(), truth)


@dataclass
class Behaviour:
    """What the server does with the next requests (tests change it between fetches)."""

    files: dict[str, bytes] = field(default_factory=dict)
    drop_after: int | None = None  # send this many body bytes, then close the connection
    drops: int = 0  # how many responses to drop that way
    honour_range: bool = True
    status: int | None = None  # answer every request with this HTTP error
    status_after_drop: int | None = None  # becomes `status` once a response was dropped
    trickle_s: float = 0.0  # pause after each 4 KiB of body (a slow link)
    requests: list[dict] = field(default_factory=list)  # path, range, bytes sent


class _Handler(http.server.BaseHTTPRequestHandler):
    behaviour: Behaviour

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        b = self.server.behaviour  # type: ignore[attr-defined]
        record = {"path": self.path, "range": self.headers.get("Range"), "sent": 0,
                  "client": self.client_address[0]}
        b.requests.append(record)
        name = self.path.rsplit("/", 1)[-1]
        if b.status is not None or name not in b.files:
            self.send_error(b.status or 404)
            return
        body, start = b.files[name], 0
        rng = self.headers.get("Range")
        if rng and b.honour_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if b.drops and b.drop_after is not None:
            b.drops -= 1
            payload = payload[:b.drop_after]
            self.close_connection = True
            b.status = b.status_after_drop
        step = 4096 if b.trickle_s else len(payload) or 1
        try:
            for i in range(0, len(payload), step):
                self.wfile.write(payload[i:i + step])
                self.wfile.flush()
                record["sent"] += len(payload[i:i + step])
                time.sleep(b.trickle_s)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True


class ArchiveServer:
    """``with ArchiveServer() as srv:`` serves ``srv.behaviour.files`` at ``srv.base_url``."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.behaviour = Behaviour()  # `address`: e.g. a test bed's bridge, for its hosts
        self._httpd = http.server.ThreadingHTTPServer((address, 0), _Handler)
        self._httpd.behaviour = self.behaviour  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ArchiveServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def refused_url() -> str:
    """A loopback URL where nothing listens (bind a port, then free it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
