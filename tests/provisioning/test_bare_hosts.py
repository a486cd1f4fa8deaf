"""A bare host sets itself up (issue 19 §2), on isolated hosts (tests/testbed/isolated.py) that
share nothing with this machine: Debian images with only their own Python, a non-root user with
sudo, no TensorFlow, no `python:` in the inventory, and a route to nothing but the bed's bridge.

- `+experiment=ssh_digits` through the real CLI on three Debian 13 hosts (Python 3.13, not the
  orchestrator's 3.11): each host installs TensorFlow and the hosts' set from the package index
  on the bed's bridge (`provider.index_url`, pypiserver serving wheels made for cp313) — only
  our wheel goes from this machine to the hosts;
- a Debian 12 host with no index at all (`provider.wheelhouse`): wheels downloaded here for
  ITS Python and platform, copied once; a second setup installs and copies nothing;
- hosts whose `python3` is 3.10 (Ubuntu 22.04's; a CPython 3.10 put into an image layer): the
  run stops with one line naming the host, its Python and platform, before any role starts;
- `provider=gce` with its defaults on the fake Compute API (VMs are isolated hosts): a VM of
  the default image family sets itself up from the index while `python -m orchestrator.image
  bake` makes an image of it; a VM of that image only unpacks our wheel.

Slow (TensorFlow installed for real, twice); skipped loudly where the bed cannot run.
"""

# ruff: noqa: F811  (the bed fixture is imported, then requested by name)
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioning import host_runtime
from provisioning.base import BadRequestError, ClusterRequest, HostSpec
from provisioning.registry import get_provider
from tests.orchestrator.test_run_local import check_run_dir
from tests.testbed import wheelhouse
from tests.testbed.fixtures import write_provider_file
from tests.testbed.isolated import IsolatedTestBed
from tests.testbed.isolated_fixtures import module_isolated_bed  # noqa: F401
from trainer import layout

pytestmark = pytest.mark.slow

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
SMALL = ["job.train_steps=300", "job.checkpoint_frequency=100", "job.eval_frequency=150",
         "progress=false", "preflight=false"]
#: Three hosts installing TensorFlow (~320 MB of wheels each) on a loaded 2-core machine.
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def bed(module_isolated_bed: IsolatedTestBed) -> IsolatedTestBed:
    """This module's own bed: its hosts (five TensorFlow installs) go with the module."""
    return module_isolated_bed


@pytest.fixture(scope="module")
def index_url(bed: IsolatedTestBed) -> str:
    """The bed's package index (one per bed): the hosts' set and pip, for cp313."""
    return bed.serve_index(wheelhouse.wheelhouse(wheelhouse.HOST_REQUIREMENTS, "3.13"))


def provider_dir(tmp_path: Path, options: dict) -> Path:
    """A Hydra search dir holding `provider/bare.yaml` (an ssh provider file)."""
    return write_provider_file(tmp_path / "conf", "bare", options)


def orchestrate(repo_root: Path, tmp_path: Path, options: dict, *extra: str
                ) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "orchestrator", "+experiment=ssh_digits", "provider=bare",
            *SMALL, *extra, f"hydra.searchpath=[file://{provider_dir(tmp_path, options)}]",
            f"hydra.run.dir={run_dir}"]
    done = subprocess.run(argv, cwd=repo_root, env=ENV, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return done, run_dir


def run(bed: IsolatedTestBed, host, command: str) -> str:  # type: ignore[no-untyped-def]
    done = bed.ssh(host, command)
    assert done.returncode == 0, f"{host.name}: {command!r}: {done.stderr}"
    return done.stdout


@pytest.mark.tf_cluster
def test_ssh_digits_on_bare_debian13_hosts_installing_from_the_index(
        repo_root: Path, bed: IsolatedTestBed, index_url: str, tmp_path: Path) -> None:
    url = index_url
    hosts = [bed.add_host(image="trixie") for _ in range(3)]
    for host in hosts:
        bed.wait_login(host)
    options = {"hosts": bed.inventory(hosts), "known_hosts": str(bed.known_hosts),
               "index_url": url, "stop_grace_s": 1.0}
    assert all("python" not in h for h in options["hosts"])
    done, run_dir = orchestrate(repo_root, tmp_path, options)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = check_run_dir(run_dir)  # completed, accuracy >= 0.9, every result file
    assert summary["provider"] == "ssh"
    for host in hosts:
        assert run(bed, host, "id -un").strip() == "cloud"
        # the venv is the host's own, made by its Python 3.13 with TensorFlow from the index
        probe = run(bed, host, "~/.transient/envs/venv-*/venv/bin/python -c 'import sys, "
                    "tensorflow; print(sys.version_info[1], tensorflow.__file__)'").split()
        assert probe[0] == "13" and probe[1].startswith("/home/cloud/.transient/envs/venv-")
        # what came from this machine: our wheel, no wheelhouse
        sent = run(bed, host, "find ~/.transient/wheels ~/.transient/wheelhouse -type f "
                   "2>/dev/null; true").split()
        assert len(sent) == 1 and sent[0].endswith(".whl"), sent
        for path in (repo_root, Path(sys.prefix), Path("/work"), Path.home() / ".cache"):
            assert bed.ssh(host, f"test -e {path}").returncode == 1, f"{path} on {host.name}"
        assert not bed.ssh(host, "pgrep -f trainer").stdout.strip()  # nothing left running


def one_host_request(tmp_path: Path) -> ClusterRequest:
    return ClusterRequest(run_id=f"t{time.monotonic_ns()}", hosts=[HostSpec("worker-0", "worker")],
                          workdir=tmp_path / "run")


def setup_once(options: dict, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Acquire the host, set it up as a run does, release it; returns (environment, seconds)."""
    provider = get_provider("ssh", options)
    cluster = provider.acquire(one_host_request(tmp_path))
    try:
        runner = provider.runner(cluster.hosts[0])
        start = time.monotonic()
        runner.setup()
        return runner.machine.environment, time.monotonic() - start
    finally:
        provider.release(cluster)


def test_a_debian12_host_without_an_index_installs_from_a_wheelhouse_made_for_it(
        bed: IsolatedTestBed, tmp_path: Path) -> None:
    """No index (`index_url: null`, and the host reaches none anyway): the orchestrator
    downloads the hosts' set for the host's cp311 and glibc into `provider.wheelhouse` (here
    from this machine's package index) and copies it once; a second setup copies nothing and
    installs nothing."""
    host = bed.add_host(image="bookworm")
    bed.wait_login(host)
    house = tmp_path / "wheelhouse"
    options = {"hosts": bed.inventory([host]), "known_hosts": str(bed.known_hosts),
               "index_url": None, "wheelhouse": str(house), "stop_grace_s": 1.0}
    env, _ = setup_once(options, tmp_path)
    assert env.mode == "wheelhouse" and env.deps_installed and env.version == "3.11"
    (folder,) = [p for p in house.iterdir() if p.is_dir()]
    assert "-cp311-glibc2.36-x86_64" in folder.name
    names = {p.name.split("-")[0].lower() for p in folder.glob("*.whl")}
    assert {"tensorflow_cpu", "numpy", "scikit_learn", "pip"} <= names
    assert not names & {"hydra_core", "pandas", "matplotlib", "paramiko"}
    out = run(bed, host, f"PYTHONPATH={env.env['PYTHONPATH']} {env.command[0]} -c "
              "'import tensorflow, sklearn, trainer.loop; print(trainer.loop.__file__)'")
    assert out.strip().startswith(env.path)
    copied = run(bed, host, "ls ~/.transient/wheelhouse/*/ | wc -l")
    again, seconds = setup_once(options, tmp_path)
    assert (again.path, again.installed, again.deps_installed) == (env.path, False, False)
    assert run(bed, host, "ls ~/.transient/wheelhouse/*/ | wc -l") == copied
    print(f"second setup of a wheelhouse host: {seconds:.2f} s")  # a figure, not an assertion


def python310_layer(tmp_path: Path) -> Path:
    """An image layer whose `python3` is CPython 3.10 (this machine's pyenv build, copied to
    /opt/python3.10 without its test suite; a wrapper finds its libpython): a host like
    Ubuntu 22.04's."""
    found = sorted(Path("/root/.pyenv/versions").glob("3.10.*/bin/python3.10"))
    if not found:
        pytest.skip("UNSUPPORTED-PYTHON HOST NOT RUN: no CPython 3.10 on this machine to put "
                    "into a host image (expected a pyenv build under /root/.pyenv/versions)")
    prefix = found[-1].parent.parent
    layer = tmp_path / "py310-layer"
    target = layer / "opt" / "python3.10"
    (target / "bin").mkdir(parents=True)
    (target / "lib").mkdir()
    shutil.copy2(found[-1], target / "bin" / "python3.10")
    for lib in (prefix / "lib").glob("libpython3.10*"):
        shutil.copy2(lib, target / "lib" / lib.name)
    shutil.copytree(prefix / "lib" / "python3.10", target / "lib" / "python3.10",
                    ignore=shutil.ignore_patterns("test", "site-packages", "__pycache__",
                                                  "idlelib", "tkinter", "ensurepip"))
    wrapper = layer / "usr" / "local" / "bin" / "python3"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text("#!/bin/sh\nLD_LIBRARY_PATH=/opt/python3.10/lib "
                       "exec /opt/python3.10/bin/python3.10 \"$@\"\n")
    wrapper.chmod(0o755)
    # and no python3.11 of the image's (the script would take one on PATH): overlayfs
    # whiteouts (0/0 character devices) hide it and the `python3` link to it
    (layer / "usr" / "bin").mkdir()
    for name in ("python3.11", "python3"):
        os.mknod(layer / "usr" / "bin" / name, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    return layer


def test_hosts_whose_python_no_wheel_fits_stop_the_run_in_one_line_before_any_role(
        repo_root: Path, bed: IsolatedTestBed, tmp_path: Path) -> None:
    layer = python310_layer(tmp_path)
    hosts = [bed.add_host(image="bookworm", layers=[layer]) for _ in range(3)]
    for host in hosts:
        bed.wait_login(host)
    assert run(bed, hosts[0], "python3 --version").startswith("Python 3.10.")
    options = {"hosts": bed.inventory(hosts), "known_hosts": str(bed.known_hosts),
               "index_url": f"http://{bed.gateway}:9/simple", "stop_grace_s": 1.0}
    done, run_dir = orchestrate(repo_root, tmp_path, options)
    assert done.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    error = summary["error"]
    assert "python3 is 3.10 on linux x86_64" in error and "3.11–3.13" in error, error
    assert any(f"ssh host {h.name}:" in error for h in hosts), error
    assert "Traceback" not in done.stdout + done.stderr
    kinds = [json.loads(ln)["kind"] for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "ready" not in kinds and "train_start" not in kinds, kinds
    for host in hosts:  # no role started (not even its spec was written), nothing installed
        assert run(bed, host, f"find ~/.transient/runs -name {layout.SPEC_FILE}; find "
                   "~/.transient/envs -type f 2>/dev/null; true").strip() == ""
    with pytest.raises(BadRequestError, match=r"python3 is 3\.10"):
        setup_once({**options, "hosts": bed.inventory(hosts[:1])}, tmp_path)


def test_a_gce_vm_of_the_default_family_sets_itself_up_and_is_baked_into_an_image(
        bed: IsolatedTestBed, index_url: str, tmp_path: Path) -> None:
    """`provider=gce` with the defaults (no `python`, no wheelhouse, the default image family,
    which the fake boots from Debian 13's root filesystem) on the fake Compute API, through
    `python -m orchestrator.image bake`: the VM installs the hosts' runtime from the index
    itself, is stopped, its disk becomes an image named by the dependency set, the VM is
    deleted. A VM of that image then only unpacks our wheel; baking again creates nothing; an
    image baked for another dependency set is refused before any VM."""
    from provisioning.base import Role
    from provisioning.gce.bake import bake
    from provisioning.gce.config import GceConfig
    from provisioning.gce.provider import GceProvider
    from provisioning.journal import Journal
    from tests.provisioning.gce_fixtures import PROJECT, ZONES, IsolatedFakeGce, gce_config

    family = GceConfig().image_family
    with IsolatedFakeGce(bed, vms=1, families={family: "trixie"}, login_refused_s=0.0,
                         project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
                         insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05,
                         wait_cap_s=0.2) as fake:
        cfg = gce_config(fake, tmp_path, ssh_key=str(bed.client_key), index_url=index_url,
                         host_key_timeout_s=60.0)
        assert (cfg.python, cfg.wheelhouse, cfg.image, cfg.image_family) == (
            None, None, None, family)
        said: list[str] = []
        image = bake(cfg, workdir=tmp_path / "bake", log=said.append)
        name = image.rsplit("/", 1)[1]
        assert name.startswith(f"transient-host-cpu-{host_runtime.load().digest('cpu')[:12]}-")
        assert fake.images[name]["status"] == "READY" and fake.live_instances() == []
        assert any("runtime installed (Python 3.13)" in line for line in said), said
        inserts = fake.calls["instances.insert"]
        assert bake(cfg, workdir=tmp_path / "again", log=said.append) == image
        assert fake.calls["instances.insert"] == inserts  # already baked: no VM at all

        baked = gce_config(fake, tmp_path, ssh_key=str(bed.client_key), index_url=index_url,
                           host_key_timeout_s=60.0, image=image)
        assert baked.check() == []
        stale = image.replace(name.split("-")[3], "0" * 12)
        assert "another set of the hosts' dependencies" in dict(
            GceConfig(image=stale).check())["provider.image"]
        provider = GceProvider(baked, journal=Journal(tmp_path / "run" / "journal.jsonl"))
        cluster = provider.acquire(ClusterRequest(run_id="from-baked", workdir=tmp_path / "run",
                                                  hosts=[HostSpec("ps-0", Role.PS,
                                                                  "n1-standard-4", None,
                                                                  ZONES[0], False)]))
        try:
            runner = provider.runner(cluster.hosts[0])
            runner.setup()
            env = runner.machine.environment
            # the image's venv, made on the baking VM by its Python 3.13 from the index
            assert env.installed and not env.deps_installed and env.version == "3.13"
            assert env.mode == "index"
            assert env.command[0].startswith(f"{baked.remote_root}/envs/venv-")
            probe = runner.start([*env.command[:-2], "-c", "import getpass, tensorflow, "
                                  "trainer.loop; print(getpass.getuser(), trainer.loop.__file__)"],
                                 env.env)
            user, trainer_file = probe.readline().split()
            assert user == baked.ssh_user and trainer_file.startswith(env.path)
            assert probe.wait(120) == 0
        finally:
            provider.release(cluster)
        assert fake.live_instances() == []
