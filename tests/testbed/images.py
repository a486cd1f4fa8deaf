"""Debian root filesystems for the isolated test hosts (tests/testbed/isolated.py), built by
the project itself with debootstrap and cached on this machine outside the checkout.

Two images stand for two bare cloud images: `bookworm` (Debian 12, Python 3.11, the
orchestrator's own minor) and `trixie` (Debian 13, Python 3.13, not the orchestrator's minor).
Each has only what a minimal cloud image has: python3 with venv, openssh-server, sudo, iproute2,
procps, ca-certificates, curl and PAM; no TensorFlow, no pip packages. The login user `cloud` has
passwordless sudo, as the user a cloud's guest agent creates. Host keys are removed from the
image: each host makes its own at first boot (Debian's cloud images do the same).

An image lives at `<cache>/<name>-<digest of its recipe>/rootfs`; changing the recipe below
changes the digest, so a stale image is never used. It is built into a temporary directory
and renamed into place, under a lock, so a crash or a parallel build never leaves a half
image where a test would use it. The cache is `$TRANSIENT_ISOBED_CACHE` or
/var/tmp/transient-isobed (a local disk: overlayfs needs one for its upper dirs).

CLI (the Makefile's `isolated-images` target runs it before the tests):

    python -m tests.testbed.images build [bookworm trixie]   # build what is missing
    python -m tests.testbed.images path trixie               # print the rootfs path
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "TRANSIENT_ISOBED_CACHE"
DEFAULT_CACHE = Path("/var/tmp/transient-isobed")
LOGIN_USER = "cloud"
# curl: every cloud's Debian image has it, and VM-side scripts (the preemption watcher) use it
PACKAGES = ("python3", "python3-venv", "openssh-server", "sudo", "iproute2", "procps",
            "ca-certificates", "libpam-modules", "curl")
RECIPE_VERSION = "1"  # bump when _finish() changes what the image holds


@dataclass(frozen=True)
class Image:
    """One bare image: a Debian suite and the Python minor it ships."""

    name: str
    suite: str
    python: str  # "3.11": what `python3 --version` says on it (major.minor)

    def recipe(self) -> str:
        """Everything that decides the image's content; its digest names the cache entry."""
        return "\n".join([f"suite={self.suite}", "variant=minbase",
                          "packages=" + ",".join(PACKAGES), f"user={LOGIN_USER}",
                          f"finish={RECIPE_VERSION}", _FINISH_SCRIPT])

    def digest(self) -> str:
        return hashlib.sha256(self.recipe().encode()).hexdigest()[:12]


IMAGES: dict[str, Image] = {
    "bookworm": Image("bookworm", "bookworm", "3.11"),
    "trixie": Image("trixie", "trixie", "3.13"),
}

# Run in the new root (chroot) once debootstrap is done: what turns a Debian tree into a
# "cloud image". Part of the recipe's digest.
_FINISH_SCRIPT = f"""\
set -e
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
rm -f /etc/ssh/ssh_host_*
useradd --create-home --shell /bin/bash --groups sudo {LOGIN_USER}
printf '%s ALL=(ALL) NOPASSWD:ALL\\n' {LOGIN_USER} > /etc/sudoers.d/90-cloud-user
chmod 0440 /etc/sudoers.d/90-cloud-user
printf '127.0.0.1 localhost\\n' > /etc/hosts
: > /etc/resolv.conf
: > /etc/machine-id
echo localhost > /etc/hostname
mkdir -p /etc/ssh/sshd_config.d
cat > /etc/ssh/sshd_config.d/50-cloud-image.conf <<'EOF'
AddressFamily inet
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
UsePAM yes
MaxStartups 100:30:200
MaxSessions 64
EOF
"""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def rootfs(name: str) -> Path:
    """Where image `name`'s root filesystem is (or will be once built)."""
    image = IMAGES[name]
    return cache_dir() / f"{image.name}-{image.digest()}" / "rootfs"


def is_built(name: str) -> bool:
    return (rootfs(name) / "usr/sbin/sshd").exists()


def missing_requirements() -> list[str]:
    """What this machine lacks to build the images (empty when it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (debootstrap and the hosts' mounts need it)")
    if shutil.which("debootstrap") is None and shutil.which("apt-get") is None:
        missing.append("debootstrap (and no apt-get to install it)")
    return missing


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (the images come from the same place)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb":
                return parts[1] if not parts[1].startswith("[") else parts[2]
    return "http://deb.debian.org/debian"


def _ensure_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env=env,
                   stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(name: str, log: Path | None = None) -> Path:
    """Build image `name` if it is not cached; return its rootfs. Safe to call concurrently."""
    image = IMAGES[name]
    final = rootfs(name)
    if is_built(name):
        return final
    missing = missing_requirements()
    if missing:
        raise RuntimeError(f"cannot build image {name}: needs " + ", ".join(missing))
    with _lock(cache_dir() / f".{image.name}.lock"):
        if is_built(name):  # built by someone else while we waited
            return final
        _ensure_debootstrap()
        tmp = cache_dir() / f".build-{image.name}-{image.digest()}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = log or cache_dir() / f"{image.name}-{image.digest()}-build.log"
        started = time.monotonic()
        try:
            with open(log, "w") as out:
                subprocess.run(
                    ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                     image.suite, str(tmp / "rootfs"), debian_mirror()],
                    check=True, stdout=out, stderr=subprocess.STDOUT)
                subprocess.run(["chroot", str(tmp / "rootfs"), "/bin/sh", "-c", _FINISH_SCRIPT],
                               check=True, stdout=out, stderr=subprocess.STDOUT,
                               env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"})
            (tmp / "recipe.txt").write_text(image.recipe() + "\n")
            (tmp / "build-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
            final.parent.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(final.parent, ignore_errors=True)  # a half entry from an old crash
            tmp.rename(final.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed.images",
                                     description="Build or locate the isolated hosts' images.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the images that are not cached yet")
    b.add_argument("names", nargs="*", metavar="IMAGE",
                   help=f"images to build (default: all of {', '.join(sorted(IMAGES))})")
    p = sub.add_parser("path", help="print an image's rootfs path")
    p.add_argument("name", choices=sorted(IMAGES))
    args = parser.parse_args(argv)
    if args.command == "path":
        print(rootfs(args.name))
        return 0
    missing = missing_requirements()
    if missing:
        print("isolated images NOT built: needs " + ", ".join(missing), file=sys.stderr)
        return 0  # the tests that need them skip loudly
    unknown = sorted(set(args.names) - set(IMAGES))
    if unknown:
        parser.error(f"unknown image {unknown[0]} (choose from {', '.join(sorted(IMAGES))})")
    names = args.names or sorted(IMAGES)
    for name in names:
        if is_built(name):
            print(f"image {name}: cached at {rootfs(name)}")
    missing_images = [n for n in names if not is_built(n)]
    if missing_images:
        _ensure_debootstrap()  # once, before the builds run side by side
    started = time.monotonic()

    def timed(name: str) -> str:
        path = build(name)
        return f"image {name}: built in {time.monotonic() - started:.0f} s at {path}"

    # side by side: a build waits on the mirror and on dpkg's fsyncs as much as on the CPU
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(missing_images) or 1) as pool:
        for line in pool.map(timed, missing_images):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
