"""A real SSH server (paramiko's server side) on 127.0.0.1 that boots like a fresh cloud VM.

A Compute Engine VM is RUNNING before it takes logins (real-cloud-audit.md row 6). From the
moment `start()` is called (the VM became RUNNING), in order:

- for `refuse_s`: nothing listens on the port (the TCP connect is refused; the port is held
  by a bound, non-listening socket so nobody else takes it);
- until `banner_s`: connections are accepted and closed before the SSH banner (sshd not up yet);
- until `login_s`: the handshake completes but every login is refused (the guest agent has not
  created the account yet, or `pam_nologin`: "System is booting up");
- then: `user` with the key whose public half is `authorized_key` logs in; any other user or
  key is refused forever (a wrong key on a VM that is up).

It serves logins only (no sessions); global requests (the client's heartbeat) are answered. `logins` counts successful authentications, `first_login_at` is when the first one
happened (monotonic), so a benchmark can read the time from RUNNING to the first login.
Everything runs on loopback in daemon threads; `stop()` closes every socket.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import paramiko


class _Server(paramiko.ServerInterface):
    def __init__(self, owner: BootingSshd) -> None:
        self.owner = owner

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        owner = self.owner
        if time.monotonic() < owner.started_at + owner.login_s:
            return paramiko.AUTH_FAILED  # "System is booting up" / account not created yet
        if username == owner.user and key.get_base64() == owner.authorized_blob:
            with owner.lock:
                owner.logins += 1
                if owner.first_login_at is None:
                    owner.first_login_at = time.monotonic()
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_global_request(self, kind: str, msg: paramiko.Message) -> bool:
        return True  # keepalive@openssh.com: the client's heartbeat


class BootingSshd:
    """See the module docstring. `address` is where it listens (default 127.0.0.1)."""

    def __init__(self, authorized_key: Path, user: str = "transient", refuse_s: float = 0.0,
                 banner_s: float = 0.0, login_s: float = 0.0, address: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.user = user
        self.authorized_blob = Path(authorized_key).read_text().split()[1]
        self.refuse_s, self.banner_s, self.login_s = refuse_s, banner_s, login_s
        self.host_key = paramiko.ECDSAKey.generate()
        self.lock = threading.Lock()
        self.logins = 0
        self.first_login_at: float | None = None
        self.started_at = 0.0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))  # bound, not listening: connects are refused
        self.address, self.port = self._sock.getsockname()[:2]
        self._stopped = threading.Event()
        self._transports: list[paramiko.Transport] = []

    def known_hosts_line(self) -> str:
        """The line a client's known_hosts needs for this server."""
        where = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{where} {self.host_key.get_name()} {self.host_key.get_base64()}"

    def start(self) -> BootingSshd:
        """The VM is RUNNING now: the boot phases count from here."""
        self.started_at = time.monotonic()
        if self.refuse_s <= 0:
            self._listen()
        threading.Thread(target=self._serve, name="booting-sshd", daemon=True).start()
        return self

    def _listen(self) -> None:
        self._sock.listen(16)
        self._sock.settimeout(0.1)

    def _serve(self) -> None:
        if self.refuse_s > 0:
            if self._stopped.wait(self.refuse_s):
                return
            with contextlib.suppress(OSError):  # stopped meanwhile
                self._listen()
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            if time.monotonic() < self.started_at + self.banner_s:
                conn.close()  # sshd not up yet: the client reads no banner
                continue
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        with self.lock:
            self._transports.append(transport)
        with contextlib.suppress(Exception):
            transport.start_server(server=_Server(self))
            while transport.is_active() and not self._stopped.is_set():
                time.sleep(0.1)

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self.lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            with contextlib.suppress(Exception):
                transport.close()

    def __enter__(self) -> BootingSshd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
