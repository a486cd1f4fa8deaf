"""Remote hosts getting the dataset (orchestrator/runtime/data.py DataStager) on the SSH test bed:
a registry dataset is downloaded by the host itself from a local HTTP server on the bed's
bridge and verified (a corrupt archive is refused with one line; an unreachable source falls
back to a push), a restart transfers nothing, and a folder of the user's is pushed once, only
the files the host lacks or holds with another checksum. `host_setup` events carry the bytes
each machine was sent (counted on its SSH socket).
"""

# ruff: noqa: F811  (the test bed fixture is imported, then requested by name)
from __future__ import annotations

import os
from pathlib import Path

import pytest
from cifar_server import ArchiveServer, make_archive
from test_data import capture, check_arrays, use_archive

from orchestrator.runtime import data as data_step
from orchestrator.runtime.deploy import EVENT_HOST_SETUP, Deployment, TrainerEvent
from provisioning.base import Cluster, ClusterRequest, HostSpec
from provisioning.registry import get_provider
from provisioning.ssh.host_runner import DATASETS_DIR
from tests.testbed import SshTestBed
from tests.testbed.fixtures import provider_options, ssh_testbed  # noqa: F401
from trainer import data, datasets
from trainer.problems import get_problem

#: The goal for a restart on a host that holds everything (docs/datasets.md).
RESTART_BYTES_GOAL = 100_000


def provider_on(bed: SshTestBed, root: str):
    """`provider=ssh` on the bed's first host with a root of its own (a fresh host cache)."""
    options = provider_options(bed, bed.hosts[:1])
    options["hosts"][0]["root"] = str(Path(options["hosts"][0]["root"]) / root)
    return get_provider("ssh", options), Path(options["hosts"][0]["root"])


def acquire(provider, tmp_path: Path, run_id: str) -> Cluster:
    """The machine that reads the data: the chief with the evaluator beside it."""
    return provider.acquire(ClusterRequest(run_id=run_id, workdir=tmp_path / "run", hosts=[
        HostSpec("chief-0", "chief"), HostSpec("evaluator-0", "evaluator",
                                               colocate_with="chief-0")]))


def deploy_setup(provider, cluster: Cluster, run_dir: Path, local: Path) -> TrainerEvent:
    """One deployment's setup (what a run or a restart does first); its `host_setup` event."""
    deployment = Deployment(provider, cluster, run_dir, "{}", data_dir=local)
    try:
        deployment.prepare_all()
        events = []
        while (event := deployment.next_event(0)) is not None:
            events.append(event)
    finally:
        deployment.teardown()
    setups = [e for e in events if e.kind == EVENT_HOST_SETUP]
    assert len(setups) == 1, events  # one machine: the evaluator shares the chief's
    return setups[0]


@pytest.mark.slow
def test_a_host_fetches_the_registry_dataset_itself(ssh_testbed: SshTestBed, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    archive = make_archive("cifar-10-binary.tar.gz")
    with ArchiveServer(ssh_testbed.gateway) as srv:
        srv.behaviour.files[archive.name] = archive.data
        ds = use_archive(monkeypatch, archive, srv.base_url)
        local = data.fetch(ds, tmp_path / "cache", console=capture()[0])  # the run's data step
        data_step.mark_origin(local, ds)
        srv.behaviour.requests.clear()
        provider, root = provider_on(ssh_testbed, "fetch")
        cluster = acquire(provider, tmp_path, "fetch")
        try:
            first = deploy_setup(provider, cluster, tmp_path / "run", local)
            restart = deploy_setup(provider, cluster, tmp_path / "run", local)
            staged = Path(cluster.hosts[0].workdir) / data_step.staged_path(local)
            assert staged.resolve() == root / DATASETS_DIR / "cifar10"  # a link into the cache
            check_arrays(get_problem("image_cifar10").load(str(staged), 0), archive)
        finally:
            provider.release(cluster)
        host = ssh_testbed.hosts[0]
        assert [r["client"] for r in srv.behaviour.requests] == [host.address]  # once, by it
        # a corrupt archive at the source: a fresh host refuses it, with one line
        srv.behaviour.files[archive.name] = archive.data[:-64] + bytes(64)
        provider, _ = provider_on(ssh_testbed, "corrupt")
        cluster = acquire(provider, tmp_path, "corrupt")
        try:
            with pytest.raises(data_step.DataError) as refused:
                deploy_setup(provider, cluster, tmp_path / "run", local)
        finally:
            provider.release(cluster)
    assert (first.fields["data"], first.fields["data_pushed_bytes"]) == ("fetched", 0)
    assert (restart.fields["data"], restart.fields["data_pushed_bytes"]) == ("cached", 0)
    assert restart.fields["bytes_sent"] < RESTART_BYTES_GOAL, restart.fields
    line = refused.value.line()
    assert line.startswith("data error: host chief-0 could not fetch cifar10: "
                           "cifar-10-binary.tar.gz from http://"), line
    assert f"expected {archive.md5}" in line and "\n" not in line

    # the source unreachable from the host (the server is gone): `auto` pushes instead
    provider, root = provider_on(ssh_testbed, "offline")
    cluster = acquire(provider, tmp_path, "offline")
    try:
        pushed = deploy_setup(provider, cluster, tmp_path / "run", local)
    finally:
        provider.release(cluster)
    assert pushed.fields["data"] == "pushed"
    assert pushed.fields["data_pushed_bytes"] == data.folder_bytes(local)
    assert "source unreachable from the host" in pushed.fields["data_note"]
    assert datasets.holds_files("image_cifar10", root / DATASETS_DIR / "cifar10")


@pytest.mark.slow
def test_a_pushed_folder_crosses_once(ssh_testbed: SshTestBed, tmp_path: Path) -> None:
    """A folder of the user's (no registry origin) is pushed into the host's cache once: a
    restart sends none of it, a file changed on the host (same size) is the only one sent
    again. The socket counter sees at least the file bytes."""
    local = tmp_path / "mine"
    (local / "cifar-10-batches-bin").mkdir(parents=True)
    for name in ("data_batch_1.bin", "test_batch.bin"):
        (local / "cifar-10-batches-bin" / name).write_bytes(os.urandom(300_000))
    total = data.folder_bytes(local)
    provider, root = provider_on(ssh_testbed, "push")
    cluster = acquire(provider, tmp_path, "push")
    try:
        first = deploy_setup(provider, cluster, tmp_path / "run", local)
        restart = deploy_setup(provider, cluster, tmp_path / "run", local)
        on_host = Path(cluster.hosts[0].workdir) / "data" / "mine" / "cifar-10-batches-bin"
        damaged = on_host / "test_batch.bin"
        damaged.write_bytes(bytes(300_000))
        repaired = deploy_setup(provider, cluster, tmp_path / "run", local)
    finally:
        provider.release(cluster)
    assert (first.fields["data"], first.fields["data_pushed_bytes"]) == ("pushed", total)
    assert first.fields["bytes_sent"] >= total
    assert restart.fields["data_pushed_bytes"] == 0
    assert restart.fields["bytes_sent"] < RESTART_BYTES_GOAL, restart.fields
    assert repaired.fields["data_pushed_bytes"] == 300_000
    assert damaged.read_bytes() == (local / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    assert on_host.resolve().parent.parent == root / DATASETS_DIR
