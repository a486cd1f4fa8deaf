"""Checks before any VM, in one pass, one line per problem: quotas the plan needs (regional and
project-wide, `CPUS_ALL_REGIONS` too), the image family, the bucket; the OS Login mode. Through
the real google-cloud-compute client against the fake (projects.get, regions.get,
images.getFromFamily) and gcp-storage-emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioning.gce.errors import QuotaError
from provisioning.gce.preflight import PreflightError, machine_cpus
from tests.fakes.gce_server import FakeGce
from tests.provisioning.gce_fixtures import (  # noqa: F401 (fixtures)
    BUCKET,
    fake_fixture,
    make_provider_fixture,
    small_request,
    storage_emulator,
)


def test_every_problem_is_one_line_and_nothing_is_created(fake: FakeGce, make_provider,
                                                          tmp_path: Path) -> None:
    fake.set_quota("GPUS_ALL_REGIONS", 0)  # a new project
    fake.set_quota("CPUS_ALL_REGIONS", 8)  # 3 VMs of 4 vCPUs need 12
    for region in ("us-central1", "us-east1"):  # no region of provider.zones has a T4 for Spot
        fake.set_quota("NVIDIA_T4_GPUS", 0, region=region)
    fake.set_quota("IN_USE_ADDRESSES", 1, region="us-central1")
    fake.image_families, fake.image_catalogue = set(), {}  # the family is gone
    with storage_emulator():
        provider = make_provider(storage="gs://no-such-bucket/runs")
        with pytest.raises(PreflightError) as info:
            provider.acquire(small_request("pre", tmp_path, workers=2))
    problems = info.value.problems
    assert all("\n" not in line for line in problems)
    text = "\n".join(problems)
    assert str(info.value) == text
    assert "quota GPUS_ALL_REGIONS (all regions): the plan needs 2, 0 free" in text
    assert "quota CPUS_ALL_REGIONS (all regions): the plan needs 12, 8 free" in text
    assert "quota NVIDIA_T4_GPUS in region us-central1: the plan needs 2, 0 free" in text
    assert "quota IN_USE_ADDRESSES in region us-central1: the plan needs 3, 1 free" in text
    assert any(line.startswith("provider.image_family: image family "
                               "common-cu129-ubuntu-2404-nvidia-580 not found") for line in problems)
    assert any(line.startswith("provider.storage: bucket no-such-bucket does not exist")
               for line in problems)
    assert len(problems) == 6, text
    assert fake.calls["instances.insert"] == 0 and fake.live_instances() == []
    assert fake.calls["projects.get"] == 1 and fake.calls["images.getFromFamily"] == 1


def test_a_region_short_of_quota_is_fine_when_another_holds_the_cluster(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    fake.set_quota("PREEMPTIBLE_NVIDIA_T4_GPUS", 1, region="us-central1")
    fake.set_quota("PREEMPTIBLE_NVIDIA_T4_GPUS", 2, region="us-east1")
    with storage_emulator():
        provider = make_provider(storage=f"gs://{BUCKET}/runs")  # exists and is writable
        cluster = provider.acquire(small_request("fits", tmp_path, workers=2))
    try:
        assert len(fake.live_instances()) == 3
        assert not provider.os_login
    finally:
        provider.release(cluster)


def test_cpus_exhausted_globally_stop_everywhere_at_insert(fake: FakeGce, make_provider,
                                                          tmp_path: Path) -> None:
    """Quotas can change between the check and the insert: the insert's QUOTA_EXCEEDED for
    CPUS_ALL_REGIONS blocks every region (not only the one it came from) and nothing stays."""
    fake.set_quota("CPUS_ALL_REGIONS", 8)
    provider = make_provider(preflight_checks=False)
    with pytest.raises(QuotaError, match="CPUS_ALL_REGIONS") as info:
        provider.acquire(small_request("cpus", tmp_path, workers=2))
    assert info.value.region is None and "all regions" in str(info.value)
    assert fake.live_instances() == []
    assert fake.calls["instances.insert"] == 3  # no retry in another region


def test_with_os_login_the_key_is_imported_and_vms_are_logged_into_as_its_posix_user(
        fake: FakeGce, make_provider, tmp_path: Path) -> None:
    """The project's metadata turns OS Login on, so VMs ignore ssh-keys: the key goes into the
    OS Login profile (the real google-cloud-os-login client) and SSH uses the POSIX user."""
    fake.project_metadata["enable-oslogin"] = "TRUE"
    provider = make_provider(os_login_user="alice@example.com")
    cluster = provider.acquire(small_request("osl", tmp_path, workers=1))
    try:
        assert provider.os_login
        public = provider._public_key()
        assert fake.oslogin_keys == {"alice@example.com": [public]}
        ssh = provider.vm_of(cluster.hosts[0].id).ssh
        assert ssh.user == "alice_example_com"
    finally:
        provider.release(cluster)


@pytest.mark.parametrize("why", ["no user", "denied"])
def test_os_login_that_cannot_work_is_one_line_before_any_vm(
        fake: FakeGce, make_provider, tmp_path: Path, why: str) -> None:
    fake.project_metadata["enable-oslogin"] = "TRUE"
    fake.oslogin_denied = why == "denied"
    provider = make_provider(os_login_user=None if why == "no user" else "bob@example.com")
    with pytest.raises(PreflightError) as info:
        provider.acquire(small_request("osl-no", tmp_path, workers=1))
    [line] = info.value.problems
    assert line.startswith("provider.os_login_user: project test-project has OS Login on")
    assert ("Permission denied" in line) if why == "denied" else ("set it to the e-mail" in line)
    assert fake.calls["instances.insert"] == 0 and fake.live_instances() == []


def test_without_os_login_the_ssh_keys_user_logs_in(fake: FakeGce, make_provider,
                                                    tmp_path: Path) -> None:
    provider = make_provider(os_login_user="alice@example.com")
    cluster = provider.acquire(small_request("no-osl", tmp_path, workers=1))
    try:
        assert not provider.os_login and fake.oslogin_keys == {}
        assert provider.vm_of(cluster.hosts[0].id).ssh.user == "transient"
    finally:
        provider.release(cluster)


@pytest.mark.parametrize(("machine", "cpus"), [("n1-standard-4", 4), ("g2-standard-8", 8),
                                               ("n1-highmem-16", 16), ("a2-highgpu-2g", 24),
                                               ("e2-medium", None)])
def test_vcpus_come_from_the_machine_type(machine: str, cpus: int | None) -> None:
    assert machine_cpus(machine) == cpus
