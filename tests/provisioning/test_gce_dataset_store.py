"""A dataset staged in `provider.storage` once and downloaded by each VM itself: the
orchestrator's side (`storage.GcsDatasetStore`, the real google-cloud-storage client) against
gcp-storage-emulator, the VM's side (`python -m trainer data fetch-gcs`, standard library only)
as a process with the fake metadata server's token, as the deployer runs it on a VM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from provisioning.gce.storage import GcsDatasetStore, GcsStore, GcsUrl
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import BUCKET, storage_emulator
from trainer import data

ZONE = "us-central1-a"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(name="emulator")
def emulator_fixture() -> Iterator[str]:
    with storage_emulator() as url:
        yield url


def vm_fetch(store: GcsDatasetStore, url: str, manifest: dict[str, Any], dest: Path,
             metadata_url: str) -> tuple[int, dict[str, Any]]:
    """What the deployer runs on a VM: the store's `host_args` through `python -m trainer
    data`, the manifest in a file, the metadata server named as on a VM's image (here the
    fake's); its exit code and `@data` report."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    (dest.parent / "manifest.json").write_text(json.dumps(manifest))
    args = store.host_args(url, str(dest.parent / "manifest.json"), str(dest),
                           str(dest.parent / "link"))
    env = {**os.environ, "TRANSIENT_METADATA_URL": metadata_url, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "trainer", "data", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(data.REPORT_PREFIX)]
    assert len(lines) == 1, (done.stdout, done.stderr)
    return done.returncode, json.loads(lines[0][len(data.REPORT_PREFIX):])


def test_a_vm_downloads_the_staged_folder_itself_and_refuses_a_corrupted_object(
        emulator: str, tmp_path: Path) -> None:
    """The orchestrator uploads a folder once (a second staging uploads nothing); a VM fills
    its cache folder from the bucket with its own token, keeps what it holds on a second
    call, refuses an object whose bytes differ from the manifest (nothing unverified left in
    place), and says `unreachable` when it has no token (the deployer may push then)."""
    local = tmp_path / "mine"
    files = {"cifar-10-batches-bin/data_batch_1.bin": os.urandom(70_000),
             "cifar-10-batches-bin/test_batch.bin": os.urandom(30_000), "notes/a b.txt": b"x"}
    for rel, blob in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(blob)
    manifest = data.digests(local)
    provider = GceProvider(GceConfig(storage=f"gs://{BUCKET}/exp"), api=object())
    store = provider.dataset_store()
    assert isinstance(store, GcsDatasetStore)
    first = store.stage(local, manifest)
    assert first.url.startswith(f"gs://{BUCKET}/exp/datasets/mine-")
    assert (first.uploaded_files, first.uploaded_bytes) == (3, sum(map(len, files.values())))
    again = store.stage(local, manifest)
    assert (again.url, again.uploaded_files, again.uploaded_bytes) == (first.url, 0, 0)
    assert GceProvider(GceConfig(), api=object()).dataset_store() is None

    with FakeGce(provision_s=0, staging_s=0, insert_op_s=0) as fake:
        fake.insert(ZONE, {"name": "vm-1"}, None)
        dest = tmp_path / "vm" / "datasets" / "mine"
        code, report = vm_fetch(store, first.url, manifest, dest, fake.metadata_url(ZONE, "vm-1"))
        assert (code, report["status"], report["files"]) == (0, "ok", 3), report
        assert data.digests(dest) == manifest
        assert (dest.parent / "link").resolve() == dest
        code, report = vm_fetch(store, first.url, manifest, dest, fake.metadata_url(ZONE, "vm-1"))
        assert (code, report["cached"], report["bytes"]) == (0, True, 0), report

        # an object whose bytes are not what the orchestrator hashed: refused, not placed
        changed = "cifar-10-batches-bin/test_batch.bin"
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "x").write_bytes(bytes(30_000))
        GcsStore().client.bucket(BUCKET).blob(f"{GcsUrl.parse(first.url).prefix}/{changed}") \
            .upload_from_filename(str(tmp_path / "bad" / "x"))
        fresh = tmp_path / "vm2" / "datasets" / "mine"
        code, report = vm_fetch(store, first.url, manifest, fresh, fake.metadata_url(ZONE, "vm-1"))
        assert (code, report["status"]) == (data.FETCH_ERROR_EXIT_CODE, "failed"), report
        assert f"{first.url}/{changed} has 30000 bytes with SHA-256" in report["line"]
        assert manifest[changed][1] in report["line"]
        assert not (fresh / changed).exists()
        assert [p.name for p in (fresh / changed).parent.iterdir()
                if p.name.endswith(".part")] == []

        # no service account on the VM (the metadata server has no token): unreachable, so
        # the calls above did ask the metadata server (the emulator itself checks no token)
        code, report = vm_fetch(store, first.url, manifest, tmp_path / "vm3" / "d",
                                fake.metadata_url(ZONE, "no-such-vm"))
        assert (code, report["status"]) == (data.UNREACHABLE_EXIT_CODE, "unreachable"), report
        assert "no token" in report["line"]
