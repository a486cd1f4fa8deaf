"""Setting an SSH machine up to run `python -m trainer`: this project's wheel in a cached env.

The orchestrator builds this project's wheel for the hosts once per state of the sources (`pip
wheel --no-deps`, from a copy of the sources so the checkout stays clean, without the papers'
reference data that only the orchestrator reads), copies it to each machine over SFTP under its
content digest (zip timestamps excluded, so the same code gives the same name), and runs one
remote command, `host_setup.py`, with the machine's interpreter: it names the environment by
that digest, the Python version and the interpreter, and builds it under a host-side `flock`,
marked ready last, so a second run — or a run racing this one — finds it ready and installs
nothing. One command, because each starts the login shell, and lab servers' rc files (conda or
pyenv init) cost a fifth of a second or more of CPU each.

Two ways to get the trainer's dependencies onto a machine:
- the machine declares an interpreter whose environment already has them (`hosts[].python`,
  the usual lab server): only our wheel is unpacked (no pip, no bytecode compilation) into
  `<env>/site`, which the trainer gets on its `PYTHONPATH`;
- otherwise a venv (without pip) is created with the machine's `python3`, and pip, run from
  its own wheel in the wheelhouse, installs the dependencies from a wheelhouse the orchestrator
  prepared (`provider.wheelhouse`, filled by `pip wheel` on the orchestrator when it lacks our
  wheel's dependencies) and copied over; the machine needs no package index (air-gapped lab
  machines). That venv is named by the dependency set, so new code reuses it and only unpacks
  our wheel into `<env>/site`, as in the first case.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
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
from provisioning.checkout import PROJECT_ROOT
from provisioning.ssh.connection import SshConnection
from provisioning.ssh.runner import sftp_put

#: What the hosts' wheel is built from: the two packages that run there (`python -m trainer`;
#: gce VMs also `python -m provisioning.gce.storage`; neither imports `orchestrator` or
#: `analysis`, which only the orchestrator's machine runs), and what the build reads. Leaving
#: the orchestrator, the analysis and the papers' measurements out (1,000 files, 7.5 MB) made
#: the wheel 334 KB -> ~150 KB and its unpacking, most of a cached host's setup, half as long.
_SOURCE_ITEMS = ("pyproject.toml", "README.md", "LICENSE", "trainer", "provisioning")
#: Files the build needs although the hosts do not: pyproject's `license-files`.
_BUILD_ONLY = (Path("analysis") / "reference_data" / "LICENSE-Apache-2.0.txt",)
#: One host's setup; a cold venv with TensorFlow from the wheelhouse (450 MB copied, pip, bytecode)
#: took 14 min on the 2-core test machine under a load of 25-40 (measured once).
INSTALL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Wheel:
    path: Path
    digest: str  # sha256 over the wheel's member names and contents

    @property
    def name(self) -> str:
        return self.path.name


def project_root() -> Path:
    """The source tree the hosts' wheel is built from: the checkout this package was imported
    from, or for an installed tool the same items rebuilt from its installed files."""
    from provisioning.checkout import installed_source_tree, is_checkout

    if is_checkout(PROJECT_ROOT):
        return PROJECT_ROOT
    try:
        return installed_source_tree()
    except RuntimeError as ex:
        raise BadRequestError(f"provider: setting up ssh hosts: {ex}") from None


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
    """Build this project's wheel for the hosts (no dependencies; only the packages that run
    there, `_SOURCE_ITEMS`) into `out_dir` from a copy of the sources."""
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
        for item in _BUILD_ONLY:
            if (root / item).exists():
                (src / item).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / item, src / item)
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
        staging folder, renamed into place, so concurrent runs never see half a wheel). The
        build holds a file lock on `work_dir`: caches of other extras (a cluster of GPU and CPU
        machines) and concurrent runs wait for one build instead of building it again."""
        with self._lock:
            if self._wheel is None:
                with open(self.work_dir / ".build.lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
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
        """The wheelhouse with every wheel our wheel (with `extra`) needs, and pip's own wheel
        (hosts run pip from it, so they need neither pip nor `ensurepip`). A wheelhouse that
        already holds them all is used as it is, without a package index (checked by an
        offline `pip wheel`); otherwise what is missing is downloaded (and built, for an
        sdist) on the orchestrator, which has an index. The wheels are for the orchestrator's
        Python and platform: hosts must run the same Python minor version."""
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
                    # `pip wheel`, not `pip download --only-binary`: some dependencies ship
                    # only an sdist (hydra's antlr4 runtime), built into a wheel here once.
                    download = [sys.executable, "-m", "pip", "wheel", "--quiet",
                                "--disable-pip-version-check", "--wheel-dir",
                                str(self.wheelhouse), target, "pip"]
                    offline = subprocess.run(
                        [*download, "--no-index", "--find-links", str(self.wheelhouse)],
                        capture_output=True, text=True)
                    if offline.returncode != 0:
                        result = subprocess.run(download, capture_output=True, text=True)
                        if result.returncode != 0:
                            raise ProvisionError(
                                f"preparing the wheelhouse {self.wheelhouse} failed: "
                                f"{result.stderr[-800:]}")
                    marker.touch()
                self._wheelhouse_ready = True
            # our own wheel is copied on its own, under its digest
            for stale in self.wheelhouse.glob("transient_orchestrator-*.whl"):
                stale.unlink()
        return self.wheelhouse


@dataclass(frozen=True)
class Environment:
    """A ready environment on a machine: how to start the trainer there."""

    path: str
    command: list[str]  # argv prefix running `python -m trainer`
    env: dict[str, str]
    installed: bool  # False when it was already there (cached)
    deps_installed: bool = False  # a venv of dependencies was made (hosts without `python`)


#: The host-side installer, sent as one `python -c` (see its docstring for why).
_HOST_SCRIPT = (Path(__file__).with_name("host_setup.py")).read_text()


def ensure_environment(connection: SshConnection, root: str, python: str | None,
                       cache: WheelCache, extra: str | None) -> Environment:
    """Create or reuse the environment for this run's wheel on the machine (idempotent).

    The wheel (and the wheelhouse, for hosts without `python`) goes over the machine's SFTP
    session, skipped when the host already has it (its path carries the wheel's digest); then
    one remote command, `host_setup.py` run by the host's interpreter, probes the Python
    version, reuses a ready environment or builds it under a lock."""
    wheel = cache.wheel()
    interpreter = python or "python3"
    wheelhouse = None if python is not None else cache.prepared_wheelhouse()
    remote_wheel = posixpath.join(root, "wheels", wheel.digest[:16], wheel.name)
    remote_house = posixpath.join(root, "wheelhouse")
    with connection.sftp() as sftp:
        _put_if_absent(sftp, wheel.path, remote_wheel)
        if wheelhouse is not None:
            for file in sorted(wheelhouse.glob("*.whl")):
                _put_if_absent(sftp, file, posixpath.join(remote_house, file.name))
    name, requires = wheel_metadata(wheel.path)
    spec = {"envs": posixpath.join(root, "envs"), "digest": wheel.digest[:16],
            # With a declared interpreter only our wheel is installed (no dependencies): the
            # extra changes nothing, so GPU and CPU machines sharing a file system share one.
            "flavour": hashlib.sha256(f"{interpreter}\0{extra if python is None else ''}"
                                      .encode()).hexdigest()[:8],
            "wheel": remote_wheel, "mode": "site" if python is not None else "venv",
            "wheelhouse": remote_house, "extra": extra, "name": name,
            "deps": hashlib.sha256("\n".join([str(extra), *requires]).encode()).hexdigest()[:16]}
    q = shlex.quote
    # -S: the script needs the standard library only (host_setup.py says why it matters)
    result = connection.run(f"{q(interpreter)} -S -c {q(_HOST_SCRIPT)} {q(json.dumps(spec))}",
                            timeout_s=INSTALL_TIMEOUT_S, check=False)
    if result.exit_code != 0:
        if result.exit_code in (126, 127):  # the shell could not run the interpreter
            raise ProvisionError(f"ssh host {connection.target.label}: python {interpreter!r} "
                                 f"does not run there: {_last_line(result.stderr)}")
        raise ProvisionError(f"ssh host {connection.target.label}: setting up the trainer's "
                             f"environment failed (exit {result.exit_code}): "
                             f"{_last_line(result.stderr or result.stdout)}")
    done = json.loads(result.stdout.strip().splitlines()[-1])
    return Environment(done["env"], [python or done["python"], "-m", "trainer"],
                       {"PYTHONPATH": posixpath.join(done["env"], "site")}, done["installed"],
                       done["deps_installed"])


def wheel_metadata(path: Path) -> tuple[str, list[str]]:
    """The wheel's project name and its declared dependencies (`Requires-Dist`, sorted)."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().split("\n\n", 1)[0].splitlines()
    name = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Name:"))
    return name, sorted(ln.split(":", 1)[1].strip() for ln in lines
                        if ln.startswith("Requires-Dist:"))


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else ""


def _put_if_absent(sftp, local: Path, remote: str) -> None:  # type: ignore[no-untyped-def]
    """Copy unless the host already has a file of that name and size (wheel names are
    immutable: ours carries its digest in its folder, the wheelhouse's their version)."""
    try:
        if sftp.stat(remote).st_size == local.stat().st_size:
            return
    except FileNotFoundError:
        pass
    sftp_put(sftp, local, remote)  # makes the folders it needs
