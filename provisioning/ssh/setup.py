"""Setting an SSH machine up to run `python -m trainer`: this project's wheel in a cached env.

The orchestrator builds the hosts' wheel once per state of the sources (`pip wheel --no-deps`,
from a copy of `trainer/` with a pyproject written for the hosts: name `transient-orchestrator-
host`, the hosts' dependency set and Python range from `provisioning.host_runtime`, so the
checkout stays clean and nothing of the orchestrator's goes along), copies it to each machine
over SFTP under its content digest (zip timestamps excluded, so the same code gives the same
name), and runs one remote command, `host_setup.py`, with the machine's `python3`: it checks the
Python and platform, names the environment by that digest, the Python version and the
interpreter, and builds it under a host-side `flock`, marked ready last, so a second run — or a
run racing this one — finds it ready and installs nothing. One command, because each starts the
login shell, and lab servers' rc files (conda or pyenv init) cost a fifth of a second or more of
CPU each.

Three ways to get the trainer's dependencies onto a machine (`setup_mode`):
- `site`: the machine declares an interpreter whose environment already has them
  (`hosts[].python`, the usual lab server; `provider.python` on GCE): only our wheel is unpacked
  (no pip, no bytecode compilation) into `<env>/site`, which the trainer gets on PYTHONPATH;
- `index` (the default, `provider.index_url`, the public PyPI unless set): the host builds a venv
  of the hosts' dependency set itself, with a supported `python3[.X]` of its own and pip fetched
  from that index, which it installs from, so only our wheel (~100 KB) crosses the user's link;
- `wheelhouse` (`provider.wheelhouse`, for air-gapped machines): the same venv, filled with no
  index from wheels the orchestrator downloads FOR THAT HOST's Python and platform (`pip download
  --python-version --platform --only-binary=:all:`, only the hosts' dependency set and pip) into
  `<wheelhouse>/<key>` and copies once per host (`<root>/wheelhouse/<key>`, marked complete last).
The venv is named by the dependency set, so new code reuses it and only unpacks our wheel into
`<env>/site`, as in the first case. A host with no supported interpreter or another platform is
refused with one line naming it, its Python and platform and what to change, before any install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
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
from provisioning.host_runtime import HostRuntime, platform_tags
from provisioning.host_runtime import load as load_runtime
from provisioning.ssh.connection import SshConnection
from provisioning.ssh.runner import sftp_put
from trainer.layout import HOST_DIST  # the hosts' distribution, named once

#: What the hosts' wheel is built from: the package that runs there (`python -m trainer`, which
#: imports nothing of `orchestrator`, `provisioning` or `analysis`: those run on the orchestrator's
#: machine only), its licence and a pyproject written for the hosts (`_host_pyproject`). Leaving
#: the rest out made the wheel 334 KB -> ~100 KB and its unpacking, most of a cached host's setup,
#: less than half as long.
_SOURCE_ITEMS = ("LICENSE", "trainer")
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
    for item in (*_SOURCE_ITEMS, "pyproject.toml"):
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


def _host_pyproject(runtime: HostRuntime) -> str:
    """The hosts' wheel's pyproject: its dependencies and Python are the hosts' (a pip that
    installs it checks them), not the orchestrator's."""
    def toml_list(items: tuple[str, ...] | list[str]) -> str:
        return json.dumps(list(items))

    extras = "\n".join(f"{name} = {toml_list(lines)}" for name, lines in runtime.extras.items())
    return f"""[build-system]
requires = ["setuptools>=77.0.3"]
build-backend = "setuptools.build_meta"

[project]
name = "{HOST_DIST}"
version = "{runtime.version}"
description = "What transient-orchestrator runs on its hosts: python -m trainer"
requires-python = "{runtime.requires_python}"
license = "Apache-2.0"
license-files = ["LICENSE"]
dependencies = {toml_list(runtime.base)}

[project.optional-dependencies]
{extras}

[tool.setuptools]
packages = {{ find = {{ include = ["trainer*"] }} }}
"""


def build_wheel(out_dir: Path, root: Path | None = None,
                runtime: HostRuntime | None = None) -> Wheel:
    """Build the hosts' wheel (no dependencies; only the package that runs there,
    `_SOURCE_ITEMS`, with the hosts' metadata) into `out_dir` from a copy of the sources."""
    root = root or project_root()
    runtime = runtime or load_runtime(root)
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
        (src / "pyproject.toml").write_text(_host_pyproject(runtime))
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "--wheel-dir", str(out_dir), str(src)],
            capture_output=True, text=True)
    if result.returncode != 0:
        raise ProvisionError(f"building this project's wheel failed: {result.stderr[-800:]}")
    wheels = sorted(out_dir.glob(f"{HOST_DIST.replace('-', '_')}-*.whl"),
                    key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise ProvisionError(f"building this project's wheel left no wheel in {out_dir}")
    return Wheel(wheels[-1], wheel_digest(wheels[-1]))


class WheelCache:
    """What every host of a run installs, prepared at most once per run whoever asks first: the
    hosts' wheel, and with `wheelhouse` a folder of wheels per host Python and platform.

    `extra` (cpu, gpu) picks TensorFlow's build; `index_url` is the package index the hosts
    install from (None: only `wheelhouse` or hosts with `python`); `runtime` the dependency set
    (`provisioning.host_runtime`, from pyproject.toml; tests pass a small one)."""

    def __init__(self, work_dir: Path, wheelhouse: Path | None = None,
                 extra: str | None = "cpu", index_url: str | None = None,
                 runtime: HostRuntime | None = None) -> None:
        self.work_dir = work_dir
        self.wheelhouse = wheelhouse
        self.extra = extra or "cpu"
        self.index_url = index_url
        self.runtime = runtime
        self._wheel: Wheel | None = None
        self._houses: dict[str, Path] = {}
        self._lock = threading.Lock()

    def host_runtime(self) -> HostRuntime:
        if self.runtime is None:
            self.runtime = load_runtime()
        return self.runtime

    @property
    def mode(self) -> str:
        """How hosts without `python` get the dependencies: `wheelhouse` (set: an air-gapped
        lab) wins over `index`."""
        if self.wheelhouse is not None:
            return "wheelhouse"
        if self.index_url:
            return "index"
        raise BadRequestError(
            "provider.index_url: a host without `python` (an interpreter that already has the "
            "trainer's dependencies) installs them from a package index or from "
            "provider.wheelhouse, and neither is set")

    def wheel(self) -> Wheel:
        """The wheel in `work_dir` if an earlier run built it there, else built now (into a
        staging folder, renamed into place, so concurrent runs never see half a wheel). The
        build holds a file lock on `work_dir`: caches of other extras (a cluster of GPU and CPU
        machines) and concurrent runs wait for one build instead of building it again."""
        with self._lock:
            if self._wheel is None:
                with open(self.work_dir / ".build.lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    built = sorted(self.work_dir.glob(f"{HOST_DIST.replace('-', '_')}-*.whl"))
                    if built:
                        self._wheel = Wheel(built[-1], wheel_digest(built[-1]))
                    else:
                        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=self.work_dir))
                        try:
                            wheel = build_wheel(staging, runtime=self.runtime)
                            target = self.work_dir / wheel.name
                            wheel.path.replace(target)
                            self._wheel = Wheel(target, wheel.digest)
                        finally:
                            shutil.rmtree(staging, ignore_errors=True)
            return self._wheel

    def wheelhouse_for(self, key: str, minor: int, glibc: tuple[int, int], machine: str) -> Path:
        """`<wheelhouse>/<key>`: the hosts' dependency set and pip as wheels for CPython
        3.`minor` on manylinux (glibc `glibc`, `machine`), whatever this machine's own Python
        and platform. Wheels already in the folder (or put flat into `<wheelhouse>` by the
        user, for an orchestrator that has no index either) are used without an index (an
        offline `pip download` checks the set is complete); what is missing is downloaded.
        Marked complete last, so a later run reuses it without asking pip."""
        assert self.wheelhouse is not None
        with self._lock:
            if key in self._houses:
                return self._houses[key]
            folder = self.wheelhouse / key
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (folder / _READY).exists():
                    runtime = self.host_runtime()
                    wanted = [*runtime.requirements(self.extra), "pip"]
                    platforms = [a for tag in platform_tags(glibc, machine)
                                 for a in ("--platform", tag)]
                    download = [sys.executable, "-m", "pip", "download", "--quiet",
                                "--disable-pip-version-check", "--only-binary=:all:",
                                "--python-version", f"3.{minor}", "--implementation", "cp",
                                *platforms, "--dest", str(folder), "--find-links",
                                str(self.wheelhouse), "--find-links", str(folder), *wanted]
                    offline = subprocess.run([*download, "--no-index"], capture_output=True,
                                             text=True)
                    if offline.returncode != 0:
                        result = subprocess.run(download, capture_output=True, text=True)
                        if result.returncode != 0:
                            raise ProvisionError(
                                f"provider.wheelhouse: downloading the hosts' wheels for Python "
                                f"3.{minor} on manylinux {machine} (glibc {glibc[0]}.{glibc[1]}) "
                                f"into {folder} failed: {_last_line(result.stderr)}")
                    (folder / _READY).touch()
            self._houses[key] = folder
            return folder


@dataclass(frozen=True)
class Environment:
    """A ready environment on a machine: how to start the trainer there."""

    path: str
    command: list[str]  # argv prefix running `python -m trainer`
    env: dict[str, str]
    installed: bool  # False when it was already there (cached)
    deps_installed: bool = False  # a venv of dependencies was made (hosts without `python`)
    mode: str = "site"  # site | index | wheelhouse (module docstring)
    version: str = ""  # the environment's Python, X.Y


#: The host-side installer, sent as one `python -c` (see its docstring for why).
_HOST_SCRIPT = (Path(__file__).with_name("host_setup.py")).read_text()
_READY = ".ready"  # host_setup.READY: a folder is complete (the script is not imported here)


def ensure_environment(connection: SshConnection, root: str, python: str | None,
                       cache: WheelCache, extra: str | None = None) -> Environment:
    """Create or reuse the environment for this run's wheel on the machine (idempotent).

    The wheel goes over the machine's SFTP session, skipped when the host already has it (its
    path carries the wheel's digest); then one remote command, `host_setup.py` run by the
    host's `python3` (or `python`), checks the host's Python and platform, reuses a ready
    environment or builds it under a lock. In wheelhouse mode a host whose venv is not ready
    yet answers with its Python and platform; the wheels for it are copied (once: marked
    complete last) and the command runs again. Raises BadRequestError, one line, for a host
    no wheel of the runtime fits."""
    wheel = cache.wheel()
    mode = "site" if python is not None else cache.mode
    extra = extra or cache.extra
    interpreter = python or "python3"
    remote_wheel = posixpath.join(root, "wheels", wheel.digest[:16], wheel.name)
    with connection.sftp() as sftp:
        _put_if_absent(sftp, wheel.path, remote_wheel)
    spec: dict[str, object] = {
        "envs": posixpath.join(root, "envs"), "digest": wheel.digest[:16],
        # With a declared interpreter only our wheel is installed (no dependencies): the
        # extra changes nothing, so GPU and CPU machines sharing a file system share one.
        "flavour": hashlib.sha256(f"{interpreter}\0{extra if mode != 'site' else ''}"
                                  .encode()).hexdigest()[:8],
        "wheel": remote_wheel, "mode": mode}
    if mode != "site":
        runtime = cache.host_runtime()
        spec.update(check=runtime.host_check(), deps=runtime.digest(extra),
                    requirements=runtime.requirements(extra), index_url=cache.index_url,
                    wheelhouse=posixpath.join(root, "wheelhouse"))
    done = _run_host_script(connection, interpreter, spec)
    if done["status"] == "need_wheelhouse":
        key = str(done["key"])
        local = cache.wheelhouse_for(key, int(done["minor"]), tuple(done["glibc"]),
                                     str(done["machine"]))
        remote = posixpath.join(root, "wheelhouse", key)
        with connection.sftp() as sftp:
            for file in sorted(local.glob("*.whl")):
                _put_if_absent(sftp, file, posixpath.join(remote, file.name))
            with sftp.open(posixpath.join(remote, _READY), "w"):
                pass  # complete: every wheel is there
        done = _run_host_script(connection, interpreter, spec)
    if done["status"] == "unsupported":
        runtime = cache.host_runtime()
        raise BadRequestError(
            f"ssh host {connection.target.label}: its python3 is {done['version']} on "
            f"{done['platform']} (glibc {done['glibc']}), and the hosts' runtime (TensorFlow 2.21) "
            f"installs on CPython {runtime.pythons()} on Linux {runtime.machine} with glibc >= "
            f"{runtime.glibc[0]}.{runtime.glibc[1]}: install python3.{runtime.max_minor} (or "
            f"another of those) there (the OS's package, or `uv python install "
            f"3.{runtime.max_minor}`, whose ~/.local/bin/python3.{runtime.max_minor} the setup "
            f"finds) or use an image that has one, or set its `python` to an interpreter that "
            f"already has TensorFlow 2.21")
    if done["status"] != "ready":
        raise ProvisionError(f"ssh host {connection.target.label}: setup answered "
                             f"{done['status']!r}")
    return Environment(str(done["env"]), [python or str(done["python"]), "-m", "trainer"],
                       {"PYTHONPATH": posixpath.join(str(done["env"]), "site")},
                       bool(done["installed"]), bool(done["deps_installed"]), mode,
                       str(done["version"]))


def _run_host_script(connection: SshConnection, interpreter: str,
                     spec: dict[str, object]) -> dict[str, object]:
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
    return json.loads(result.stdout.strip().splitlines()[-1])


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


_wheel_caches: dict[tuple[str, str | None, str, str | None], WheelCache] = {}
_wheel_caches_lock = threading.Lock()


def wheel_cache(wheelhouse: str | None, extra: str, index_url: str | None) -> WheelCache:
    """One wheel per state of the sources: built at most once per run, and kept in the user's
    cache (`$XDG_CACHE_HOME/transient-orchestrator/wheels/<source stamp>/`) for later runs."""
    stamp = source_stamp()
    key = (stamp, wheelhouse, extra, index_url)
    with _wheel_caches_lock:
        if key not in _wheel_caches:
            cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            work_dir = cache_root / "transient-orchestrator" / "wheels" / stamp[:24]
            work_dir.mkdir(parents=True, exist_ok=True)
            _wheel_caches[key] = WheelCache(
                work_dir, None if wheelhouse is None else Path(wheelhouse).expanduser(), extra,
                index_url)
        return _wheel_caches[key]
