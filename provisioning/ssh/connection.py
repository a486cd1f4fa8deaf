"""One SSH connection per machine (paramiko), with bounded commands and a liveness heartbeat.

paramiko's traps (gce-notes §F) and what this module does about each:
- `recv_exit_status()` and `global_request(wait=True)` can wait forever: every command here has
  a deadline, and the heartbeat waits for its reply in a helper thread, at most
  `heartbeat_timeout_s`.
- `set_keepalive` never gives up on a dead peer, and TCP notices a cut link only after minutes:
  the heartbeat (an OpenSSH `keepalive@openssh.com` global request, answered by every sshd)
  declares the machine lost after one unanswered beat, and the socket itself has TCP keepalive
  and `TCP_USER_TIMEOUT` as a second line. A cut link is reported within
  `heartbeat_interval_s + heartbeat_timeout_s`.
- sshd's `MaxStartups` drops handshakes beyond 10 at once: a process-wide semaphore caps
  concurrent handshakes, and banner/EOF errors are retried with backoff.
- A freshly booted cloud VM is RUNNING before it takes logins: the TCP connect is refused,
  the banner times out, and the login is refused while the guest agent creates the account or
  `pam_nologin` says "System is booting up" (SkyPilot waits up to 10 min for the same).
  With `SshTimeouts.boot_timeout_s` set, `connect` retries all of these with backoff until
  then and fails with ONE line naming the machine and the last error; a refused key is retried
  only for `login_grace_s` after sshd first answered, so a wrong key or user on a VM that is
  clearly up is still reported as that. Without it (`provider=ssh`), nothing is waited for.
- A command's exit status is not the end of its output: sshd sends `exit-status` when it reaps
  the command and forwards what is still in the command's pipe after it (RFC 4254 orders
  nothing between them), so a reader that stops at the status loses the last lines now and
  then (a launch's pid, a role's `train_end`, under load). Readers stop at the channel's EOF
  (`ChannelEnd`), waiting at most `EOF_AFTER_STATUS_S` for it after the status (a command
  that left a child holding its stdout sends no EOF).
- One `SSHClient` must not be shared carelessly across threads: channels are opened under a
  lock, SFTP is used under its own lock, and no channel is read by two threads.

Host keys are checked against `known_hosts` with paramiko's `RejectPolicy` unless first-use
pinning is opted in; authentication is by key file only (no agent, no password, no key search).
No key material, passphrase or key content is ever put into a message: errors name the key
*path* the user configured, never its contents.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from provisioning.base import BadRequestError, ProvisionError

log = logging.getLogger(__name__)
# paramiko logs every handshake and SFTP session at INFO, and a dropped handshake as an ERROR
# with a traceback; each of those failures reaches us as an exception that this module turns
# into one line naming the machine, so a run's log keeps our own lines only.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

#: paramiko's exceptions that mean "the handshake was dropped, try again" (sshd MaxStartups).
_RETRYABLE = (paramiko.SSHException, EOFError, ConnectionResetError)
_KEEPALIVE_REQUEST = "keepalive@openssh.com"
#: After a command's exit status, how long its output may still be coming (module docstring).
EOF_AFTER_STATUS_S = 10.0


class ChannelEnd:
    """Says when an exec channel has delivered all it will: its output ends with the remote
    EOF (or the channel's close), not with the exit status that may come before the last of
    it (module docstring). A status without an EOF ends it `grace_s` later."""

    def __init__(self, channel: paramiko.Channel, grace_s: float = EOF_AFTER_STATUS_S) -> None:
        self.channel = channel
        self.grace_s = grace_s
        self._status_at: float | None = None

    def reached(self) -> bool:
        """True when nothing is buffered and nothing more will come."""
        channel = self.channel
        if channel.recv_ready() or channel.recv_stderr_ready():
            return False
        if channel.closed or (channel.eof_received and channel.status_event.is_set()):
            return not (channel.recv_ready() or channel.recv_stderr_ready())
        if not channel.status_event.is_set():
            return False
        if self._status_at is None:
            self._status_at = time.monotonic()
        return time.monotonic() - self._status_at >= self.grace_s

    def wait(self, timeout_s: float) -> None:
        """Sleep until data or the status may have come (at most `timeout_s`)."""
        if self.channel.status_event.is_set():
            time.sleep(timeout_s)  # the event stays set: waiting on it would spin
        else:
            self.channel.status_event.wait(timeout_s)


class HostKeyError(BadRequestError):
    """The host's key is unknown (and pinning is off) or differs from the pinned one."""


class SshUnreachableError(ProvisionError):
    """The machine could not be reached or refused us; the message says which and why."""


class AuthRefusedError(BadRequestError):
    """sshd answered but refused our key for this user (a wrong key or user, or a VM whose
    account does not exist yet)."""


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect. `label` names the machine in messages."""

    label: str
    address: str
    port: int
    user: str
    key_path: str


@dataclass(frozen=True)
class SshTimeouts:
    connect_s: float = 10.0  # TCP connect, banner and auth, each
    command_s: float = 60.0  # one short command (not a role, not setup)
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 6.0
    connect_attempts: int = 4  # handshakes tried on banner/EOF errors, with backoff
    boot_timeout_s: float = 0.0  # > 0: a booting machine, retry refusals until then (GCE)
    login_grace_s: float = 60.0  # with boot_timeout_s: how long a refused key is retried
    boot_retry_max_s: float = 5.0  # longest pause between two attempts on a booting machine


class _PinningPolicy(paramiko.MissingHostKeyPolicy):
    """Trust on first use: accept an unknown host's key, save it to known_hosts, log its
    fingerprint (the pinned key is recorded). A *changed* key still fails (BadHostKeyException
    comes before any policy)."""

    def __init__(self, known_hosts: Path, on_pin: Callable[[str, str], None]) -> None:
        self.known_hosts = known_hosts
        self.on_pin = on_pin
        self._lock = threading.Lock()

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        with self._lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with open(self.known_hosts, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        self.on_pin(hostname, key.fingerprint)  # "SHA256:...", a public fact


_handshake_slots = threading.BoundedSemaphore(8)  # below sshd's default MaxStartups of 10


def set_handshake_limit(limit: int) -> None:
    """Cap concurrent SSH handshakes of this process (all machines together)."""
    global _handshake_slots
    _handshake_slots = threading.BoundedSemaphore(max(1, limit))


def _keepalive_socket(target: SshTarget, timeout_s: float) -> socket.socket:
    sock = socket.create_connection((target.address, target.port), timeout=timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Every exchange here is a small request waiting for its answer: without NODELAY, Nagle
    # holds a request written while the previous one is unacknowledged until the peer's
    # delayed ACK (~40 ms on Linux), which opening a second channel hit every time.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", 10_000)):
        if hasattr(socket, name):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    return sock


class ByteCounter:
    """Bytes written to a machine's sockets, over all its connections (reconnects included):
    what crossed the orchestrator's uplink to it, SSH framing and encryption counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


class _CountingSocket:
    """The connection's socket, counting what paramiko sends (its packetizer calls `send`);
    every other attribute is the socket's own."""

    def __init__(self, sock: socket.socket, counter: ByteCounter) -> None:
        self._sock = sock
        self._counter = counter

    def send(self, data: bytes) -> int:
        n = self._sock.send(data)
        self._counter.add(n)
        return n

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        self._counter.add(len(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


class CommandTimeout(ProvisionError):
    """A short command did not finish within its deadline (the machine hangs or is cut off)."""


class SshConnection:
    """The connection to one machine. Marks itself lost (and closes) on a missed heartbeat or a
    dead transport; `lost` is then set and `lost_reason` says why."""

    def __init__(self, target: SshTarget, known_hosts: Path, trust_on_first_use: bool,
                 timeouts: SshTimeouts, on_pin: Callable[[str, str], None] | None = None,
                 on_lost: Callable[[SshConnection], None] | None = None,
                 sent: ByteCounter | None = None) -> None:
        self.target = target
        self.sent = sent or ByteCounter()  # shared by a machine's successive connections
        self.known_hosts = Path(known_hosts).expanduser()
        self.trust_on_first_use = trust_on_first_use
        self.timeouts = timeouts
        self._on_pin = on_pin or (lambda host, fp: None)
        self._on_lost = on_lost
        self.lost = threading.Event()
        self.lost_reason = ""
        self._client: paramiko.SSHClient | None = None
        self._channel_lock = threading.Lock()
        self._sftp_lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        self._session: tuple[int, int] | tuple[()] | None = None  # session_process, once
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.attempts = 0  # connection attempts the last connect() made (a booting machine)

    # --- connecting ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Handshake, check the host key, authenticate by key; start the heartbeat. A booting
        machine (`timeouts.boot_timeout_s` > 0) is waited for (module docstring).

        Raises HostKeyError, SshUnreachableError or BadRequestError (the key file cannot be
        read or is refused), each with a one-line message naming the machine."""
        boot_s = self.timeouts.boot_timeout_s
        if boot_s <= 0:
            self._connect_once()
            return
        started = time.monotonic()
        answered: float | None = None  # when sshd first answered (refused our login)
        delay = 1.0
        self.attempts = 0
        while True:
            self.attempts += 1
            try:
                self._connect_once()
                return
            except AuthRefusedError as error:
                now = time.monotonic()
                answered = now if answered is None else answered
                if now - answered >= self.timeouts.login_grace_s:
                    raise AuthRefusedError(
                        f"{error} -- sshd has answered for {now - answered:.0f} s, so the VM is "
                        "up: check the key and user") from None
                last: ProvisionError = error
            except SshUnreachableError as error:
                last = error
            now = time.monotonic()
            if now + delay - started > boot_s:
                raise SshUnreachableError(
                    f"ssh host {self._where()}: no login within {boot_s:g} s of boot "
                    f"({self.attempts} attempts), last error: {last}") from None
            log.info("ssh host %s not ready (%s), retrying in %.1f s", self._where(), last, delay)
            if self._closed.wait(delay):  # closed meanwhile: its machine is gone (declare_lost)
                raise SshUnreachableError(f"ssh host {self._where()}: given up while waiting "
                                          f"for its boot, last error: {last}")
            delay = min(delay * 1.5, self.timeouts.boot_retry_max_s)

    def _connect_once(self) -> None:
        delay = 0.5
        for attempt in range(1, self.timeouts.connect_attempts + 1):
            try:
                with _handshake_slots:
                    started = time.monotonic()
                    self._client = self._handshake()
                break
            except (HostKeyError, BadRequestError, SshUnreachableError):
                raise
            except _RETRYABLE as error:
                if time.monotonic() - started >= 0.9 * self.timeouts.connect_s:
                    # A host that accepts TCP but never answers (a frozen sshd or machine):
                    # only a quick drop (sshd's MaxStartups) is worth another handshake.
                    raise SshUnreachableError(
                        f"ssh host {self._where()} does not answer: no SSH handshake within "
                        f"{self.timeouts.connect_s:g} s ({_one_line(error)})") from None
                if attempt == self.timeouts.connect_attempts:
                    raise SshUnreachableError(
                        f"ssh host {self._where()}: handshake failed {attempt} times: "
                        f"{_one_line(error)}") from None
                time.sleep(delay)
                delay *= 2
        transport = self._client.get_transport()
        assert transport is not None
        self._heartbeat = threading.Thread(target=self._beat, name=f"ssh-heartbeat-{self.target.label}",
                                           daemon=True)
        self._heartbeat.start()

    def _where(self) -> str:
        t = self.target
        return f"{t.label} ({t.user}@{t.address}:{t.port})"

    def _handshake(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        if self.trust_on_first_use:
            client.set_missing_host_key_policy(_PinningPolicy(self.known_hosts, self._on_pin))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        started = time.monotonic()
        try:
            sock = _keepalive_socket(t, self.timeouts.connect_s)
        except OSError as error:  # the time it took: a refusal or no route is quick
            raise SshUnreachableError(
                f"ssh host {self._where()} unreachable: {_one_line(error) or 'timed out'} "
                f"(after {time.monotonic() - started:.1f} s)") from None
        try:
            client.connect(
                t.address, port=t.port, username=t.user, key_filename=t.key_path,
                sock=_CountingSocket(sock, self.sent),  # type: ignore[arg-type]
                look_for_keys=False, allow_agent=False, timeout=self.timeouts.connect_s,
                banner_timeout=self.timeouts.connect_s, auth_timeout=self.timeouts.connect_s,
                channel_timeout=self.timeouts.connect_s)
        except paramiko.BadHostKeyException as error:
            sock.close()
            raise HostKeyError(
                f"ssh host {self._where()}: host key CHANGED ({error.key.get_name()} presented, "
                f"{self.known_hosts} pins another): refusing to connect; if the machine was "
                f"reinstalled, remove its line from {self.known_hosts}") from None
        except paramiko.AuthenticationException:
            sock.close()
            raise AuthRefusedError(
                f"ssh host {self._where()}: key {t.key_path} was refused (is its public key in "
                f"the host's authorized_keys?)") from None
        except (OSError, paramiko.PasswordRequiredException, paramiko.SSHException,
                ValueError, TypeError) as error:  # TypeError: an encrypted OpenSSH key
            sock.close()
            message = _one_line(error)
            if "not found in known_hosts" in message:
                raise HostKeyError(
                    f"ssh host {self._where()}: host key not in {self.known_hosts}; add it "
                    f"(ssh-keyscan -p {t.port} {t.address} >> {self.known_hosts}) or set "
                    f"provider.trust_on_first_use=true") from None
            if isinstance(error, paramiko.PasswordRequiredException | TypeError) \
                    or "private key" in message:
                raise BadRequestError(
                    f"ssh host {self._where()}: key {t.key_path} cannot be used (encrypted "
                    f"keys and unsupported formats are not supported)") from None
            if isinstance(error, OSError) and not isinstance(error, (socket.timeout, EOFError)):
                if isinstance(error, FileNotFoundError | PermissionError):
                    raise BadRequestError(
                        f"ssh host {self._where()}: key {t.key_path} cannot be read") from None
                raise SshUnreachableError(f"ssh host {self._where()}: {message}") from None
            raise
        return client

    # --- commands -----------------------------------------------------------------------------

    def _transport(self) -> paramiko.Transport:
        if self.lost.is_set() or self._client is None:
            raise SshUnreachableError(f"ssh host {self._where()} is lost: {self.lost_reason}")
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            self.mark_lost("connection closed")
            raise SshUnreachableError(f"ssh host {self._where()} is lost: connection closed")
        return transport

    def open_channel(self, command: str) -> paramiko.Channel:
        """A session channel running `command` (the caller reads it, from one thread only)."""
        with self._channel_lock:
            try:
                channel = self._transport().open_session(timeout=self.timeouts.connect_s)
                channel.exec_command(command)
            except (paramiko.SSHException, EOFError, OSError) as error:
                if isinstance(error, SshUnreachableError):
                    raise
                self.mark_lost(f"channel failed: {_one_line(error)}")
                raise SshUnreachableError(f"ssh host {self._where()}: {_one_line(error)}") from None
        return channel

    def run(self, command: str, timeout_s: float | None = None, check: bool = True) -> CommandResult:
        """Run a short shell command; its output is read as it comes (no window stall).

        Raises CommandTimeout after `timeout_s` (default: the command timeout), and
        ProvisionError for a non-zero exit when `check`."""
        timeout_s = self.timeouts.command_s if timeout_s is None else timeout_s
        channel = self.open_channel(command)
        end = ChannelEnd(channel)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                got = False
                while channel.recv_ready():
                    out += channel.recv(65536)
                    got = True
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    got = True
                if end.reached():
                    break
                if self.lost.is_set():
                    raise SshUnreachableError(
                        f"ssh host {self._where()} is lost: {self.lost_reason}")
                if time.monotonic() > deadline:
                    raise CommandTimeout(
                        f"ssh host {self._where()}: command did not finish in {timeout_s:g} s")
                if not got:
                    end.wait(0.02)
            code = channel.recv_exit_status()
        finally:
            channel.close()
        result = CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and code != 0:
            raise ProvisionError(
                f"ssh host {self.target.label}: command failed with exit code {code}: "
                f"{_one_line(result.stderr or result.stdout)[-400:]}")
        return result

    @contextlib.contextmanager
    def sftp(self):  # type: ignore[no-untyped-def]
        """The machine's SFTP session, one user at a time."""
        with self._sftp_lock:
            if self._sftp is None:
                with self._channel_lock:
                    try:
                        self._sftp = paramiko.SFTPClient.from_transport(self._transport())
                    except (paramiko.SSHException, EOFError, OSError) as error:
                        if isinstance(error, SshUnreachableError):
                            raise
                        raise SshUnreachableError(
                            f"ssh host {self._where()}: sftp: {_one_line(error)}") from None
                assert self._sftp is not None
                self._sftp.get_channel().settimeout(self.timeouts.command_s)
            yield self._sftp

    def session_process(self) -> tuple[int, int] | None:
        """(pid, start ticks) of the host's sshd process serving this connection, read once
        over SFTP from /proc: the SFTP server's nearest `sshd*` ancestor that is not sshd's own
        SFTP child (internal-sftp); None where /proc cannot be read. Why: when our side of a connection
        dies without a goodbye (our network dropped), the host's sshd holds that session and
        its SFTP server until its TCP keepalive gives up, hours later; the next connection
        ends it (`end_session_command`), and the start ticks make sure no other process that
        reused the pid is signalled."""
        if self._session is not None:
            return self._session or None
        found: tuple[int, int] | None = None
        with contextlib.suppress(OSError, ValueError, IndexError, paramiko.SSHException,
                                 ProvisionError, EOFError), self.sftp() as sftp:
            path = "/proc/self/stat"
            for _ in range(5):  # sftp-server, maybe a shell, the connection's sshd
                with sftp.open(path) as handle:
                    stat = handle.read().decode()
                pid = int(stat.split(" ", 1)[0])
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                if comm.startswith("sshd"):
                    with sftp.open(f"/proc/{pid}/cmdline") as handle:
                        internal = b"internal-sftp" in handle.read()
                    if not internal:
                        found = (pid, int(fields[19]))
                        break
                path = f"/proc/{int(fields[1])}/stat"
        self._session = found or ()
        return found

    # --- liveness -----------------------------------------------------------------------------

    def _beat(self) -> None:
        """Every interval, one global request that sshd must answer within the timeout."""
        while not self._closed.wait(self.timeouts.heartbeat_interval_s):
            client = self._client
            transport = client.get_transport() if client is not None else None
            if transport is None or not transport.is_active():
                self.mark_lost("connection closed by the host")
                return
            replied = threading.Event()

            def ask(tr: paramiko.Transport = transport, done: threading.Event = replied) -> None:
                with contextlib.suppress(Exception):
                    tr.global_request(_KEEPALIVE_REQUEST, wait=True)
                    if tr.is_active():
                        done.set()

            threading.Thread(target=ask, daemon=True, name="ssh-beat").start()
            if not replied.wait(self.timeouts.heartbeat_timeout_s):
                if self._closed.is_set():
                    return
                self.mark_lost(f"no heartbeat reply within {self.timeouts.heartbeat_timeout_s:g} s")
                return

    def check_alive(self) -> bool:
        """False (and the machine marked lost) once the transport is dead: a closed channel
        says so before the next heartbeat does."""
        if self.lost.is_set():
            return False
        client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            if not self._closed.is_set():
                self.mark_lost("connection closed by the host")
            return False
        return True

    def mark_lost(self, reason: str) -> None:
        """Declare the machine unreachable: close the connection (so every stream ends) and
        tell the owner once."""
        if self.lost.is_set() or self._closed.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        log.warning("ssh host %s lost: %s", self._where(), reason)
        self._close_client()
        if self._on_lost is not None:
            self._on_lost(self)

    def close(self) -> None:
        """Close on purpose (release); not a loss. Idempotent."""
        self._closed.set()
        self._close_client()

    def _close_client(self) -> None:
        client, self._client = self._client, None
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        if client is not None:
            # Closing a transport whose peer vanished can block on its socket: do it aside.
            threading.Thread(target=client.close, daemon=True, name="ssh-close").start()


def end_session_command(pid: int, ticks: int) -> str:
    """Shell command ending the sshd session process `pid` (`SshConnection.session_process`)
    if it is still that process (same start ticks, an `sshd*` command name): its channels'
    programs (the SFTP server, followers) end with it. Exits 0 whatever it finds."""
    return (f'P={int(pid)}; [ "$(sed "s/^.*) //" /proc/$P/stat 2>/dev/null | cut -d" " -f20)" '
            f'= "{int(ticks)}" ] && case "$(cat /proc/$P/comm 2>/dev/null)" in sshd*) '
            'kill -TERM $P 2>/dev/null;; esac; true')


def _one_line(error: object) -> str:
    return " ".join(str(error).split())
