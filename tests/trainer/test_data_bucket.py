"""VMs that cannot reach a dataset's source get it through `provider.storage`: the fake Compute
API's VMs are the SSH test bed's namespace hosts, gcp-storage-emulator listens on the bed's
gateway (the VMs' way to "Cloud Storage"), and the registry archive is served on this machine's
loopback only (the orchestrator reaches it, the VMs do not). The deployer
(`orchestrator/runtime/data.py` DataStager with `GceProvider.dataset_store`) uploads the folder
once for both VMs that read it; each VM downloads it itself with `python -m trainer data
fetch-gcs`; a restart uploads and downloads nothing; a `gs://` data_dir is read by the VMs
where it is (nothing uploaded). The bed's hosts share this machine's filesystem, so the two VMs
share one dataset cache folder (`provider.remote_root`): the first to get there downloads, the
other finds the files verified in place (``cached``)."""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

from pathlib import Path

import pytest
from cifar_server import ArchiveServer, make_archive
from test_data import capture, use_archive

from orchestrator.runtime import data as data_step
from orchestrator.runtime.deploy import EVENT_HOST_SETUP, Deployment, TrainerEvent
from provisioning.base import Cluster, ClusterRequest, HostSpec, Role
from provisioning.gce.provider import GceProvider
from provisioning.gce.storage import GcsStore, GcsUrl
from provisioning.journal import Journal
from provisioning.ssh.host_runner import DATASETS_DIR
from tests.provisioning.gce_fixtures import BUCKET, PROJECT, ZONES, gce_config, storage_emulator
from tests.provisioning.test_gce_ssh import fake_on_bed
from tests.provisioning.test_gce_storage import cifar10_bin
from tests.testbed import SshTestBed
from tests.testbed.fixtures import host_python, ssh_testbed  # noqa: F401
from trainer import data, datasets

pytestmark = pytest.mark.slow
FAST = dict(project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
            insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2)


def setups(provider: GceProvider, cluster: Cluster, run_dir: Path,
           local: Path) -> list[TrainerEvent]:
    """One deployment's setup (what a run or a restart does first): its `host_setup` events,
    the chief's first."""
    deployment = Deployment(provider, cluster, run_dir, "{}", data_dir=local)
    try:
        deployment.prepare_all()
        events = []
        while (event := deployment.next_event(0)) is not None:
            events.append(event)
    finally:
        deployment.teardown()
    return sorted((e for e in events if e.kind == EVENT_HOST_SETUP), key=lambda e: e.role)


def test_vms_get_an_unreachable_source_through_the_bucket_uploaded_once(
        ssh_testbed: SshTestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bed = ssh_testbed
    archive = make_archive("cifar-10-binary.tar.gz")
    with ArchiveServer("127.0.0.1") as srv:  # the orchestrator's machine only
        srv.behaviour.files[archive.name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        local = data.fetch(ds, tmp_path / "cache", console=capture()[0])  # the run's data step
        data_step.mark_origin(local, ds)
        expected = sum(size for rel, (size, _) in data.digests(local).items()
                       if rel != data_step.ORIGIN_FILE)
        vms = tmp_path / "vms"
        with storage_emulator(address=bed.gateway), fake_on_bed(bed, 2, **FAST) as fake:
            cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                             python=host_python(), remote_root=str(vms),
                             storage=f"gs://{BUCKET}/exp")
            provider = GceProvider(cfg, journal=Journal(tmp_path / "journal.jsonl"))
            zone = ZONES[0]
            cluster = provider.acquire(ClusterRequest("bucket", [  # two VMs that read the data
                HostSpec("chief-0", Role.CHIEF, "n1-standard-4", None, zone, False),
                HostSpec("evaluator-0", Role.EVALUATOR, "n1-standard-4", None, zone, False)],
                tmp_path / "run"))
            try:
                first = setups(provider, cluster, tmp_path / "run", local)
                restart = setups(provider, cluster, tmp_path / "run", local)
                # a folder of the user's: through the bucket too, a restart uploads nothing
                mine = tmp_path / "mine"
                mine_files = cifar10_bin(mine)
                mine_first = setups(provider, cluster, tmp_path / "run", mine)
                mine_again = setups(provider, cluster, tmp_path / "run", mine)

                # a gs:// data_dir: its cached copy here is never uploaded, the VMs read it there
                files = cifar10_bin(tmp_path / "src")
                GcsStore().upload(tmp_path / "src", GcsUrl.parse(f"gs://{BUCKET}/theirs"))
                from orchestrator.validate import compose_experiment

                run_cfg = compose_experiment("cifar10_res32", [f"job.data_dir=gs://{BUCKET}/theirs"])
                run_cfg.data_cache = str(tmp_path / "cache")
                theirs = data_step.prepare(run_cfg)
                assert theirs is not None
                direct = setups(provider, cluster, tmp_path / "run", theirs)
                staged = GcsStore().list(GcsUrl.parse(f"gs://{BUCKET}/exp/datasets"))
            finally:
                provider.release(cluster)
    assert fake.live_instances() == []

    assert [e.role for e in first] == ["chief", "evaluator"]
    assert {e.fields["address"] for e in first} == {h.address for h in bed.hosts[:2]}
    assert sorted(e.fields["data"] for e in first) == ["bucket", "cached"], [
        e.fields for e in first]
    assert all("source unreachable from the host" in e.fields["data_note"] for e in first)
    assert all(e.fields["data_pushed_bytes"] == 0 for e in first)
    # one upload for the two VMs, counted once, on the machine that needed it first
    uploads = [e.fields.get("data_uploaded_bytes") for e in first]
    assert sorted(uploads, key=str) == [expected, None], uploads
    assert datasets.holds_files("image_cifar10", vms / DATASETS_DIR / "cifar10")
    # a restart: both VMs hold it (the registry fetch finds it first), nothing moves
    assert [e.fields["data"] for e in restart] == ["cached", "cached"], [e.fields for e in restart]
    assert [e.fields.get("data_uploaded_bytes") for e in restart] == [None, None]
    assert all(e.fields["data_pushed_bytes"] == 0 for e in restart)
    assert all(e.fields["bytes_sent"] < 100_000 for e in restart), [e.fields for e in restart]
    # the user's folder: uploaded once, then found complete in the bucket (0 bytes)
    assert sorted(e.fields["data"] for e in mine_first) == ["bucket", "cached"]
    assert sorted([e.fields.get("data_uploaded_bytes") for e in mine_first], key=str) == [
        sum(map(len, mine_files.values())), None]
    assert [e.fields["data"] for e in mine_again] == ["cached", "cached"]
    assert sorted([e.fields.get("data_uploaded_bytes") for e in mine_again], key=str) == [0, None]
    assert all(e.fields["data_pushed_bytes"] == 0 for e in [*mine_first, *mine_again])
    assert all(e.fields["bytes_sent"] < 100_000 for e in mine_again)
    # one content-named prefix per dataset: the registry one and the user's
    assert sorted({name.split("/")[0].rsplit("-", 1)[0] for name in staged}) == [
        "cifar10", "mine"], staged
    # gs:// data_dir: downloaded by each VM from the user's bucket, nothing staged for it
    assert sorted(e.fields["data"] for e in direct) == ["bucket", "cached"], [
        e.fields for e in direct]
    assert [e.fields.get("data_uploaded_bytes") for e in direct].count(0) == 1
    assert all(e.fields["data_pushed_bytes"] == 0 for e in direct)
    assert all(e.fields["bytes_sent"] < 100_000 for e in direct), [e.fields for e in direct]
    assert sum(len(b) for b in files.values()) > 100_000  # so none of it crossed over SSH


@pytest.mark.parametrize("reachable", [True, False])
def test_a_new_chief_vm_downloads_the_checkpoints_from_the_bucket_itself(
        ssh_testbed: SshTestBed, tmp_path: Path, reachable: bool) -> None:
    """A chief starting on a VM that lacks the checkpoints (a PS/chief machine re-created after
    a loss): with `provider.storage` its VM downloads them from the bucket mirror itself, so
    the user's link carries a manifest, not the checkpoints; a VM that cannot read the bucket
    (the emulator on this machine's loopback only) gets them pushed as without a bucket."""
    import os

    bed = ssh_testbed
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    blobs = {"ckpt-3.data-00000-of-00001": os.urandom(600_000), "ckpt-3.index": os.urandom(900),
             "checkpoint": b'model_checkpoint_path: "ckpt-3"\n'}
    for name, blob in blobs.items():
        (folder / name).write_bytes(blob)
    with storage_emulator(address=bed.gateway if reachable else "127.0.0.1"), \
            fake_on_bed(bed, 1, **FAST) as fake:
        cfg = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(bed.client_key),
                         python=host_python(), remote_root=str(tmp_path / "vms"),
                         storage=f"gs://{BUCKET}/exp")
        provider = GceProvider(cfg, journal=Journal(tmp_path / "journal.jsonl"))
        cluster = provider.acquire(ClusterRequest("ckpt", [
            HostSpec("chief-0", Role.CHIEF, "n1-standard-4", None, ZONES[0], False)],
            tmp_path / "run"))
        try:
            store = provider.checkpoint_store("ckpt", folder)
            store.sync(provider.runner(cluster.hosts[0]))  # nothing on the VM yet: mirrored
            chief = provider.runner(cluster.hosts[0])
            chief.setup()  # the trainer's wheel (what a deployment sends first): not counted
            before = chief.bytes_sent()
            store.before_start(chief)
            sent = chief.bytes_sent() - before
            there = Path(store.location(chief))
            held = {p.name: p.read_bytes() for p in there.iterdir() if p.is_file()}
            again_before = chief.bytes_sent()
            store.before_start(chief)  # a restart on the same VM
            again = chief.bytes_sent() - again_before
        finally:
            provider.release(cluster)
    assert fake.live_instances() == []
    assert held == blobs
    if reachable:
        assert sent < 100_000, sent  # the manifest and the command, not 600 KB of checkpoint
        assert again < 100_000, again
    else:
        assert sent > 600_000, sent  # pushed: the VM could not read the bucket
