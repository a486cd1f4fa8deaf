"""A test bed of real SSH hosts: one OpenSSH server per Linux network namespace, on a bridge.

Each host is a namespace `tb<tag>n<i>` joined to the bridge `tb<tag>br` by a veth pair
(`tb<tag>v<i>` on the host side), with its own address in a test-only /24 of 10.231.0.0/16,
its own host key, sshd config, pid file and root directory. `<tag>` is random per `SshTestBed`,
so parallel test sessions never collide. The namespaces have no default route: nothing leaves
the machine. They share this machine's filesystem and pid table (platform-notes §5).

`SshTestBed.close()` removes everything it created even after a failure: every process inside
each namespace (`ip netns pids`), the sshds, the namespaces, veths and the bridge.

Needs root, `ip` (iproute2) and `/usr/sbin/sshd` (openssh-server); `missing_requirements()` says
which is missing so tests can skip loudly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
SUBNET_PREFIX = "10.231"
SSHD_START_TIMEOUT_S = 10.0
HOST_ADDRESS_OFFSET = 10  # host i gets 10.231.X.(10 + i)

_SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
MaxStartups 100:30:200
MaxSessions 64
LogLevel ERROR
SetEnv HOME={home}
"""


def missing_requirements() -> list[str]:
    """What this machine lacks to run the test bed (empty when it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces need CAP_NET_ADMIN)")
    if shutil.which("ip") is None:
        missing.append("`ip` (apt-get install iproute2)")
    if not SSHD.exists():
        missing.append(f"{SSHD} (apt-get install openssh-server)")
    if shutil.which(SSH_KEYGEN) is None:
        missing.append("ssh-keygen (apt-get install openssh-client)")
    return missing


def skip_reason() -> str | None:
    """A loud pytest skip reason when the test bed cannot run here, else None."""
    missing = missing_requirements()
    if not missing:
        return None
    return ("SSH TEST BED NOT RUN: real sshd hosts in network namespaces need "
            + ", ".join(missing) + " -- run .ci/run as root on Debian to install them")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _keygen(path: Path) -> None:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, capture_output=True)


@contextlib.contextmanager
def claimed_subnet(prefix: str = SUBNET_PREFIX) -> Iterator[int]:
    """A third octet X such that `prefix`.X.0/24 is on no interface of this machine, held under
    a machine-wide lock until the caller's block has put it on its bridge: two beds starting
    at once (pytest-xdist workers, two test sessions) never pick the same /24."""
    SUBNET_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(SUBNET_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = _ip("-o", "-4", "addr", "show").stdout
        free = [x for x in range(10, 250) if f" {prefix}.{x}." not in used]
        if not free:
            raise RuntimeError(f"no free {prefix}.X.0/24 subnet for a test bed")
        yield secrets.choice(free)


@dataclass
class TestHost:
    """One namespace host. `root` is its private directory (what a lab server's home would be)."""

    __test__ = False  # not a pytest test class

    index: int
    name: str  # inventory name, h<index>
    netns: str
    veth: str
    address: str
    root: Path
    host_key: Path
    config: Path
    pid_file: Path
    log: Path
    sshd: subprocess.Popen[bytes] | None = None


# --- stale beds -----------------------------------------------------------------------------
# A bed whose test process was SIGKILLed cannot remove itself: each bed records its owner (pid
# and start time) in a directory named by its tag, and the next bed that starts sweeps what
# dead owners left (processes in their namespaces, the namespaces, links, the directory).

#: Where the SSH beds record their owners (tmpfs: gone with a reboot, as namespaces are).
SSH_BEDS_DIR = Path("/run/transient-testbed/ssh")
#: Held while a bed picks its /24 and puts it on its bridge (`claimed_subnet`).
SUBNET_LOCK = Path("/run/transient-testbed/subnet.lock")


def owner_stamp(pid: int) -> str:
    """pid and its start time: a pid reused by another process does not look alive."""
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{pid} {start}"


def owner_alive(stamp: str) -> bool:
    parts = stamp.split()
    return len(parts) == 2 and parts[0].isdigit() and owner_stamp(int(parts[0])) == stamp


def bed_leftovers(prefix: str) -> list[str]:
    """Namespaces and links whose names start with `prefix` (a bed's `<PREFIX><tag>`)."""
    names = _ip("netns", "list", check=False).stdout + _ip("-o", "link", check=False).stdout
    return sorted({w.split("@")[0].rstrip(":") for w in names.split() if w.startswith(prefix)})


def reserve_bed(beds: Path) -> tuple[str, Path]:
    """A fresh tag and its directory under `beds`, owned by this process."""
    beds.mkdir(parents=True, exist_ok=True)
    for _ in range(100):  # the bed's directory reserves its tag among live beds
        tag = secrets.token_hex(2)
        with contextlib.suppress(FileExistsError):
            (beds / tag).mkdir()
            (beds / tag / "owner").write_text(owner_stamp(os.getpid()))
            return tag, beds / tag
    raise RuntimeError(f"no free tag for a test bed in {beds}")


def sweep_stale_beds(beds: Path, prefix: str) -> list[str]:
    """Remove what beds whose test process died left; beds of live processes are untouched.
    Returns the tags swept."""
    if not beds.exists():
        return []
    swept = []
    for bed in beds.iterdir():
        try:
            stamp = (bed / "owner").read_text()
        except OSError:
            # no owner file: a bed being created right now, or a crash before the stamp
            if time.time() - bed.stat().st_mtime < 600:
                continue
            stamp = ""
        if stamp and owner_alive(stamp):
            continue
        for name in bed_leftovers(f"{prefix}{bed.name}n"):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", name, check=False)
        for name in bed_leftovers(f"{prefix}{bed.name}"):
            _ip("link", "del", name, check=False)
        shutil.rmtree(bed, ignore_errors=True)
        swept.append(bed.name)
    return swept


class HostSignals:
    """Signals to all of a host's processes, for test beds whose `pids(host)` lists them."""

    def pids(self, host: Any) -> list[int]:
        raise NotImplementedError

    def kill_processes(self, host: Any, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to every process of the host (sshd included)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def freeze(self, host: Any) -> None:
        """SIGSTOP every process of the host: it hangs, its TCP connections stay open."""
        self.kill_processes(host, signal.SIGSTOP)

    def thaw(self, host: Any) -> None:
        self.kill_processes(host, signal.SIGCONT)

    def role_pids(self, host: Any) -> list[int]:
        """Live processes of the host other than its sshd and sshd's sessions: what runs
        there for a run (the host's only service is sshd)."""
        # a process that ended between the listing and the read of its name (an sshd session
        # closing) has no name any more: it is gone, not left
        return [p for p in self.pids(host) if (comm := _comm(p)) and not comm.startswith("sshd")]

    def processes_left(self, hosts: list[Any], within_s: float = 5.0) -> dict[str, list[int]]:
        """The role processes still alive on `hosts` once they had `within_s` to end (a
        follower streaming a killed role's output exits on its own a moment later);
        {name: pids}, empty lists when nothing was left."""
        deadline = time.monotonic() + within_s
        while any(self.role_pids(h) for h in hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        return {h.name: self.role_pids(h) for h in hosts}


class SshTestBed(HostSignals):
    """N sshd hosts in network namespaces. Use as a context manager or call `close()`."""

    def __init__(self, scratch: Path, hosts: int = 3) -> None:
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        sweep_stale_beds(SSH_BEDS_DIR, "tb")
        self.tag, self._owner_dir = reserve_bed(SSH_BEDS_DIR)
        self.scratch = Path(scratch)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.bridge = f"tb{self.tag}br"
        self.client_key = self.scratch / "client_ed25519"
        self.known_hosts = self.scratch / "known_hosts"
        self.hosts: list[TestHost] = []
        self._created_links: list[str] = []
        try:
            _keygen(self.client_key)
            with claimed_subnet() as self.octet:
                self.gateway = f"{SUBNET_PREFIX}.{self.octet}.1"
                _ip("link", "add", self.bridge, "type", "bridge")
                self._created_links.append(self.bridge)
                _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for _ in range(hosts):
                self.add_host()
        except BaseException:
            self.close()
            raise

    # --- building -----------------------------------------------------------------------------

    def add_host(self) -> TestHost:
        """Create one more namespace host with a running sshd and return it."""
        i = len(self.hosts)
        root = self.scratch / f"h{i}"
        host = TestHost(
            index=i, name=f"h{i}", netns=f"tb{self.tag}n{i}", veth=f"tb{self.tag}v{i}",
            address=f"{SUBNET_PREFIX}.{self.octet}.{HOST_ADDRESS_OFFSET + i}",
            root=root / "home", host_key=root / "ssh_host_ed25519_key",
            config=root / "sshd_config", pid_file=root / "sshd.pid", log=root / "sshd.log")
        host.root.mkdir(parents=True, exist_ok=True)
        self.hosts.append(host)
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        self._created_links.append(host.veth)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _keygen(host.host_key)
        (root / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        host.config.write_text(_SSHD_CONFIG.format(
            address=host.address, host_key=host.host_key, pid_file=host.pid_file,
            authorized_keys=root / "authorized_keys", home=host.root))
        self.pin_host_key(host)
        self.start_sshd(host)
        return host

    def pin_host_key(self, host: TestHost) -> None:
        """(Re)write `host`'s line in the test bed's known_hosts from its current host key."""
        public = host.host_key.with_suffix(".pub").read_text().split()
        lines = [ln for ln in (self.known_hosts.read_text().splitlines()
                               if self.known_hosts.exists() else [])
                 if ln.split(" ", 1)[0] != host.address]
        lines.append(f"{host.address} {public[0]} {public[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def start_sshd(self, host: TestHost) -> None:
        """Start `host`'s sshd (foreground, logging to its file) and wait until it listens."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
        subprocess.run([str(SSHD), "-t", "-f", str(host.config)], check=True,
                       capture_output=True)
        with open(host.log, "ab") as log:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, str(SSHD), "-D", "-e", "-f", str(host.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + SSHD_START_TIMEOUT_S
        while not _accepts(host.address, 22):
            if host.sshd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {host.name} did not start: {host.log.read_text()}")
            time.sleep(0.05)

    # --- faults -------------------------------------------------------------------------------

    def cut(self, host: TestHost) -> None:
        """Cut the host's link: packets vanish, no RST, no FIN (a dead VM or a pulled cable)."""
        _ip("link", "set", host.veth, "down")

    def restore(self, host: TestHost) -> None:
        _ip("link", "set", host.veth, "up")

    def kill_sshd(self, host: TestHost) -> None:
        """SIGKILL the host's sshd (and every session it serves)."""
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.kill()
            host.sshd.wait()

    def pids(self, host: TestHost) -> list[int]:
        """Live (non-zombie) processes inside the host's namespace, sshd included."""
        out = _ip("netns", "pids", host.netns, check=False).stdout.split()
        return [int(p) for p in out if _is_live(int(p))]

    def change_host_key(self, host: TestHost) -> None:
        """Give the host a new host key (a reinstalled server) and restart its sshd; the test
        bed's known_hosts keeps the old one."""
        self.kill_sshd(host)
        host.host_key.unlink()
        host.host_key.with_suffix(".pub").unlink()
        _keygen(host.host_key)
        self.start_sshd(host)

    # --- inventory ----------------------------------------------------------------------------

    def inventory(self, hosts: list[TestHost] | None = None) -> list[dict[str, object]]:
        """The hosts as `provider=ssh` inventory entries (the config's `hosts` list)."""
        return [{"name": h.name, "address": h.address, "port": 22, "user": "root",
                 "key_path": str(self.client_key), "root": str(h.root)}
                for h in (self.hosts if hosts is None else hosts)]

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Remove every process, sshd, namespace, veth and the bridge. Idempotent."""
        for host in self.hosts:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                self.kill_processes(host, sig)
            if host.sshd is not None:
                with contextlib.suppress(ProcessLookupError):
                    host.sshd.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.sshd.wait(5)
            _ip("netns", "del", host.netns, check=False)
        for link in reversed(self._created_links):
            _ip("link", "del", link, check=False)
        self._created_links.clear()
        shutil.rmtree(self._owner_dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this test bed that still exist (empty after close())."""
        names = _ip("netns", "list", check=False).stdout + _ip("-o", "link", check=False).stdout
        return sorted({w.split("@")[0].rstrip(":") for w in names.split()
                       if w.startswith(f"tb{self.tag}")})

    def __enter__(self) -> SshTestBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[TestHost]:
        return iter(self.hosts)


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.3):
            return True
    except OSError:
        return False


def _stat_fields(pid: int) -> list[str]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2:].split()


def _is_live(pid: int) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def _comm(pid: int) -> str:
    """The process's name; "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
