"""The orchestrator's data step: validation, the dry run's data line, the fetch before
provisioning, the offline error of a real run, staging to hosts, and a real run on fetched data.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from cifar_server import ArchiveServer, make_archive, refused_url
from test_data import REPO, capture, check_arrays, fetch_served, use_archive

from orchestrator.config.errors import ConfigError
from orchestrator.config.validation import validate_data_dir
from orchestrator.runtime import data as data_step
from orchestrator.validate import compose_experiment
from provisioning.base import ClusterRequest, HostSpec, Role
from provisioning.local import LocalHostRunner, LocalProvider
from trainer import data, datasets
from trainer.problems import get_problem

ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"}


def cifar10_config(cache: Path, *overrides: str):
    cfg = compose_experiment("cifar10_res32", list(overrides))
    cfg.data_cache = str(cache)
    cfg.progress = False
    return cfg


def test_given_data_dir_wins_and_must_hold_the_files(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"job.data_dir: folder '.*empty' does not hold the "
                                          r"image_cifar10 files \(.*leave job.data_dir unset"):
        validate_data_dir(cifar10_config(tmp_path, f"job.data_dir={empty}"))
    with pytest.raises(ConfigError, match=r"folder '/no/such' does not exist"):
        validate_data_dir(cifar10_config(tmp_path, "job.data_dir=/no/such"))
    with pytest.raises(ConfigError, match=r"job.data_dir: 'gs:///cifar10' names no bucket"):
        validate_data_dir(cifar10_config(tmp_path, "job.data_dir=gs:///cifar10"))
    validate_data_dir(cifar10_config(tmp_path, "job.data_dir=gs://bucket/cifar10"))  # at run start
    validate_data_dir(cifar10_config(tmp_path))  # unset: the cache (fetched by the run)
    archive = make_archive("cifar-10-binary.tar.gz")
    own = tmp_path / "mine"
    own.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.data)) as tar:
        tar.extractall(own, filter="data")
    monkeypatch.chdir(tmp_path)  # a relative data_dir becomes absolute for the roles' cwd
    cfg = cifar10_config(tmp_path / "cache", "job.data_dir=mine")
    assert data_step.prepare(cfg) == own and cfg.job.data_dir == str(own)  # no fetch
    assert not (tmp_path / "cache").exists()
    assert data_step.describe(cfg).startswith(f"image_cifar10 from job.data_dir {own} (")


def test_prepare_fetches_once_and_points_the_run_at_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-10-binary.tar.gz")
    cfg = cifar10_config(tmp_path)
    assert data_step.describe(cfg) == (
        f"image_cifar10 not cached: the run first downloads cifar-10-binary.tar.gz (162.2 MiB) "
        f"from https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz into {tmp_path / 'cifar10'}")
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = archive.data
        use_archive(monkeypatch, archive, srv.base_url)
        assert f"({data.human_bytes(len(archive.data))}) from {srv.base_url}/" in \
            data_step.describe(cfg)
        folder = data_step.prepare(cfg, console=capture()[0])
        assert cfg.job.data_dir == str(folder) == str(tmp_path / "cifar10")
        again = cifar10_config(tmp_path)
        assert data_step.prepare(again) == folder and len(srv.behaviour.requests) == 1
    size = data.human_bytes(data.folder_bytes(folder))
    assert data_step.describe(cifar10_config(tmp_path)) == (
        f"image_cifar10 cached in {folder} ({size})")
    check_arrays(get_problem("image_cifar10").load(cfg.job.data_dir, 0), archive)


def test_prepare_offline_raises_the_one_line_data_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(datasets.MIRROR_ENV, refused_url())
    with pytest.raises(data_step.DataError) as err:
        data_step.prepare(cifar10_config(tmp_path))
    assert err.value.line().startswith("data error: could not download http://127.0.0.1:")
    assert "\n" not in err.value.line()


def orchestrate(*args: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO,
                          env={**ENV, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_says_what_will_be_fetched(tmp_path: Path) -> None:
    res = orchestrate("+experiment=cifar10_res32", "dry_run=true", f"data_cache={tmp_path}",
                      f"hydra.run.dir={tmp_path / 'run'}")
    assert res.returncode == 0, res.stderr
    assert ("data: image_cifar10 not cached: the run first downloads cifar-10-binary.tar.gz "
            "(162.2 MiB) from https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz into "
            f"{tmp_path / 'cifar10'}") in res.stdout
    assert not (tmp_path / "cifar10").exists()


def test_offline_run_stops_with_one_line_before_provisioning(tmp_path: Path) -> None:
    url = refused_url()
    run_dir = tmp_path / "run"
    res = orchestrate("+experiment=cifar10_res32", "provider=local",  # no cloud credentials here
                      f"data_cache={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}",
                      env={datasets.MIRROR_ENV: url})
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"data error: could not download {url}/cifar-10-binary.tar.gz: Connection refused; "
        f"cache folder {tmp_path / 'cache'}: download it elsewhere and put "
        f"cifar-10-binary.tar.gz (MD5 c32a1d4ab5d03f1284b67883e8d87530) in {tmp_path / 'cache'}, "
        f"or its extracted cifar-10-batches-bin/ in {tmp_path / 'cache' / 'cifar10'}, or set "
        f"job.data_dir"]
    # only Hydra's own files: no config.yaml, plan, journal or spec, so nothing started
    assert {p.name for p in run_dir.iterdir()} <= {".hydra", "__main__.log"}


def test_staging_pushes_what_a_host_lacks_once(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without a dataset cache (here a local host, staged as if remote) gets the files
    pushed into its work dir; a second staging (a restart's) pushes nothing, and a changed file
    is the only one sent again."""
    archive = make_archive("cifar-100-binary.tar.gz")
    folder = fetch_served(monkeypatch, archive, tmp_path / "cache")
    hosts = [HostSpec("ps-0", Role.PS), HostSpec("worker-0", Role.WORKER),
             HostSpec("chief-0", Role.CHIEF), HostSpec("evaluator-0", Role.EVALUATOR)]
    provider = LocalProvider(provision_delay_s=0.0)
    cluster = provider.acquire(ClusterRequest("stage", hosts, tmp_path / "run"))
    readers = [h for h in cluster.hosts if data_step.reads_data(cluster, h)]

    def stage() -> list[data_step.Staged]:
        stager = data_step.DataStager(folder, tmp_path / "run")  # one per deployment
        return [stager.stage(h, provider.runner(h)) for h in readers]

    try:
        first = stage()
        again = stage()
        changed = folder / "cifar-100-binary" / "test.bin"
        changed.write_bytes(changed.read_bytes()[::-1])
        third = stage()
    finally:
        provider.release(cluster)
    assert [h.role for h in readers] == [Role.CHIEF, Role.EVALUATOR]
    assert [s.how for s in first] == ["pushed", "pushed"]
    assert [s.pushed_bytes for s in first] == [data.folder_bytes(folder)] * 2
    assert [(s.how, s.pushed_bytes) for s in again] == [("pushed", 0), ("pushed", 0)]
    assert [s.pushed_bytes for s in third] == [changed.stat().st_size] * 2
    for host in cluster.hosts:
        staged = host.workdir / data_step.staged_path(folder)
        if host.role in data_step.READING_ROLES:
            assert (staged / "cifar-100-binary" / "test.bin").read_bytes() == changed.read_bytes()
        else:
            assert not staged.exists(), host.id


class CachedRunner(LocalHostRunner):
    """A local host staged as if remote, with a dataset cache beside the run's hosts: every
    local host has the same address, so they share it as machines at one address would."""

    shares_orchestrator_fs = False

    def dataset_cache(self) -> Path:
        return self.host.workdir.parents[1] / "datasets"


class CachedProvider(LocalProvider):
    runner_class = CachedRunner


def test_machines_at_one_address_share_one_pushed_copy(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fetch_served(monkeypatch, make_archive("cifar-100-binary.tar.gz"), tmp_path / "c")
    provider = CachedProvider(provision_delay_s=0.0)
    cluster = provider.acquire(ClusterRequest("share", [
        HostSpec("ps-0", Role.PS), HostSpec("chief-0", Role.CHIEF),
        HostSpec("evaluator-0", Role.EVALUATOR)], tmp_path / "run"))
    chief, evaluator = cluster.hosts[1:]
    try:
        stager = data_step.DataStager(folder, tmp_path / "run")
        first = [stager.stage(h, provider.runner(h)) for h in (chief, evaluator)]
        restart = data_step.DataStager(folder, tmp_path / "run")
        again = [restart.stage(h, provider.runner(h)) for h in (chief, evaluator)]
    finally:
        provider.release(cluster)
    assert chief.address == evaluator.address and chief.workdir != evaluator.workdir
    assert [(s.how, s.pushed_bytes) for s in first] == [
        ("pushed", data.folder_bytes(folder)), ("shared", 0)]
    assert [(s.how, s.pushed_bytes) for s in again] == [("pushed", 0), ("shared", 0)]
    links = [(h.workdir / data_step.staged_path(folder)) for h in (chief, evaluator)]
    assert all(link.is_symlink() for link in links)
    assert {link.resolve().parent for link in links} == {tmp_path / "run" / "datasets"}
    assert datasets.holds_files("image_cifar100", links[1])


@pytest.mark.slow
@pytest.mark.tf_cluster
def test_a_run_trains_on_the_cached_download(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Fetched once from the test server, then a real local run (1 PS, 1 worker, chief,
    evaluator) reads it from the cache with the source offline: nothing is downloaded again."""
    cache = tmp_path / "cache"
    fetch_served(monkeypatch, make_archive("cifar-10-python.tar.gz"), cache)
    run_dir = tmp_path / "run"
    res = orchestrate("+experiment=digits_local", "job.problem=image_cifar10",
                      "cluster.workers=1", "job.train_steps=20", "job.batch_size=8",
                      "job.eval_frequency=0", f"data_cache={cache}", f"hydra.run.dir={run_dir}",
                      "progress=false", env={datasets.MIRROR_ENV: refused_url()}, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    spec = json.loads((run_dir / "trainer_spec.json").read_text())
    assert spec["job"]["data_dir"] == str(cache / "cifar10")
    assert summary["final_accuracy"] is not None
