"""GCS transfers through the real google-cloud-storage client against gcp-storage-emulator."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioning.gce.storage import (
    CheckpointMirror,
    GcsStore,
    GcsUrl,
    StorageError,
    checkpoint_url,
    main,
    results_url,
)
from tests.provisioning.gce_fixtures import BUCKET, storage_emulator


@pytest.fixture(name="emulator")
def emulator_fixture() -> Iterator[str]:
    """gcp-storage-emulator in memory on 127.0.0.1 (a free port), STORAGE_EMULATOR_HOST set."""
    with storage_emulator() as url:
        yield url


def make_tree(root: Path) -> dict[str, bytes]:
    files = {"a.txt": b"alpha\n", "logs/worker-0.log": b"x" * 1000,
             "tb/events.out": os.urandom(4096),
             "big.bin": os.urandom(20 * 1024 * 1024 + 17)}  # > 8 MiB: resumable, in chunks
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_urls() -> None:
    assert str(checkpoint_url("gs://b/exp/", "run-1")) == "gs://b/exp/run-1/checkpoints"
    assert str(results_url("gs://b", "r")) == "gs://b/r/results"
    with pytest.raises(ValueError, match="gs://"):
        GcsUrl.parse("s3://b/x")


def test_tree_round_trip_in_parallel_with_a_resumable_large_file(emulator: str,
                                                                 tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    store = GcsStore()
    url = results_url(f"gs://{BUCKET}/exp", "run-1")
    assert sorted(store.upload(tmp_path / "src", url)) == sorted(files)
    assert store.list(url) == {n: len(d) for n, d in files.items()}
    store.download(url, tmp_path / "dst")
    assert read_tree(tmp_path / "dst") == files


def test_errors_surface_naming_the_target(emulator: str, tmp_path: Path) -> None:
    make_tree(tmp_path / "src")
    with pytest.raises(StorageError, match="gs://no-such-bucket/x"):
        GcsStore().upload(tmp_path / "src", GcsUrl.parse("gs://no-such-bucket/x"))


def test_checkpoint_mirror_follows_rotation_and_restores_on_a_new_host(emulator: str,
                                                                     tmp_path: Path) -> None:
    local = tmp_path / "ckpt"
    local.mkdir()
    url = checkpoint_url(f"gs://{BUCKET}/exp", "run-2")
    mirror = CheckpointMirror(GcsStore(), local, url)
    (local / "ckpt-1.index").write_bytes(b"i1")
    (local / "ckpt-1.data-00000-of-00001").write_bytes(b"d1" * 100)
    (local / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert mirror.sync() == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert mirror.sync() == []  # nothing changed: nothing sent
    (local / "ckpt-2.index").write_bytes(b"i2")
    (local / "ckpt-2.data-00000-of-00001").write_bytes(b"d2" * 100)
    (local / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    for old in local.glob("ckpt-1.*"):
        old.unlink()  # CheckpointManager rotated ckpt-1 out
    mirror.sync()
    assert sorted(GcsStore().list(url)) == ["checkpoint", "ckpt-2.data-00000-of-00001",
                                            "ckpt-2.index"]
    fresh = tmp_path / "new-host" / "ckpt"
    CheckpointMirror(GcsStore(), fresh, url).restore()
    assert read_tree(fresh) == read_tree(local)


def test_cli_stages_a_gs_data_dir(emulator: str, tmp_path: Path, capsys) -> None:
    data = {"data_batch_1.bin": os.urandom(3073 * 10), "test_batch.bin": os.urandom(3073 * 2)}
    for name, blob in data.items():
        (tmp_path / "cifar" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cifar" / name).write_bytes(blob)
    assert main(["upload", str(tmp_path / "cifar"), f"gs://{BUCKET}/data/cifar10"]) == 0
    assert main(["download", f"gs://{BUCKET}/data/cifar10", str(tmp_path / "staged")]) == 0
    assert read_tree(tmp_path / "staged") == data
    assert "download: 2 file(s)" in capsys.readouterr().out


def test_without_credentials_the_error_says_how_to_authenticate(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(StorageError, match="gcloud auth application-default login"):
        GcsStore()


def test_run_checkpoint_store_mirrors_to_the_bucket_and_restores(emulator: str,
                                                                 tmp_path: Path) -> None:
    """The store run.py uses with provider.storage=gs://...: a chief on a real (local) host
    writes checkpoints, sync mirrors them, finish uploads the run directory, and a store on an
    empty folder (a new orchestrator machine) restores them before the chief starts."""
    from provisioning.base import ClusterRequest, HostSpec, Role
    from provisioning.gce.config import GceConfig
    from provisioning.gce.provider import GceProvider
    from provisioning.gce.storage import GcsCheckpointStore
    from provisioning.local import LocalProvider

    provider = LocalProvider()
    cluster = provider.acquire(ClusterRequest("run-3", [HostSpec("chief-0", Role.CHIEF)],
                                              tmp_path / "run"))
    try:
        chief = provider.runner(cluster.hosts[0])
        gce = GceProvider(GceConfig(storage=f"gs://{BUCKET}/exp"), api=object())
        store = gce.checkpoint_store("run-3", tmp_path / "run" / "checkpoints")
        assert isinstance(store, GcsCheckpointStore)
        store.before_start(chief)  # nothing anywhere yet
        folder = Path(store.location(chief))
        (folder / "ckpt-1.index").write_bytes(b"i")
        (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
        assert store.sync(chief)
        (tmp_path / "run" / "summary.json").write_text("{}\n")
        store.finish(tmp_path / "run")
    finally:
        provider.release(cluster)
    listed = GcsStore().list(results_url(f"gs://{BUCKET}/exp", "run-3"))
    assert "summary.json" in listed and "checkpoints/checkpoint" in listed
    fresh = GcsCheckpointStore(tmp_path / "elsewhere", f"gs://{BUCKET}/exp", "run-3")
    other = LocalProvider()
    again = other.acquire(ClusterRequest("run-3b", [HostSpec("chief-0", Role.CHIEF)],
                                         tmp_path / "run-b"))
    try:
        fresh.before_start(other.runner(again.hosts[0]))
    finally:
        other.release(again)
    assert read_tree(tmp_path / "elsewhere") == {"ckpt-1.index": b"i",
                                                 "checkpoint": b'model_checkpoint_path: "ckpt-1"\n'}


def test_a_failed_object_fails_the_download_naming_it(emulator: str, tmp_path: Path) -> None:
    """transfer_manager returns a failed object's exception in its results list; the store
    checks every result, so the call fails naming the object (the others still arrive)."""
    make_tree(tmp_path / "src")
    url = GcsUrl.parse(f"gs://{BUCKET}/errors")
    store = GcsStore()
    store.upload(tmp_path / "src", url, ["a.txt"])
    with pytest.raises(StorageError, match=r"1 of 2 object\(s\) under gs://lab-bucket/errors "
                                           r"failed: gone\.bin: NotFound"):
        store.download(url, tmp_path / "dst", ["a.txt", "gone.bin"])
    assert (tmp_path / "dst" / "a.txt").read_bytes() == b"alpha\n"
    with pytest.raises(StorageError, match="outside"):
        store.download(url, tmp_path / "dst", ["../escape"])


def cifar10_bin(root: Path, records: int = 16) -> dict[str, bytes]:
    """CIFAR-10 in its binary format (a label byte 0-9 + 3072 random pixel bytes per record)."""
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    files = {f"cifar-10-batches-bin/{n}": b"".join(bytes([i % 10]) + os.urandom(3072)
                                                   for i in range(records)) for n in names}
    for name, blob in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(blob)
    return files


def test_a_gs_data_dir_is_downloaded_once_into_the_cache(emulator: str, tmp_path: Path) -> None:
    """The run's data step with job.data_dir=gs://...: the objects land in the data cache, the
    run reads them from there; a second run downloads only what changed; a bucket without the
    problem's files is one data error line."""
    from orchestrator.runtime import data as data_step
    from orchestrator.validate import compose_experiment
    from provisioning.gce.storage import cached_copy
    from trainer.datasets import find_cifar_files

    files = cifar10_bin(tmp_path / "src")
    url = f"gs://{BUCKET}/datasets/cifar10"
    GcsStore().upload(tmp_path / "src", GcsUrl.parse(url))

    def config():  # type: ignore[no-untyped-def]
        cfg = compose_experiment("cifar10_res32", [f"job.data_dir={url}"])
        cfg.data_cache = str(tmp_path / "cache")
        return cfg

    cfg = config()
    assert "first downloads" in (data_step.describe(cfg) or "")
    folder = data_step.prepare(cfg)
    assert folder == tmp_path / "cache" / "gs" / BUCKET / "datasets" / "cifar10"
    assert cfg.job.data_dir == str(folder) and read_tree(folder) == files
    assert find_cifar_files("image_cifar10", str(folder))
    stamps = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    changed = "cifar-10-batches-bin/test_batch.bin"
    (tmp_path / "src" / changed).write_bytes(bytes(3073 * 4))  # 4 records of class 0
    GcsStore().upload(tmp_path / "src", GcsUrl.parse(url), [changed])
    assert data_step.prepare(config()) == folder
    again = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}
    assert [p.relative_to(folder).as_posix() for p in stamps if again[p] != stamps[p]] == [
        changed]  # only the object that changed was downloaded again
    assert (folder / changed).read_bytes() == (tmp_path / "src" / changed).read_bytes()

    with pytest.raises(StorageError, match="no objects under gs://lab-bucket/nothing"):
        cached_copy(f"gs://{BUCKET}/nothing", tmp_path / "cache")
    other = compose_experiment("cifar10_res32", [f"job.data_dir=gs://{BUCKET}/errors-x"])
    GcsStore().upload(tmp_path / "src", GcsUrl.parse(f"gs://{BUCKET}/errors-x"),
                      ["cifar-10-batches-bin/test_batch.bin"])
    other.data_cache = str(tmp_path / "cache")
    with pytest.raises(data_step.DataError) as err:
        data_step.prepare(other)
    assert err.value.line().startswith(f"data error: gs://{BUCKET}/errors-x does not hold the "
                                       "image_cifar10 files")
