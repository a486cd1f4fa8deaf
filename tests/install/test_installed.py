"""The tool as a user gets it, proved from outside the checkout (issue 24).

Builds the sdist from the committed sources, the wheel from that sdist (what `pip install` of an
sdist does), installs the wheel with its `cpu` extra into a fresh virtualenv (no system site
packages; pip reads the wheels from the configured index or mirror), then, from a temporary user
repository made by `transient-init`: dry runs of a packaged experiment, of a user experiment and
with a user provider file, `transient-validate` on a good and a bad experiment, one short local
training run, a short run over SSH on the namespace test bed (hosts get the wheel rebuilt from
the installed files), and that wheel compared with the one a checkout builds. Nothing here imports the
checkout: every command runs with the venv's interpreter, in the user repository, without
PYTHONPATH. The venv (about 1.8 GB) is removed at the end.
"""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed import SshTestBed
from tests.testbed.fixtures import provider_options, ssh_testbed, write_provider_file  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
#: The checkout's folders that ship in the wheel, and where they land in it.
SHIPPED = {"orchestrator/": "orchestrator/", "trainer/": "trainer/",
           "provisioning/": "provisioning/", "analysis/": "analysis/",
           "hydra_plugins/transient_launcher/": "hydra_plugins/transient_launcher/",
           "conf/": "orchestrator/conf/", "experiments/": "orchestrator/conf/experiment/"}

# A lab inventory that is only composed, validated and dry-run (nothing connects to it): two
# machines need two addresses (TEST-NET-1, RFC 5737, routed nowhere).
LAB_PROVIDER = """\
defaults:
  - ssh_schema
  - _self_
name: ssh
hosts:
  - {{name: box1, address: 192.0.2.11, port: 22, key_path: {key}, python: /usr/bin/python3}}
  - {{name: box2, address: 192.0.2.12, port: 22, key_path: {key}, python: /usr/bin/python3}}
known_hosts: {known_hosts}
"""
MINE = """\
# @package _global_
defaults:
  - override /cluster: local_cpu
  - override /job: digits_cnn
  - override /provider: my_lab
name: mine
cluster:
  workers: 1
"""


@dataclass
class Installed:
    venv: Path
    wheel: Path
    work: Path  # holds the venv, the user repository and the caches
    env: dict[str, str]

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def run(self, *argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout)


def _source_files() -> list[str]:
    """The files a release is built from: tracked or new (not ignored), as git lists them."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("NOT RUN: the sources are not a git checkout, so the committed file set "
                    "the release is built from is unknown")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if os.path.lexists(REPO / f)]


def _copy_sources(files: list[str], dest: Path) -> None:
    for rel in files:
        src, out = REPO / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), out)
        else:
            shutil.copy2(src, out)


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    files = _source_files()
    work = Path(tempfile.mkdtemp(prefix="transient-installed-"))
    try:
        src, dist = work / "src", work / "dist"
        _copy_sources(files, src)
        build = [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                 "print(b.build_sdist(sys.argv[1]))", str(dist)]
        _check(subprocess.run(build, cwd=src, capture_output=True, text=True), "sdist")
        sdist = next(dist.glob("transient_orchestrator-*.tar.gz"))
        _check(subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                               "--no-build-isolation", "--wheel-dir", str(dist), str(sdist)],
                              capture_output=True, text=True), "wheel from the sdist")
        wheel = next(dist.glob("transient_orchestrator-*.whl"))
        venv = work / "venv"
        _check(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                              text=True), "venv")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRANSIENT_REPO", "PYTHONHOME")}
        pip_cache = os.environ.get("PIP_CACHE_DIR") or str(
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   XDG_CACHE_HOME=str(work / "cache"), TRANSIENT_DATA_CACHE=str(work / "data"),
                   TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
        # --no-compile: TensorFlow's 10,000 modules compile on first import instead (lean CI)
        _check(subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile",
                               "--disable-pip-version-check", f"{wheel}[cpu]"],
                              env={**env, "PIP_CACHE_DIR": pip_cache},
                              capture_output=True, text=True, timeout=900),
               "pip install of the wheel with the cpu extra (pip needs its index or mirror)")
        yield Installed(venv, wheel, work, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def user_repo(installed: Installed) -> Path:
    """A user repository started with transient-init, plus an experiment and a lab inventory."""
    root = installed.work / "my-lab"
    root.mkdir()
    proc = installed.run("transient-init", cwd=root)
    _check(proc, "transient-init")
    assert "wrote experiments/my_experiment.yaml" in proc.stdout
    key, known_hosts = root / "id_test", root / "known_hosts"
    key.write_text("not a real key: a dry run only checks that the file is there\n")
    key.chmod(0o600)
    known_hosts.write_text("")
    (root / "conf" / "provider" / "my_lab.yaml").write_text(
        LAB_PROVIDER.format(key=key, known_hosts=known_hosts))
    (root / "experiments" / "mine.yaml").write_text(MINE)
    return root


def test_the_wheel_carries_every_file_the_packages_read(installed: Installed) -> None:
    """Each shipped folder's files (config tree, examples, data files) are in the wheel that
    `pip install` of the sdist builds."""
    expected = set()
    for rel in _source_files():
        if (REPO / rel).is_symlink():
            continue
        for prefix, target in SHIPPED.items():
            if rel.startswith(prefix):
                expected.add(target + rel[len(prefix):])
    assert "orchestrator/conf/experiment/digits_local.yaml" in expected
    with zipfile.ZipFile(installed.wheel) as z:
        names = set(z.namelist())
    missing = expected - names
    assert not missing, f"not in the wheel: {sorted(missing)[:20]}"
    # the pages help points at (orchestrator/version.py docs_path), not the images
    docs = {f"orchestrator/docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert "orchestrator/docs/configuration.md" in docs and docs <= names, sorted(docs - names)


def test_a_user_repository_with_the_installed_tool(installed: Installed, user_repo: Path) -> None:
    run = installed.run
    # the installed package is what runs, not the checkout
    proc = run(installed.bin("python"), "-c", "import orchestrator; print(orchestrator.__file__)",
               cwd=user_repo)
    _check(proc, "import")
    assert proc.stdout.startswith(str(installed.venv)), proc.stdout

    proc = run("transient-orchestrator", "--help", cwd=user_repo)
    _check(proc, "--help")
    docs = Path(proc.stdout.split("shipped with the tool in ", 1)[1].split(":", 1)[0])
    assert docs.is_relative_to(installed.venv) and (docs / "configuration.md").is_file(), docs
    assert "  transient-validate [FILES]" in proc.stdout
    for script in ("transient-orchestrator", "transient-validate", "transient-init",
                   "transient-controller"):
        proc = run(script, "--version", cwd=user_repo)
        _check(proc, "--version")
        assert proc.stdout.startswith(f"{script} "), proc.stdout
    proc = run("transient-orchestrator", "+experiment=digits_local", "dry_run=true",
               "progress=false", cwd=user_repo)
    _check(proc, "dry run of a packaged experiment")
    assert "digits_local" in proc.stdout

    proc = run(installed.bin("python"), "-m", "orchestrator", "+experiment=mine", "dry_run=true",
               "progress=false", cwd=user_repo)
    _check(proc, "dry run of a user experiment with the user's provider file")
    assert "Plan: mine" in proc.stdout
    proc = run("transient-orchestrator", "+experiment=mine", "--cfg", "job", cwd=user_repo)
    _check(proc, "--cfg job")
    assert "address: 192.0.2.12" in proc.stdout and "name: box2" in proc.stdout

    proc = run("transient-orchestrator", "+experiment=nope", "dry_run=true", cwd=user_repo)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"looked in {user_repo / 'experiments'}/ and the packaged examples" in proc.stderr


def test_validate_in_the_user_repository(installed: Installed, user_repo: Path) -> None:
    experiments = user_repo / "experiments"
    # validation needs no TensorFlow (a CI job installs the tool without the cpu extra)
    code = ("import sys\nfrom orchestrator.validate import main\nrc = main([])\n"
            "assert 'tensorflow' not in sys.modules, 'validate imported TensorFlow'\n"
            "sys.exit(rc)")
    proc = installed.run(installed.bin("python"), "-c", code, cwd=user_repo)
    _check(proc, "validate the good experiments, without TensorFlow")
    assert "2 valid, 0 invalid" in proc.stdout
    bad = experiments / "bad.yaml"
    bad.write_text("# @package _global_\njob:\n  batch_size: -1\n")
    try:
        proc = installed.run("transient-validate", cwd=user_repo)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "FAIL bad.yaml: config error: job.batch_size: must be ≥ 1" in proc.stdout
        assert "ok   my_experiment.yaml" in proc.stdout and "ok   mine.yaml" in proc.stdout
    finally:
        bad.unlink()
    empty = installed.work / "empty"
    (empty / ".git").mkdir(parents=True)
    proc = installed.run("transient-validate", cwd=empty)
    assert proc.returncode == 2 and f"no experiments/ folder in {empty}" in proc.stderr


@pytest.mark.tf_cluster
def test_a_short_local_run_completes(installed: Installed, user_repo: Path) -> None:
    proc = installed.run("transient-orchestrator", "+experiment=my_experiment",
                         "cluster.workers=1", "cluster.evaluator=false", "job.train_steps=60",
                         "job.eval_frequency=0",
                         "job.checkpoint_frequency=0", "progress=false", cwd=user_repo,
                         timeout=600)
    _check(proc, "local run")
    summaries = list((user_repo / "outputs" / "my_experiment").glob("*/summary.json"))
    assert len(summaries) == 1, proc.stdout
    summary = json.loads(summaries[0].read_text())
    assert summary["status"] == "completed" and summary["global_steps"] >= 60, summary
    site = next((installed.venv / "lib").glob("python3*/site-packages"))
    assert not (site / "outputs").exists()


def test_the_hosts_wheel_is_rebuilt_from_the_installed_files(installed: Installed,
                                                              tmp_path: Path) -> None:
    """provider=ssh/gce give hosts a wheel of the installed version: the same files as the one
    a checkout of the same sources builds."""
    code = ("import sys\nfrom pathlib import Path\n"
            "from provisioning.ssh.setup import build_wheel\n"
            "print(build_wheel(Path(sys.argv[1])).path)")
    proc = installed.run(installed.bin("python"), "-c", code, str(tmp_path / "installed"),
                         cwd=installed.work)
    _check(proc, "hosts' wheel from the installed tool")
    from_installed = Path(proc.stdout.strip().splitlines()[-1])
    from provisioning.ssh.setup import build_wheel

    from_checkout = build_wheel(tmp_path / "checkout", root=REPO).path
    with zipfile.ZipFile(from_installed) as a, zipfile.ZipFile(from_checkout) as b:
        names = sorted(a.namelist())
        assert names == sorted(b.namelist())
        assert any(n.startswith("trainer/") for n in names)
        for name in names:
            if not name.endswith((".dist-info/RECORD", ".dist-info/WHEEL")):
                assert a.read(name) == b.read(name), name


@pytest.mark.tf_cluster
def test_a_short_ssh_run_gets_the_installed_code_to_the_hosts(
        installed: Installed, user_repo: Path, ssh_testbed: SshTestBed) -> None:
    """provider=ssh from the installed tool: ps-0 (and the chief) on one namespace host, the
    worker on another; each host's interpreter is the venv's (it has TensorFlow), so setup only
    unpacks the hosts' wheel, which the installed tool rebuilt from its own files."""
    options = provider_options(ssh_testbed, ssh_testbed.hosts[:2])
    for host in options["hosts"]:
        host["python"] = installed.bin("python")
    write_provider_file(user_repo / "conf", "bed", options)
    proc = installed.run("transient-orchestrator", "+experiment=ssh_digits", "provider=bed",
                         "cluster.workers=1", "cluster.evaluator=false", "job.train_steps=60",
                         "job.eval_frequency=0", "job.checkpoint_frequency=0", "preflight=false",
                         "progress=false", cwd=user_repo, timeout=600)
    _check(proc, "ssh run")
    summaries = list((user_repo / "outputs" / "ssh_digits").glob("*/summary.json"))
    summary = json.loads(summaries[0].read_text())
    assert summary["status"] == "completed" and summary["global_steps"] >= 60, summary
    trees = list((installed.work / "cache" / "transient-orchestrator" / "installed-source")
                 .glob("*/trainer"))
    assert len(trees) == 1  # the hosts' wheel was built from the installed files
