"""A test bed of isolated hosts: machines that share nothing with the test machine but its
kernel, as a fresh cloud VM shares nothing with the user's laptop.

Each host is a container made of plain Linux primitives (measured recipe:
shared/docs/isolated-hosts.md, approach A1): its own root filesystem (an overlay whose upper dir
is the host's "disk" over a Debian image from `tests.testbed.images`, plus optional extra layers
such as a baked image), its own pid, mount, UTS, IPC and network namespaces, and the image's
sshd as its only service (PID 1). It sees none of the test machine's files, processes or
interpreter. The login user is `cloud` (passwordless sudo), authorized with the bed's client key;
the host makes its own host keys at first boot and the bed learns them from the host's disk
(as a cloud publishes them in guest attributes) for a strict known_hosts. For `boot_s` seconds
after start, non-root logins are refused by pam_nologin ("System is booting up"), as on a VM
whose boot has not finished.

Names: bridge `ib<tag>br`, namespaces `ib<tag>n<i>`, veths `ib<tag>v<i>`, on a free
10.232.X.0/24 (the shared-filesystem bed uses 10.231.0.0/16). The hosts have no default route:
they reach the bridge's address (where `serve_index` runs a package index) and each other, and
nothing else.

Nothing is left behind: `close()` kills every host (SIGKILL of the host's `unshare`, whose
`--kill-child` ends the whole pid namespace; its mounts die with its mount namespace), then
removes namespaces, veths, the bridge and the bed's directory. If the test process is
SIGKILLed, `setpriv --pdeathsig KILL` kills the hosts and the index with it, and the next bed
that starts sweeps the dead bed's namespaces, links and directory (its owner pid is recorded).

Not a security boundary: a host runs as real root (see the note's pitfalls).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.testbed import (
    HostSignals,
    _accepts,
    _ip,
    _is_live,
    _keygen,
    bed_leftovers,
    claimed_subnet,
    images,
    reserve_bed,
    sweep_stale_beds,
)

PREFIX = "ib"
SUBNET_PREFIX = "10.232"
HOST_ADDRESS_OFFSET = 10  # host i gets 10.232.X.(10 + i)
START_TIMEOUT_S = 60.0  # to sshd's banner; a loaded 2-core machine is slow at first boot
LOGIN_USER = images.LOGIN_USER
NOLOGIN_TEXT = "System is booting up. Unprivileged users are not permitted to log in yet."

# PID 1 of a new host, run by the test machine's /bin/sh inside the new namespaces: mount the
# host's root, switch to it and hand over to the image's own shell and sshd. Passed with -c
# (not as a file): after pivot_root the test machine's files are gone.
_HOST_INIT = r"""
set -e
D=$1 LOWER=$2 NAME=$3 BOOT=$4 NOLOGIN=$5
hostname "$NAME"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$D/upper,workdir=$D/work" "$D/merged"
cd "$D/merged"
mount -t proc proc proc
mount -t sysfs -o ro sysfs sys
mount -t tmpfs -o mode=755,size=64m tmpfs run
mount -t tmpfs -o mode=1777,size=256m tmpfs dev/shm
mkdir -p dev/pts
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts dev/pts
mount --bind dev/pts/ptmx dev/ptmx
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
exec /bin/sh -c '
set -e
mkdir -p /run/sshd
# the guest agent: accounts from the instance metadata (lines "USER PUBLIC-KEY")
if [ -s /etc/guest-accounts ]; then
  while read -r user key; do
    id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
    if [ "$user" != root ]; then
      echo "$user ALL=(ALL) NOPASSWD:ALL" > "/etc/sudoers.d/90-guest-$user"
      chmod 0440 "/etc/sudoers.d/90-guest-$user"
    fi
    home=$(getent passwd "$user" | cut -d: -f6)
    mkdir -p "$home/.ssh"
    echo "$key" > "$home/.ssh/authorized_keys"
    chown -R "$user:" "$home/.ssh"
    chmod 700 "$home/.ssh"
    chmod 600 "$home/.ssh/authorized_keys"
  done < /etc/guest-accounts
fi
# the instance metadata startup-script, as root, detached (google-startup-scripts does this)
if [ -s /etc/guest-startup-script ]; then
  setsid /bin/bash /etc/guest-startup-script > /var/log/startup-script.log 2>&1 < /dev/null &
fi
if [ "$1" != 0 ]; then
  echo "$2" > /run/nologin
  (sleep "$1"; rm -f /run/nologin) &
fi
K=/etc/ssh/ssh_host_ed25519_key
[ -s $K ] || ssh-keygen -q -t ed25519 -N "" -C "root@$(hostname)" -f $K
exec /usr/sbin/sshd -D -e -h $K
' boot "$BOOT" "$NOLOGIN"
"""


@dataclass(frozen=True)
class Disk:
    """What a host boots from: a base image and layers over it (top first), like a cloud
    disk created from an image family or from a custom (baked) image."""

    image: str = "bookworm"
    layers: tuple[Path, ...] = ()

    def lowerdir(self) -> str:
        return ":".join([*(str(p) for p in self.layers), str(images.rootfs(self.image))])


@dataclass
class IsolatedHost:
    """One isolated host. `dir` holds its disk (`upper`), overlay work dir and console log."""

    index: int
    name: str
    netns: str
    veth: str
    address: str
    disk: Disk
    dir: Path
    boot_s: float
    user: str = LOGIN_USER
    process: subprocess.Popen[bytes] | None = None
    pidns: str = ""  # "pid:[inode]" of the host's pid namespace while it runs
    started_at: float = 0.0
    host_key: str = ""  # "ssh-ed25519 AAAA..." learnt from the disk after boot
    extra: dict[str, object] = field(default_factory=dict)  # free for a test's bookkeeping

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def log(self) -> Path:
        return self.dir / "console.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class IsolatedTestBed(HostSignals):
    """Isolated hosts on one bridge. Use as a context manager or call `close()`.

    `hosts` hosts of `image` are started at once; `add_host` makes more (another image,
    extra layers, another boot delay)."""

    def __init__(self, hosts: int = 0, image: str = "bookworm", boot_s: float = 0.0,
                 build: bool = True) -> None:
        reason = skip_reason(build=build)
        if reason:
            raise RuntimeError(reason)
        sweep_stale()
        self.tag, self.dir = reserve_bed(_beds_dir())
        self.bridge = f"{PREFIX}{self.tag}br"
        self.image = image
        self.boot_s = boot_s
        self.client_key = self.dir / "client_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.touch()
        self.hosts: list[IsolatedHost] = []
        self._links: list[str] = []
        self._indexes: dict[Path, tuple[subprocess.Popen[bytes], str]] = {}
        self._lock = threading.Lock()  # hosts may start from several threads (a fake cloud)
        self._closed = False
        # Hosts die with the *thread* that started them (PR_SET_PDEATHSIG), so one long-lived
        # thread starts them all, whichever thread (a fake cloud's request handler) asks.
        self._launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isobed-launch")
        try:
            _keygen(self.client_key)
            with claimed_subnet(SUBNET_PREFIX) as self.octet:
                self.gateway = f"{SUBNET_PREFIX}.{self.octet}.1"
                _ip("link", "add", self.bridge, "type", "bridge")
                self._links.append(self.bridge)
                _sysctl(f"net.ipv6.conf.{self.bridge}.disable_ipv6=1")
                _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for _ in range(hosts):
                self.add_host()
        except BaseException:
            self.close()
            raise

    # --- hosts --------------------------------------------------------------------------------

    def add_host(self, image: str | None = None, layers: Sequence[Path] = (),
                 boot_s: float | None = None, start: bool = True, disk: Disk | None = None,
                 accounts: dict[str, str] | None = None) -> IsolatedHost:
        """Create a host (its namespaces, link and a fresh disk over `image` plus `layers`, or
        `disk`) and start it unless `start` is false. `accounts`: see `reimage`."""
        disk = disk or Disk(image or self.image, tuple(Path(p) for p in layers))
        images.build(disk.image)
        with self._lock:
            i = len(self.hosts)
            host = IsolatedHost(
                index=i, name=f"h{i}", netns=f"{PREFIX}{self.tag}n{i}",
                veth=f"{PREFIX}{self.tag}v{i}",
                address=f"{SUBNET_PREFIX}.{self.octet}.{HOST_ADDRESS_OFFSET + i}", disk=disk,
                dir=self.dir / "hosts" / f"h{i}",
                boot_s=self.boot_s if boot_s is None else boot_s)
            self.hosts.append(host)
        _ip("netns", "add", host.netns)
        _in_netns(host.netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        with self._lock:
            self._links.append(host.veth)
        _sysctl(f"net.ipv6.conf.{host.veth}.disable_ipv6=1")
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        self.reimage(host, accounts=accounts)
        if start:
            self.start(host)
        return host

    def reimage(self, host: IsolatedHost, disk: Disk | None = None,
                accounts: dict[str, str] | None = None, startup_script: str | None = None,
                names: dict[str, str] | None = None) -> None:
        """Give a stopped host a fresh disk from `disk` (default: its own image and layers), as
        a VM created anew. `accounts` ({user: public key line}, default {cloud: the bed's client
        key}) are what the cloud's guest agent creates at boot from the instance metadata
        (`ssh-keys`): the user (with passwordless sudo) and its authorized key.
        `startup_script` runs as root, detached, at every boot (output in
        /var/log/startup-script.log). `names` ({hostname: address}) are added to /etc/hosts
        (e.g. metadata.google.internal)."""
        if host.running:
            raise RuntimeError(f"{host.name} must be stopped to get a new disk")
        images.build((disk or host.disk).image)
        with self._lock:  # close() waits for a disk being written, then none is
            if self._closed:
                raise RuntimeError(f"isolated bed closed: {host.name} gets no new disk")
            self._reimage(host, disk, accounts, startup_script, names)

    def _reimage(self, host: IsolatedHost, disk: Disk | None, accounts: dict[str, str] | None,
                 startup_script: str | None, names: dict[str, str] | None) -> None:
        host.disk = disk or host.disk
        shutil.rmtree(host.dir, ignore_errors=True)
        for sub in ("upper", "work", "merged"):
            (host.dir / sub).mkdir(parents=True)
        if accounts is None:
            accounts = {LOGIN_USER: self.client_key.with_suffix(".pub").read_text()}
        lower = [*host.disk.layers, images.rootfs(host.disk.image)]
        _write_over(lower, host.upper, "etc/hostname", f"{host.name}\n")
        _write_over(lower, host.upper, "etc/hosts",
                    f"127.0.0.1 localhost\n{host.address} {host.name}\n" + "".join(
                        f"{address} {name}\n" for name, address in (names or {}).items()))
        if startup_script:
            _write_over(lower, host.upper, "etc/guest-startup-script", startup_script,
                        mode=0o700)
        _write_over(lower, host.upper, "etc/guest-accounts", "".join(
            f"{user} {' '.join(key.split())}\n" for user, key in accounts.items()), mode=0o600)
        host.user = LOGIN_USER if LOGIN_USER in accounts else next(iter(accounts), LOGIN_USER)


    def start(self, host: IsolatedHost) -> None:
        """Boot `host` from its disk and wait for its sshd; learn its host key."""
        if host.running:
            raise RuntimeError(f"{host.name} is already running")
        argv = ["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net=/run/netns/{host.netns}",
                "--", "unshare", "--mount", "--propagation", "private", "--pid", "--uts",
                "--ipc", "--fork", "--kill-child", "--", "/bin/sh", "-c", _HOST_INIT, "init",
                str(host.dir), host.disk.lowerdir(), host.name, f"{host.boot_s:g}", NOLOGIN_TEXT]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}

        def launch() -> subprocess.Popen[bytes]:
            # host.process is set here, in the launcher, so a close() that waits for the
            # launcher always sees (and kills) what it started
            with open(host.log, "ab") as log:
                host.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=log, env=env, cwd="/")
            return host.process

        try:
            process = self._launcher.submit(launch).result()
        except RuntimeError as err:  # the launcher is shut down: the bed is closing
            raise RuntimeError(f"isolated bed closed: {host.name} not started") from err
        host.started_at = time.monotonic()
        key = host.upper / "etc/ssh/ssh_host_ed25519_key.pub"
        deadline = host.started_at + START_TIMEOUT_S
        while not (key.exists() and _accepts(host.address, 22)):
            if process.poll() is not None or time.monotonic() > deadline:
                self.stop(host)
                raise RuntimeError(f"isolated host {host.name} did not start: "
                                   + host.log.read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        host.pidns = _pidns_for_children(process.pid)
        host.host_key = " ".join(key.read_text().split()[:2])
        self._pin(host)

    def stop(self, host: IsolatedHost) -> None:
        """Power the host off at once (SIGKILL of its pid namespace); its disk is kept."""
        if host.process is not None:
            with contextlib.suppress(ProcessLookupError):
                host.process.kill()
            host.process.wait()
        deadline = time.monotonic() + 10
        while host.pidns and self.pids(host) and time.monotonic() < deadline:
            time.sleep(0.02)
        host.pidns = ""

    def restart(self, host: IsolatedHost, fresh_disk: bool = False) -> None:
        """Stop and start `host`; `fresh_disk` gives it a new disk (a recreated VM: new host
        key, nothing of what was written before)."""
        self.stop(host)
        if fresh_disk:
            self.reimage(host)
        self.start(host)

    def snapshot(self, host: IsolatedHost, dest: Path | None = None) -> Disk:
        """A new image from a stopped host's disk (a cloud's `images.insert` from a VM's disk):
        its upper dir copied into a layer over the host's own layers. The host keys are left
        out, so every host made from it makes its own, and so are the metadata's accounts and
        startup script (a host of that image gets its own: `reimage`). `dest` (default: inside the bed, removed
        with it) must not exist; it is written atomically."""
        if host.running:
            raise RuntimeError(f"{host.name} must be stopped before its disk is snapshotted")
        dest = Path(dest) if dest else self.dir / "layers" / f"{host.name}-{secrets.token_hex(3)}"
        if dest.exists():
            raise FileExistsError(dest)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            # cp -a keeps overlayfs' whiteouts (0/0 char devices) and trusted.overlay.* xattrs
            subprocess.run(["cp", "-a", str(host.upper), str(tmp)], check=True,
                           capture_output=True)
            for key in (tmp / "etc/ssh").glob("ssh_host_*"):
                key.unlink()
            # the guest agent's inputs come from each VM's metadata, not from its image
            for name in ("guest-accounts", "guest-startup-script"):
                (tmp / "etc" / name).unlink(missing_ok=True)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return Disk(host.disk.image, (dest, *host.disk.layers))

    def finish_boot(self, host: IsolatedHost) -> None:
        """End `host`'s boot now: remove /run/nologin, so logins are accepted (a test that must
        see a refusal first starts the host with a long `boot_s`, then calls this)."""
        subprocess.run(["nsenter", "-t", str(self.init_pid(host)), "-m", "--", "rm", "-f",
                        "/run/nologin"], check=True, capture_output=True)

    # --- inside a host ------------------------------------------------------------------------

    def init_pid(self, host: IsolatedHost) -> int:
        """The test machine's pid of the host's PID 1 (its sshd)."""
        if not host.running:
            raise RuntimeError(f"{host.name} is not running")
        assert host.process is not None
        children = Path(f"/proc/{host.process.pid}/task/{host.process.pid}/children").read_text()
        return int(children.split()[0])

    def pids(self, host: IsolatedHost) -> list[int]:
        """Live processes of the host (its pid namespace), sshd included."""
        return live_processes([host.pidns]) if host.pidns else []

    def cut(self, host: IsolatedHost) -> None:
        """Cut the host's link: packets vanish, no RST, no FIN."""
        _ip("link", "set", host.veth, "down")

    def restore(self, host: IsolatedHost) -> None:
        _ip("link", "set", host.veth, "up")

    def drop_orchestrator(self) -> None:
        """Take the test machine off the bed's network (its address on the bridge removed:
        nothing reaches the hosts from here, nor here from them), while the hosts still reach
        each other over the bridge: the user's own network dropping mid-run."""
        _ip("addr", "del", f"{self.gateway}/24", "dev", self.bridge)

    def restore_orchestrator(self) -> None:
        """Undo `drop_orchestrator` (idempotent)."""
        subprocess.run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
                       capture_output=True)

    def ssh_argv(self, host: IsolatedHost, user: str | None = None) -> list[str]:
        """An `ssh` command line for `host` with the bed's key and strict known_hosts."""
        return ["ssh", "-i", str(self.client_key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                f"{user or host.user}@{host.address}"]

    def ssh(self, host: IsolatedHost, command: str, user: str | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run `command` on `host` over ssh (not checked: look at returncode)."""
        return subprocess.run([*self.ssh_argv(host, user), command], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def wait_login(self, host: IsolatedHost, timeout: float = 60.0) -> float:
        """Wait until `host` accepts a login (its boot is over); seconds waited since start."""
        deadline = time.monotonic() + timeout
        while True:
            if self.ssh(host, "true", timeout=timeout).returncode == 0:
                return time.monotonic() - host.started_at
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host.name} refused logins for {timeout:.0f} s")
            time.sleep(0.2)

    def inventory(self, hosts: list[IsolatedHost] | None = None) -> list[dict[str, object]]:
        """The hosts as `provider=ssh` inventory entries: no `python`, no `root` (the user's
        home is the default), a non-root user."""
        return [{"name": h.name, "address": h.address, "port": 22, "user": h.user,
                 "key_path": str(self.client_key)}
                for h in (self.hosts if hosts is None else hosts)]

    def _pin(self, host: IsolatedHost) -> None:
        with self._lock:
            self._pin_locked(host)

    def _pin_locked(self, host: IsolatedHost) -> None:
        lines = [ln for ln in self.known_hosts.read_text().splitlines()
                 if ln.split(" ", 1)[0] != host.address]
        lines.append(f"{host.address} {host.host_key}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    # --- package index ------------------------------------------------------------------------

    def serve_index(self, wheel_dir: Path) -> str:
        """Serve `wheel_dir` as a PyPI-compatible index (pypiserver) on the bridge; return the
        URL hosts give pip as `--index-url`. One index per folder (asking again for the same
        folder returns its URL: the session's hosts' index and a controller's index live side
        by side); they end with the bed."""
        wheel_dir = Path(wheel_dir).resolve()
        if wheel_dir in self._indexes:
            return self._indexes[wheel_dir][1]
        with socket.socket() as s:
            s.bind((self.gateway, 0))
            port = s.getsockname()[1]
        argv = ["setpriv", "--pdeathsig", "KILL", sys.executable, "-m", "pypiserver", "run",
                "-i", self.gateway, "-p", str(port), "-a", ".", "-P", ".",
                "--disable-fallback", "--server", "auto", str(wheel_dir)]
        url = f"http://{self.gateway}:{port}/simple/"

        def launch() -> subprocess.Popen[bytes]:
            with open(self.dir / "index.log", "ab") as log:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self._indexes[wheel_dir] = (proc, url)
            return proc

        index = self._launcher.submit(launch).result()
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return url
            if index.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("package index did not start: "
                                   + (self.dir / "index.log").read_text()[-2000:])
            time.sleep(0.1)

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every host and the index; remove namespaces, links and the bed's directory.
        Idempotent."""
        with self._lock:
            self._closed = True
        self._launcher.shutdown(wait=True)  # nothing starts from now on (a fake cloud's threads)
        for host in self.hosts:
            self.stop(host)
        for index, _ in self._indexes.values():
            with contextlib.suppress(ProcessLookupError):
                index.kill()
            index.wait()
        self._indexes.clear()
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
        for link in reversed(self._links):
            _ip("link", "del", link, check=False)
        self._links.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """This bed's namespaces, links, processes and directory that still exist."""
        return _leftovers(self.tag) + ([str(self.dir)] if self.dir.exists() else [])

    def __enter__(self) -> IsolatedTestBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[IsolatedHost]:
        return iter(self.hosts)


# --- requirements ---------------------------------------------------------------------------

def missing_requirements(build: bool = True) -> list[str]:
    """What this machine lacks for isolated hosts (empty when it can run them)."""
    from tests.testbed import missing_requirements as shared_missing
    missing = [m for m in shared_missing() if "sshd" not in m]  # the image brings its own sshd
    for tool in ("unshare", "nsenter", "setpriv", "ssh"):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (apt-get install util-linux openssh-client)")
    if build:
        missing += images.missing_requirements()
    elif not all(images.is_built(n) for n in images.IMAGES):
        missing.append("the images (make isolated-images)")
    return missing


def skip_reason(build: bool = True) -> str | None:
    """A loud pytest skip reason when isolated hosts cannot run here, else None."""
    missing = missing_requirements(build)
    if not missing:
        return None
    return ("ISOLATED TEST HOSTS NOT RUN: containers from Debian images need "
            + ", ".join(missing) + " -- run `make isolated-images` as root on Debian")


def live_processes(pidns: Sequence[str]) -> list[int]:
    """Live (non-zombie) processes in any of the pid namespaces `pidns` ("pid:[inode]", as
    `IsolatedHost.pidns`): what is left of hosts, seen from the test machine."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") in pidns and _is_live(int(entry)):
                    found.append(int(entry))
    return found


# --- stale beds -----------------------------------------------------------------------------

def _beds_dir() -> Path:
    return images.cache_dir() / "beds"


def _leftovers(tag: str) -> list[str]:
    return bed_leftovers(f"{PREFIX}{tag}")


def sweep_stale() -> list[str]:
    """Remove what isolated beds whose test process died (SIGKILL) left: processes in their
    namespaces, the namespaces, links and directories. Returns the tags swept."""
    return sweep_stale_beds(_beds_dir(), PREFIX)


# --- helpers --------------------------------------------------------------------------------

def _sysctl(setting: str) -> None:
    subprocess.run(["sysctl", "-qw", setting], check=True, capture_output=True)


def _in_netns(netns: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns, *argv], check=True, capture_output=True)


def _pidns_for_children(pid: int) -> str:
    """The pid namespace of a host's processes (that of its `unshare`'s children); never the
    test machine's own, which `pids()`/`kill_processes()` would then take for the host's."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid_for_children")
    except OSError as err:
        raise RuntimeError(f"isolated host process {pid} ended while starting") from err
    if ns == os.readlink("/proc/self/ns/pid"):
        raise RuntimeError(f"isolated host process {pid} has no pid namespace of its own")
    return ns


def _write_over(lower: list[Path], upper: Path, rel: str, text: str, mode: int = 0o644,
                owner_of: str | None = None, dir_mode: int | None = None) -> None:
    """Write file `rel` into an overlay upper dir before the overlay is mounted. Its parent
    directories are created with the mode and owner they have in the lower layers, so the
    merged view looks as if the file had been written inside the host. The file (and a new
    directory that exists in no layer) is owned by `owner_of`'s owner (a path in the layers),
    else root; `dir_mode` is the mode of such a new directory."""
    def lower_stat(path: str) -> os.stat_result | None:
        for layer in lower:
            with contextlib.suppress(OSError):
                return os.lstat(layer / path)
        return None

    owner = lower_stat(owner_of) if owner_of else None
    uid, gid = (owner.st_uid, owner.st_gid) if owner else (0, 0)
    parts = Path(rel).parts
    for depth in range(1, len(parts)):
        sub = "/".join(parts[:depth])
        target = upper / sub
        st = lower_stat(sub)
        if target.exists():
            continue
        target.mkdir()
        if st is not None:
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, st.st_mode & 0o7777)
        else:
            os.chown(target, uid, gid)
            os.chmod(target, dir_mode or 0o755)
    path = upper / rel
    path.write_text(text)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.testbed.isolated [IMAGE ...]`: start one host per image named (default
    one of each), print how to log in, and keep them until Ctrl-C (then remove everything)."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tests.testbed.isolated",
                                     description="Isolated hosts to look at by hand.")
    parser.add_argument("images", nargs="*", metavar="IMAGE",
                        help=f"one host per image (default: {' '.join(sorted(images.IMAGES))})")
    parser.add_argument("--index", metavar="WHEEL_DIR", help="serve this wheel dir as an index")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.images) - set(images.IMAGES))
    if unknown:
        parser.error(f"unknown image {unknown[0]}")
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    with IsolatedTestBed() as bed:
        for image in args.images or sorted(images.IMAGES):
            host = bed.add_host(image=image)
            print(f"{host.name} ({image}): {' '.join(bed.ssh_argv(host))}")
        if args.index:
            print(f"index: {bed.serve_index(Path(args.index))} "
                  f"(pip: --trusted-host {bed.gateway})")
        print("Ctrl-C removes them.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
