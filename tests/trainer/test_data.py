"""Fetching, verifying, caching and listing datasets, against a local HTTP server.

The archives are small but in exactly the real formats and layouts (cifar_server.py); the
registry entries are the real ones with the test archives' own MD5 and size, and
$TRANSIENT_DATA_MIRROR points the download at the server, as a user's mirror would.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cifar_server import REAL_ARCHIVES, ArchiveServer, ServedArchive, make_archive, refused_url
from rich.console import Console

from trainer import data, datasets, http_fetch
from trainer.problems import get_problem, train_dataset

REPO = Path(__file__).resolve().parents[2]


def use_archive(monkeypatch: pytest.MonkeyPatch, archive: ServedArchive,
                base_url: str) -> datasets.Dataset:
    """Register ``archive`` (its own checksum and size) as its dataset's default download."""
    name, fmt, _ = REAL_ARCHIVES[archive.name]
    real = datasets.DATASETS[name]
    entry = replace(real.archive(fmt), md5=archive.md5, size=len(archive.data))
    ds = replace(real, archives=(entry,))
    monkeypatch.setitem(datasets.DATASETS, name, ds)
    monkeypatch.setenv(datasets.MIRROR_ENV, base_url)
    return ds


def fetch_served(monkeypatch: pytest.MonkeyPatch, archive: ServedArchive, root: Path) -> Path:
    """Serve ``archive`` on loopback and fetch it into ``root`` (for tests of what follows)."""
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        return data.fetch(ds, root, console=capture()[0])


def capture() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=150), out


def check_arrays(arrays, archive: ServedArchive) -> None:
    """The reader returns exactly what the archive's files hold (train files in order)."""
    test_name = next(n for n in archive.truth if n.startswith("test"))
    train = [n for n in archive.truth if n != test_name]
    np.testing.assert_array_equal(arrays.x_train,
                                  np.concatenate([archive.truth[n][0] for n in train]))
    np.testing.assert_array_equal(arrays.y_train,
                                  np.concatenate([archive.truth[n][1] for n in train]))
    np.testing.assert_array_equal(arrays.x_test, archive.truth[test_name][0])
    np.testing.assert_array_equal(arrays.y_test, archive.truth[test_name][1])


@pytest.mark.parametrize("name", sorted(REAL_ARCHIVES))
def test_first_fetch_shows_progress_and_the_reader_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    archive = make_archive(name, seed=len(name))
    monkeypatch.setattr(http_fetch, "CHUNK_BYTES", 8192)  # several updates, so the bar has a rate
    with ArchiveServer() as srv:
        srv.behaviour.files[name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        console, out = capture()
        folder = data.fetch(ds, tmp_path, console=console)
    text = out.getvalue()
    kib = f"{len(archive.data) / 1024:.1f}"
    assert f"{ds.name}: {name}" in text  # the bar's label
    assert f"{kib}/{kib} KiB" in text and "B/s" in text  # bytes done/total, the rate
    assert "0:00:00" in text  # time left
    assert f"downloaded {len(archive.data):,} bytes from {srv.base_url}/{name}" in text
    assert [r["path"] for r in srv.behaviour.requests] == [f"/{name}"]
    assert folder == tmp_path / ds.name
    assert (folder / REAL_ARCHIVES[name][2]).is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{ds.name}.lock", ds.name]
    assert [p.name for p in folder.iterdir()] == [REAL_ARCHIVES[name][2]]  # no temp folder
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_fetched_data_feeds_the_training_pipeline(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fetch_served(monkeypatch, make_archive("cifar-10-binary.tar.gz"), tmp_path)
    arrays = get_problem("image_cifar10").load(str(folder), 0)
    images, labels = next(iter(train_dataset(arrays, 8, seed=0)))
    assert images.shape == (8, 32, 32, 3) and labels.shape == (8,)
    assert set(np.asarray(labels).tolist()) <= set(arrays.y_train.tolist())


def test_checksum_mismatch_is_rejected_and_nothing_is_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = make_archive("cifar-10-binary.tar.gz")
    corrupted = bytearray(good.data)
    corrupted[len(corrupted) // 2] ^= 0xFF
    with ArchiveServer() as srv:
        srv.behaviour.files[good.name] = bytes(corrupted)
        ds = use_archive(monkeypatch, good, srv.base_url)
        with pytest.raises(data.FetchError) as err:
            data.fetch(ds, tmp_path, console=capture()[0])
        line = str(err.value)
        assert "\n" not in line
        assert f"expected {good.md5}" in line and "deleted it" in line
        assert not (tmp_path / f"{good.name}.part").exists()
        assert not datasets.holds_files(ds.problem, tmp_path / ds.name)
        assert not (tmp_path / ds.name).exists()
        # the source is fixed: the next call downloads afresh and succeeds
        srv.behaviour.files[good.name] = good.data
        folder = data.fetch(ds, tmp_path, console=capture()[0])
        assert srv.behaviour.requests[-1]["range"] is None
    check_arrays(get_problem(ds.problem).load(str(folder), 0), good)


def test_dropped_connection_is_resumed_with_a_range_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-100-binary.tar.gz")
    half = len(archive.data) // 2
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = archive.data
        srv.behaviour.drop_after, srv.behaviour.drops = half, 1
        ds = use_archive(monkeypatch, archive, srv.base_url)
        folder = data.fetch(ds, tmp_path, console=capture()[0])
        ranges = [r["range"] for r in srv.behaviour.requests]
    assert ranges == [None, f"bytes={half}-"]
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_interrupted_download_is_resumed_by_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server drops the transfer halfway, then fails: the run stops with one line and
    keeps the part file; the next run asks only for the rest."""
    archive = make_archive("cifar-10-python.tar.gz")
    half = len(archive.data) // 2
    part = tmp_path / f"{archive.name}.part"
    with ArchiveServer() as srv:
        b = srv.behaviour
        b.files[archive.name] = archive.data
        b.drop_after, b.drops, b.status_after_drop = half, 1, 503
        ds = use_archive(monkeypatch, archive, srv.base_url)
        with pytest.raises(data.FetchError, match=r"HTTP 503") as err:
            data.fetch(ds, tmp_path, console=capture()[0])
        assert "\n" not in str(err.value)
        assert part.stat().st_size == half
        assert not datasets.holds_files(ds.problem, tmp_path / ds.name)
        b.status = None  # the source is back
        console, out = capture()
        folder = data.fetch(ds, tmp_path, console=console)
        assert [r["range"] for r in b.requests] == [None, f"bytes={half}-", f"bytes={half}-"]
    assert f"(resumed at byte {half:,})" in out.getvalue()
    assert not part.exists()
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_a_killed_fetch_leaves_no_data_and_the_next_one_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL the CLI mid-download (a slow link): only ``<archive>.part`` remains, and the next
    fetch asks for the rest. (The killed process has the real registry, so it could never have
    verified this test archive: it is killed long before.)"""
    archive = make_archive("cifar-10-binary.tar.gz", seed=3)
    part = tmp_path / f"{archive.name}.part"
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = archive.data
        srv.behaviour.trickle_s = 0.1  # ~40 KiB/s: the transfer takes seconds
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.data", "fetch", "cifar10", "--cache-dir",
             str(tmp_path)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO), datasets.MIRROR_ENV: srv.base_url})
        try:
            deadline = time.monotonic() + 60
            while not (part.exists() and part.stat().st_size >= 16384):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
        have = part.stat().st_size
        assert 0 < have < len(archive.data)
        assert not datasets.holds_files("image_cifar10", tmp_path / "cifar10")
        srv.behaviour.trickle_s = 0.0
        ds = use_archive(monkeypatch, archive, srv.base_url)
        folder = data.fetch(ds, tmp_path, console=capture()[0])
        resumed_at = int(srv.behaviour.requests[-1]["range"].removeprefix("bytes=").rstrip("-"))
    assert resumed_at >= have  # (the killed process may have written a little more)
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_a_server_ignoring_ranges_restarts_from_zero(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-10-binary.tar.gz", seed=7)
    with ArchiveServer() as srv:
        b = srv.behaviour
        b.files[archive.name] = archive.data
        b.drop_after, b.drops, b.honour_range = len(archive.data) // 3, 1, False
        ds = use_archive(monkeypatch, archive, srv.base_url)
        folder = data.fetch(ds, tmp_path, console=capture()[0])
        assert len(b.requests) == 2 and b.requests[1]["range"] is not None
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_second_run_downloads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-100-python.tar.gz")
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        first = data.fetch(ds, tmp_path, console=capture()[0])
        console, out = capture()
        second = data.fetch(ds, tmp_path, console=console)
        assert len(srv.behaviour.requests) == 1
    assert first == second and out.getvalue() == ""


def test_offline_is_one_line_naming_url_cache_and_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = refused_url()
    monkeypatch.setenv(datasets.MIRROR_ENV, url)
    console, out = capture()
    with pytest.raises(data.FetchError) as err:
        data.fetch(datasets.DATASETS["cifar10"], tmp_path, console=console)
    line = str(err.value)
    assert line == (
        f"could not download {url}/cifar-10-binary.tar.gz: Connection refused; cache folder "
        f"{tmp_path}: download it elsewhere and put cifar-10-binary.tar.gz (MD5 "
        f"c32a1d4ab5d03f1284b67883e8d87530) in {tmp_path}, or its extracted "
        f"cifar-10-batches-bin/ in {tmp_path / 'cifar10'}, or set job.data_dir")
    assert out.getvalue() == ""  # no progress bar for a download that never started
    assert not (tmp_path / "cifar10").exists()


def test_http_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-10-binary.tar.gz")
    with ArchiveServer() as srv:  # serves nothing: 404
        ds = use_archive(monkeypatch, archive, srv.base_url)
        with pytest.raises(data.FetchError, match=r"cifar-10-binary.tar.gz: HTTP 404 "):
            data.fetch(ds, tmp_path, console=capture()[0])
    assert not (tmp_path / f"{archive.name}.part").exists()


def test_an_incomplete_folder_is_never_taken_for_data(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder missing a file (a half-extracted copy placed by hand) is replaced by a fetch;
    an archive that lacks a file leaves no folder behind."""
    archive = make_archive("cifar-10-binary.tar.gz")
    broken = make_archive("cifar-10-binary.tar.gz", skip="test_batch.bin")
    partial = tmp_path / "cifar10" / "cifar-10-batches-bin"
    partial.mkdir(parents=True)
    (partial / "data_batch_1.bin").write_bytes(b"x" * 3073)
    with ArchiveServer() as srv:
        srv.behaviour.files[archive.name] = broken.data
        ds = use_archive(monkeypatch, broken, srv.base_url)
        assert not datasets.holds_files(ds.problem, tmp_path / "cifar10")
        with pytest.raises(data.FetchError, match=r"does not hold cifar-10-batches-bin/"):
            data.fetch(ds, tmp_path, console=capture()[0])
        assert [p.name for p in (tmp_path / "cifar10").iterdir()] == ["cifar-10-batches-bin"]
        assert not datasets.holds_files(ds.problem, tmp_path / "cifar10")
        srv.behaviour.files[archive.name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        folder = data.fetch(ds, tmp_path, console=capture()[0])
    assert [p.name for p in folder.iterdir()] == ["cifar-10-batches-bin"]
    check_arrays(get_problem(ds.problem).load(str(folder), 0), archive)


def test_an_archive_placed_by_hand_is_verified_and_used(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-100-binary.tar.gz")
    use_archive(monkeypatch, archive, refused_url())  # offline
    (tmp_path / archive.name).write_bytes(archive.data)
    folder = data.fetch(datasets.DATASETS["cifar100"], tmp_path, console=capture()[0])
    check_arrays(get_problem("image_cifar100").load(str(folder), 0), archive)
    assert (tmp_path / archive.name).exists()  # the user's file stays


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer.data", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_cli_offline_exits_2_with_one_line(tmp_path: Path) -> None:
    res = run_cli("fetch", "cifar10", "--cache-dir", str(tmp_path),
                  env={datasets.MIRROR_ENV: refused_url()})
    assert res.returncode == data.FETCH_ERROR_EXIT_CODE
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("data error: could not download http://127.")
    assert "Traceback" not in res.stderr + res.stdout


def test_cli_list_shows_cached_and_missing(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``list`` reads the cache only; the cached folder was fetched in-process from the server."""
    folder = fetch_served(monkeypatch, make_archive("cifar-10-binary.tar.gz"), tmp_path)
    (tmp_path / "cifar-100-binary.tar.gz.part").write_bytes(b"x" * 2048)
    res = run_cli("list", "--cache-dir", str(tmp_path), env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines()
            if line.startswith("│")}
    size = data.human_bytes(data.folder_bytes(folder))
    assert "cached" in rows["cifar10"] and size in rows["cifar10"] and str(folder) in rows[
        "cifar10"]
    assert "partial download 2.0 KiB" in rows["cifar100"]


def test_cli_rejects_unknown_dataset(tmp_path: Path) -> None:
    res = run_cli("fetch", "mnist", "--cache-dir", str(tmp_path), env={})
    assert res.returncode == 2
    assert res.stderr.strip() == "data error: unknown dataset 'mnist' (valid: cifar10, cifar100)"


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(data.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.cache_root() == tmp_path / "xdg" / "transient-orchestrator" / "datasets"
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "env"))
    assert data.cache_root() == tmp_path / "env"
    assert data.cache_root(str(tmp_path / "cfg")) == tmp_path / "cfg"


def test_registry_holds_the_published_checksums() -> None:
    """The MD5s and sizes on https://www.cs.toronto.edu/~kriz/cifar.html (checked against
    independent copies: torchvision, tensorflow-datasets' url checksums, and others)."""
    published = {a.filename: (a.md5, a.size) for ds in datasets.DATASETS.values()
                 for a in ds.archives}
    assert published == {
        "cifar-10-binary.tar.gz": ("c32a1d4ab5d03f1284b67883e8d87530", 170_052_171),
        "cifar-10-python.tar.gz": ("c58f30108f718f92721af3b95e74349a", 170_498_071),
        "cifar-100-binary.tar.gz": ("03b5dce01913d631647c71ecec9e9cb8", 168_513_733),
        "cifar-100-python.tar.gz": ("eb9058c3a382ffc7106e4002c42a8d85", 169_001_437),
    }
    assert datasets.dataset_for("image_cifar10").archive().folder == "cifar-10-batches-bin"
