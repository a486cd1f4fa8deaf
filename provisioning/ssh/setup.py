"""Setting an SSH machine up to run `python -m trainer`: this project's wheel in a cached env.

The orchestrator builds this project's wheel once per run (`pip wheel --no-deps`, from a copy of
the sources so the checkout stays clean), copies it to each machine over SFTP and installs it
into an environment named by the wheel's *content* digest (zip timestamps excluded, so the same
code gives the same name), the Python version and the interpreter. The environment is marked
ready last, under a host-side lock (`flock`), so a second run — or a run racing this one — finds
it ready and installs nothing.

Two ways to get the trainer's dependencies onto a machine:
- the machine declares an interpreter whose environment already has them (`hosts[].python`,
  the usual lab server): only our wheel is installed, with `--no-deps`, into
  `<env>/site`, which the trainer gets on its `PYTHONPATH`;
- otherwise a venv is created with the machine's `python3` and everything is installed from a
  wheelhouse the orchestrator prepared (`provider.wheelhouse`, filled by `pip download` on the
  orchestrator when it lacks our wheel's dependencies) and copied over; the machine needs no
  package index (air-gapped lab machines).
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from provisioning.base import BadRequestError, ProvisionError
from provisioning.ssh.connection import SshConnection
from provisioning.ssh.runner import sftp_makedirs, sftp_put

#: What goes into the wheel build (the rest of the checkout is not needed to build it).
_SOURCE_ITEMS = ("pyproject.toml", "README.md", "orchestrator", "trainer", "provisioning",
                 "analysis")
READY_MARKER = ".ready"
INSTALL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Wheel:
    path: Path
    digest: str  # sha256 over the wheel's member names and contents

    @property
    def name(self) -> str:
        return self.path.name


def project_root() -> Path:
    """The source checkout this package was imported from (where pyproject.toml is)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").exists():
        raise BadRequestError(
            f"provider: setting up ssh hosts builds this project's wheel from its source "
            f"checkout, but {root} has no pyproject.toml")
    return root


def source_stamp(root: Path | None = None) -> str:
    """A cheap fingerprint of the sources a wheel is built from (names, sizes, mtimes), so a
    process rebuilds the wheel only when the code changed."""
    root = root or project_root()
    h = hashlib.sha256()
    for item in _SOURCE_ITEMS:
        path = root / item
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            with contextlib.suppress(OSError):
                st = file.stat()
                h.update(f"{file.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def wheel_digest(path: Path) -> str:
    """Digest of what a wheel installs, independent of the zip's timestamps."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + z.read(name) + b"\0")
    return h.hexdigest()


def build_wheel(out_dir: Path, root: Path | None = None) -> Wheel:
    """Build this project's wheel (no dependencies) into `out_dir` from a copy of the sources."""
    root = root or project_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="transient-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        for item in _SOURCE_ITEMS:
            path = root / item
            if path.is_dir():
                shutil.copytree(path, src / item, ignore=ignore)
            elif path.exists():
                shutil.copy2(path, src / item)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "--wheel-dir", str(out_dir), str(src)],
            capture_output=True, text=True)
    if result.returncode != 0:
        raise ProvisionError(f"building this project's wheel failed: {result.stderr[-800:]}")
    wheels = sorted(out_dir.glob("transient_orchestrator-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise ProvisionError(f"building this project's wheel left no wheel in {out_dir}")
    return Wheel(wheels[-1], wheel_digest(wheels[-1]))


class WheelCache:
    """Builds the wheel (and prepares the wheelhouse) at most once per run, whoever asks first."""

    def __init__(self, work_dir: Path, wheelhouse: Path | None = None,
                 extra: str | None = None) -> None:
        self.work_dir = work_dir
        self.wheelhouse = wheelhouse
        self.extra = extra
        self._wheel: Wheel | None = None
        self._wheelhouse_ready = False
        self._lock = threading.Lock()

    def wheel(self) -> Wheel:
        """The wheel in `work_dir` if an earlier run built it there, else built now (into a
        staging folder, renamed into place, so concurrent runs never see half a wheel)."""
        with self._lock:
            if self._wheel is None:
                built = sorted(self.work_dir.glob("transient_orchestrator-*.whl"))
                if built:
                    self._wheel = Wheel(built[-1], wheel_digest(built[-1]))
                else:
                    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=self.work_dir))
                    try:
                        wheel = build_wheel(staging)
                        target = self.work_dir / wheel.name
                        wheel.path.replace(target)
                        self._wheel = Wheel(target, wheel.digest)
                    finally:
                        shutil.rmtree(staging, ignore_errors=True)
            return self._wheel

    def prepared_wheelhouse(self) -> Path:
        """The wheelhouse with every wheel our wheel (with `extra`) needs; downloaded into it
        on the orchestrator (which has a package index) when something is missing."""
        wheel = self.wheel()
        if self.wheelhouse is None:
            raise BadRequestError(
                "provider.wheelhouse: a host without `python` (an interpreter that already has "
                "the trainer's dependencies) needs a wheelhouse to install them from")
        with self._lock:
            if not self._wheelhouse_ready:
                self.wheelhouse.mkdir(parents=True, exist_ok=True)
                marker = self.wheelhouse / f".complete-{wheel.digest[:16]}-{self.extra}"
                if not marker.exists():
                    target = f"{wheel.path}[{self.extra}]" if self.extra else str(wheel.path)
                    result = subprocess.run(
                        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                         "--dest", str(self.wheelhouse), target],
                        capture_output=True, text=True)
                    if result.returncode != 0:
                        raise ProvisionError(
                            f"preparing the wheelhouse {self.wheelhouse} failed: "
                            f"{result.stderr[-800:]}")
                    marker.touch()
                self._wheelhouse_ready = True
        return self.wheelhouse


@dataclass(frozen=True)
class Environment:
    """A ready environment on a machine: how to start the trainer there."""

    path: str
    command: list[str]  # argv prefix running `python -m trainer`
    env: dict[str, str]
    installed: bool  # False when it was already there (cached)


def ensure_environment(connection: SshConnection, root: str, python: str | None,
                       cache: WheelCache, extra: str | None) -> Environment:
    """Create or reuse the environment for this run's wheel on the machine (idempotent)."""
    wheel = cache.wheel()
    q = shlex.quote
    interpreter = python or "python3"
    probe = connection.run(
        f"{q(interpreter)} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
        check=False)
    if probe.exit_code != 0:
        raise ProvisionError(f"ssh host {connection.target.label}: python {interpreter!r} does "
                             f"not run there: {probe.stderr.strip()[-300:]}")
    version = probe.stdout.strip()
    flavour = hashlib.sha256(f"{interpreter}\0{extra}".encode()).hexdigest()[:8]
    env_dir = posixpath.join(root, "envs", f"{wheel.digest[:16]}-py{version}-{flavour}")
    if python is not None:
        site = posixpath.join(env_dir, "site")
        result = Environment(env_dir, [python, "-m", "trainer"], {"PYTHONPATH": site}, False)
    else:
        result = Environment(env_dir, [posixpath.join(env_dir, "venv", "bin", "python"), "-m",
                                       "trainer"], {}, False)
    marker = posixpath.join(env_dir, READY_MARKER)
    if connection.run(f"test -f {q(marker)}", check=False).exit_code == 0:
        return result
    remote_wheel = posixpath.join(root, "wheels", wheel.name)
    wheelhouse = None if python is not None else cache.prepared_wheelhouse()
    with connection.sftp() as sftp:
        _put_if_changed(sftp, wheel.path, remote_wheel)
        if wheelhouse is not None:
            for file in sorted(wheelhouse.glob("*.whl")):
                _put_if_changed(sftp, file, posixpath.join(root, "wheelhouse", file.name))
    if python is not None:
        install = (f"{q(python)} -m pip install --quiet --no-deps --no-index --no-compile "
                   f"--disable-pip-version-check --target {q(site)} {q(remote_wheel)}")
    else:
        target = f"{remote_wheel}[{extra}]" if extra else remote_wheel
        venv = posixpath.join(env_dir, "venv")
        install = (f"{q(interpreter)} -m venv {q(venv)} && {q(venv)}/bin/python -m pip install "
                   f"--quiet --no-index --disable-pip-version-check --find-links "
                   f"{q(posixpath.join(root, 'wheelhouse'))} {q(target)}")
    lock = q(env_dir + ".lock")
    script = (f"set -e; mkdir -p {q(posixpath.dirname(env_dir))}; exec 9> {lock}; flock 9; "
              f"if [ -f {q(marker)} ]; then exit 0; fi; rm -rf {q(env_dir)}; "
              f"mkdir -p {q(env_dir)}; {install}; touch {q(marker)}")
    connection.run(script, timeout_s=INSTALL_TIMEOUT_S)
    return Environment(result.path, result.command, result.env, True)


def _put_if_changed(sftp, local: Path, remote: str) -> None:  # type: ignore[no-untyped-def]
    """Copy unless the host already has a file of that name and size (wheels are immutable)."""
    try:
        if sftp.stat(remote).st_size == local.stat().st_size:
            return
    except FileNotFoundError:
        sftp_makedirs(sftp, posixpath.dirname(remote))
    sftp_put(sftp, local, remote)
