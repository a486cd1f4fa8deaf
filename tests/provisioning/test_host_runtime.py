"""The hosts' runtime (provisioning/host_runtime.py) and how a bare host installs it
(provisioning/ssh/host_setup.py in `index` and `wheelhouse` modes, setup.py's wheel and
wheelhouse): what pyproject.toml declares, the hosts' wheel's metadata, and the host script run
here as a host runs it (`python -S -c`). Their subject is not the machine: the script runs on this
machine, against a PEP 503 index served on loopback from a folder of small wheels written here
(TensorFlow is far too heavy for a unit test: the isolated-host tests install the real set).
"""

from __future__ import annotations

import ensurepip
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from provisioning import host_runtime
from provisioning.checkout import PROJECT_ROOT
from provisioning.gce.config import GceConfig
from provisioning.host_runtime import HostRuntime, platform_tags
from provisioning.ssh.config import SshProviderConfig
from provisioning.ssh.setup import _HOST_SCRIPT, HOST_DIST, WheelCache, build_wheel
from tests.provisioning.test_ssh import write_wheel

#: A stand-in dependency set: one small pure-Python package.
TINY = HostRuntime("0.0.1", ("tinydep>=1",), {"cpu": (), "gpu": ()}, 11, 13,
                   "manylinux_2_17_x86_64")


def pip_wheel() -> Path:
    pips = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not pips:
        pytest.skip("HOST INSTALL NOT RUN: this Python's ensurepip bundles no pip wheel to "
                    "serve to the host script")
    return pips[-1]


@pytest.fixture
def index(tmp_path) -> Iterator[tuple[str, Path]]:
    """A PEP 503 simple index on loopback serving tinydep and pip (hashes in the links)."""
    files = tmp_path / "index-files"
    files.mkdir()
    write_wheel(files, "tinydep", "1.0", {"tinydep/__init__.py": "VALUE = 42\n"})
    shutil.copy(pip_wheel(), files)
    root = tmp_path / "index"
    for wheel in files.iterdir():
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        shutil.copy(wheel, root / wheel.name)
        (page / "index.html").write_text(
            f'<html><body><a href="../../{wheel.name}#sha256={digest}" '
            f'data-requires-python="&gt;=3.9">{wheel.name}</a></body></html>')
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", files
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        pass


def run_script(spec: dict, python: str = sys.executable, path: str | None = None) -> dict:
    env = {**os.environ, "PATH": path} if path is not None else None
    done = subprocess.run([python, "-S", "-c", _HOST_SCRIPT, json.dumps(spec)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def bare_spec(tmp_path: Path, mode: str, runtime: HostRuntime = TINY, **more) -> dict:
    wheel = write_wheel(tmp_path, HOST_DIST, "0.0.1", {
        "trainer/__init__.py": "", "trainer/__main__.py": "import tinydep\nprint(tinydep.VALUE)\n"})
    return {"envs": str(tmp_path / "envs"), "digest": "d" * 16, "flavour": "f" * 8,
            "wheel": str(wheel), "mode": mode, "check": runtime.host_check(),
            "deps": runtime.digest("cpu"), "requirements": runtime.requirements("cpu"),
            "wheelhouse": str(tmp_path / "remote-wheelhouse"), **more}


def run_trainer(result: dict) -> str:
    done = subprocess.run([result["python"], "-m", "trainer"], capture_output=True, text=True,
                          env={"PYTHONPATH": os.path.join(result["env"], "site")}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- what pyproject.toml declares ---------------------------------------------------------------


def test_the_hosts_runtime_is_declared_once_in_pyproject() -> None:
    """The hosts' set is TensorFlow plus the `host` extra, nothing of the orchestrator's; the
    orchestrator's own cpu/gpu extras reference it rather than repeat it."""
    runtime = host_runtime.load()
    cpu, gpu = runtime.requirements("cpu"), runtime.requirements("gpu")
    assert any(r.startswith("tensorflow-cpu==2.21") for r in cpu)
    assert any(r.startswith("tensorflow[and-cuda]==2.21") for r in gpu)
    names = {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0] for r in cpu + gpu}
    assert not names & {"hydra-core", "omegaconf", "pandas", "matplotlib", "paramiko",
                        "google-cloud-compute", "google-cloud-storage", "rich"}
    assert (runtime.min_minor, runtime.max_minor) == (11, 13)
    assert runtime.digest("cpu") != runtime.digest("gpu")
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert "transient-orchestrator[host-cpu]" in extras["cpu"]
    assert "transient-orchestrator[host-gpu]" in extras["gpu"]


def test_a_circular_extra_is_refused() -> None:
    data = {"project": {"version": "1", "optional-dependencies": {
        "host": ["transient-orchestrator[host-cpu]"], "host-cpu": ["transient-orchestrator[host]"],
        "host-gpu": []}},
        "tool": {"transient-orchestrator": {"hosts": {"requires-python": ">=3.11,<3.14",
                                                      "platform": "manylinux_2_27_x86_64"}}}}
    with pytest.raises(ValueError, match="circular"):
        host_runtime.parse(data)


def test_platform_tags_cover_every_older_manylinux() -> None:
    tags = platform_tags((2, 27), "x86_64")
    assert tags[0] == "manylinux_2_27_x86_64" and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_28_x86_64" not in tags


def test_the_hosts_wheel_declares_the_hosts_set_and_python(tmp_path) -> None:
    """Small (< 1 MB, only `trainer`), named for the hosts, with their dependencies and
    Python range: a pip that installs it checks what the hosts really need."""
    wheel = build_wheel(tmp_path)
    assert wheel.path.stat().st_size < 1_000_000
    runtime = host_runtime.load()
    with zipfile.ZipFile(wheel.path) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "trainer"}
    head = meta.split("\n\n", 1)[0].splitlines()
    assert f"Name: {HOST_DIST}" in head
    assert f"Requires-Python: <3.{runtime.max_minor + 1},>=3.{runtime.min_minor}" in head
    requires = {str(Requirement(ln.split(":", 1)[1])) for ln in head
                if ln.startswith("Requires-Dist:")}
    assert {str(Requirement(r)) for r in runtime.base} <= requires
    assert any(r.startswith("tensorflow-cpu==2.21") and 'extra == "cpu"' in r for r in requires)
    assert not any("hydra" in r or "pandas" in r for r in requires)


# --- the checks made before anything is provisioned -------------------------------------------


def test_install_keys_are_checked_as_typed() -> None:
    problems = dict(SshProviderConfig(index_url="pypi.org", extra="tpu").check())
    assert "not an http(s) URL" in problems["provider.index_url"]
    assert "cpu or gpu" in problems["provider.extra"]
    neither = dict(GceConfig(index_url=None).check())
    assert "provider.wheelhouse is not set" in neither["provider.index_url"]
    assert GceConfig().check() == []  # the defaults: index on the VM, a 3.12 image family


def test_an_image_family_with_an_unsupported_python_is_refused_before_any_vm() -> None:
    problems = dict(GceConfig(image_family="common-cu128-ubuntu-2204-nvidia-570").check())
    assert "Python 3.10" in problems["provider.image_family"]
    assert "3.11–3.13" in problems["provider.image_family"]
    # a baked image, an interpreter of its own, or a family whose name says nothing: the
    # host's probe decides
    assert GceConfig(image_family="common-cu128-ubuntu-2204-nvidia-570",
                     image="projects/p/global/images/mine").check() == []
    assert GceConfig(image_family="common-cu128-ubuntu-2204-nvidia-570",
                     python="/opt/tf/bin/python").check() == []
    assert host_runtime.image_family_python("my-own-family") is None
    assert host_runtime.image_family_python("common-cu124-ubuntu-2204-py310") == 10


# --- the host script, as a bare host runs it ----------------------------------------------------


def test_a_bare_host_installs_from_the_index_and_reuses_its_venv(tmp_path, index) -> None:
    """Index mode: a venv without pip, pip fetched from the index (sha256 checked), the set
    installed from the index; our wheel unpacked beside it. A second call installs nothing;
    new code reuses the venv."""
    url, _ = index
    spec = bare_spec(tmp_path, "index", index_url=url)
    first = run_script(spec)
    assert first["status"] == "ready" and first["installed"] and first["deps_installed"]
    assert first["version"] == f"3.{sys.version_info[1]}"
    assert first["python"].startswith(str(tmp_path / "envs" / f"venv-{spec['deps']}-py"))
    assert run_trainer(first) == "42"
    assert not Path(first["python"]).with_name("pip").exists()  # pip ran from its wheel
    again = run_script(spec)
    assert (again["env"], again["installed"], again["deps_installed"]) == (
        first["env"], False, False)
    newer = run_script({**spec, "digest": "e" * 16})
    assert newer["installed"] and not newer["deps_installed"]
    assert newer["python"] == first["python"]


def test_an_index_without_pip_falls_back_to_the_venvs_ensurepip(tmp_path, index) -> None:
    url, _ = index
    shutil.rmtree(tmp_path / "index" / "simple" / "pip")  # the index serves only the set
    result = run_script(bare_spec(tmp_path, "index", index_url=url))
    assert result["status"] == "ready" and result["deps_installed"]
    assert run_trainer(result) == "42"
    assert Path(result["python"]).with_name("pip").exists()  # the venv's own pip


def test_an_unreachable_index_says_what_to_set(tmp_path) -> None:
    spec = bare_spec(tmp_path, "index", index_url="http://127.0.0.1:9/simple")
    done = subprocess.run([sys.executable, "-S", "-c", _HOST_SCRIPT, json.dumps(spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "not reachable from this host" in last and "provider.wheelhouse" in last


def test_a_host_without_a_supported_python_is_told_apart_and_left_untouched(tmp_path) -> None:
    future = HostRuntime("0.0.1", ("tinydep>=1",), {"cpu": ()}, 40, 41, "manylinux_2_17_x86_64")
    result = run_script(bare_spec(tmp_path, "index", future, index_url="http://127.0.0.1:9/"))
    assert result["status"] == "unsupported"
    assert result["version"] == f"3.{sys.version_info[1]}" and "linux" in result["platform"]
    assert not (tmp_path / "envs").exists()
    other_machine = HostRuntime("0.0.1", (), {"cpu": ()}, 11, 13, "manylinux_2_17_riscv64")
    result = run_script(bare_spec(tmp_path, "index", other_machine, index_url="http://x/"))
    assert result["status"] == "unsupported"


def test_an_unsupported_python3_falls_back_to_a_python3x_on_path(tmp_path, index) -> None:
    """`python3` is not a minor the runtime installs on, but a `python3.13` on PATH is: the
    venv is made with that one (a shim that fails is skipped)."""
    other = next((p for p in sorted(Path("/root/.pyenv/versions").glob("3.13*/bin/python3.13"))
                  if p.exists()), None) or shutil.which("python3.13")
    if other is None or sys.version_info[:2] == (3, 13):
        pytest.skip("FALLBACK NOT RUN: no Python 3.13 besides this interpreter on this machine")
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python3.12").write_text("#!/bin/sh\nexit 127\n")  # a broken shim
    (folder / "python3.12").chmod(0o755)
    (folder / "python3.13").symlink_to(other)
    url, _ = index
    runtime = HostRuntime("0.0.1", ("tinydep>=1",), {"cpu": ()}, 12, 13, TINY.platform)
    result = run_script(bare_spec(tmp_path, "index", runtime, index_url=url),
                        path=f"{folder}:/usr/bin:/bin")
    assert result["status"] == "ready" and result["version"] == "3.13"
    assert "py3.13" in result["env"]
    assert run_trainer(result) == "42"


def test_wheelhouse_mode_asks_for_its_wheels_then_installs_offline(tmp_path, index) -> None:
    """Wheelhouse mode: the host names the key of the wheels it needs (dependency set, CPython
    minor, glibc, machine); the orchestrator downloads them for THAT Python and platform
    (here offline, from a flat folder of wheels), the folder is marked complete, and the venv
    is filled with no index."""
    _, files = index
    spec = bare_spec(tmp_path, "wheelhouse")
    ask = run_script(spec)
    assert ask["status"] == "need_wheelhouse"
    assert ask["key"].startswith(f"{spec['deps']}-cp3{sys.version_info[1]}-glibc")
    cache = WheelCache(tmp_path / "built", files, "cpu", runtime=TINY)
    folder = cache.wheelhouse_for(ask["key"], ask["minor"], tuple(ask["glibc"]), ask["machine"])
    assert folder == files / ask["key"] and (folder / ".ready").exists()
    assert sorted(p.name.split("-")[0] for p in folder.glob("*.whl")) == ["pip", "tinydep"]
    shutil.copytree(folder, Path(spec["wheelhouse"]) / ask["key"])
    done = run_script(spec)
    assert done["status"] == "ready" and done["deps_installed"]
    assert run_trainer(done) == "42"
    assert run_script(spec)["deps_installed"] is False


def test_a_baked_image_names_its_dependency_set_and_a_stale_one_is_refused() -> None:
    runtime = host_runtime.load()
    name = host_runtime.baked_image_name("projects/p/global/images/family/f", "gpu")
    assert name.startswith(f"transient-host-gpu-{runtime.digest('gpu')[:12]}-")
    assert host_runtime.baked_image_name("projects/p/global/images/family/f", "gpu") == name
    assert GceConfig(image=f"projects/p/global/images/{name}").check() == []
    stale = f"projects/p/global/images/transient-host-gpu-{'0' * 12}-{'1' * 8}"
    assert "bake a new one" in dict(GceConfig(image=stale).check())["provider.image"]
    assert GceConfig(image="projects/p/global/images/someone-elses").check() == []


def test_bake_refuses_what_it_cannot_bake_in_one_line_before_any_call(capsys) -> None:
    from orchestrator.image import main

    assert main(["bake", "provider.index_url=pypi.org"]) == 2
    assert main(["bake", "provider.python=/opt/tf/bin/python"]) == 2
    assert main(["bake", "index_url=x"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("config error: provider.index_url: 'pypi.org' is not")
    assert lines[1].startswith("config error: provider.python: set:")
    assert lines[2] == "config error: index_url=x: expected provider.KEY=VALUE"
