"""Fixtures for the GCE backend's tests: the fake Compute API and a provider wired to it, the
fake's VMs as isolated hosts (`IsolatedFakeGce`, from tests/fakes/isolated_gce.py), and
gcp-storage-emulator for Cloud Storage."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioning.base import ClusterRequest, HostSpec, Role
from provisioning.gce.config import CREDENTIALS_ANONYMOUS, GceConfig
from provisioning.gce.provider import GceProvider
from provisioning.journal import Journal
from tests.fakes.gce_server import FakeGce

# the fake's VMs as isolated hosts: there, where the benchmark (no pytest) imports them too
from tests.fakes.isolated_gce import IMAGE_FAMILIES, IsolatedFakeGce  # noqa: F401
from tests.fakes.keys import write_ssh_key

PROJECT = "test-project"
ZONES = ["us-central1-a", "us-central1-b", "us-east1-c"]
BUCKET = "lab-bucket"


@contextlib.contextmanager
def storage_emulator(bucket: str = BUCKET, address: str = "127.0.0.1") -> Iterator[str]:
    """gcp-storage-emulator in memory on `address` (default loopback; a test bed's gateway for
    its hosts) at a free port with `bucket`, and STORAGE_EMULATOR_HOST / GOOGLE_CLOUD_PROJECT
    set for the real client while it runs (both restored after). Yields the emulator's URL.
    Skips loudly when the emulator is missing."""
    server_module = pytest.importorskip("gcp_storage_emulator.server",
                                        reason="gcp-storage-emulator (dev extra) not installed")
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = server_module.create_server(address, 0, in_memory=True, default_bucket=bucket)
    server.start()
    url = f"http://{address}:{server._api._httpd.server_address[1]}"
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}
    os.environ.update(STORAGE_EMULATOR_HOST=url, GOOGLE_CLOUD_PROJECT=PROJECT)
    try:
        yield url
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def gce_config(fake: FakeGce, tmp_path: Path, **overrides: Any) -> GceConfig:
    values: dict[str, Any] = dict(
        project=PROJECT, zones=list(ZONES), api_endpoint=fake.endpoint,
        credentials=CREDENTIALS_ANONYMOUS, ssh_key=str(write_ssh_key(tmp_path)),
        poll_interval_s=0.0, ready_poll_s=0.05, host_key_timeout_s=2.0,
        operation_timeout_s=20.0, vm_ready_timeout_s=20.0, retry_backoff_s=0.01,
        labels={"team": "lab"})
    values.update(overrides)
    return GceConfig(**values)


def small_request(run_id: str, workdir: Path, workers: int = 2, gpu: str | None = "t4",
                  zone: str | None = "us-central1-a") -> ClusterRequest:
    """1 on-demand PS with the chief and evaluator on its VM, `workers` Spot GPU workers."""
    hosts = [HostSpec("ps-0", Role.PS, "n1-standard-4", None, zone, False)]
    hosts += [HostSpec(f"worker-{i}", Role.WORKER, "n1-standard-4", gpu, zone, True)
              for i in range(workers)]
    hosts += [HostSpec("chief-0", Role.CHIEF, "n1-standard-4", None, zone, False,
                       colocate_with="ps-0"),
              HostSpec("evaluator-0", Role.EVALUATOR, "n1-standard-4", None, zone, False,
                       colocate_with="ps-0")]
    return ClusterRequest(run_id=run_id, hosts=hosts, workdir=workdir)


def processes_die_with_vm(testbed: Any) -> Callable[[str], None]:
    """The fake's `on_gone` for VMs backed by the namespace hosts of `testbed` (an
    `SshTestBed`): a VM that is deleted or preempted takes every process on its host with it
    (its sshd stays, as the next VM at that address needs it)."""
    by_address = {h.address: h for h in testbed.hosts}

    def gone(ip: str) -> None:
        for pid in testbed.role_pids(by_address[ip]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    return gone


@pytest.fixture(name="fake")
def fake_fixture() -> Iterator[FakeGce]:
    with FakeGce(project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
                 insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2) as server:
        yield server


@pytest.fixture(name="make_provider")
def make_provider_fixture(fake: FakeGce, tmp_path: Path) -> Iterator[Any]:
    """`make_provider(**config_overrides)`; every provider's VMs are gone after the test."""
    made: list[GceProvider] = []

    def build(**overrides: Any) -> GceProvider:
        cfg = gce_config(fake, tmp_path, **overrides)
        provider = GceProvider(cfg, journal=Journal(tmp_path / "journal.jsonl"))
        made.append(provider)
        return provider

    yield build
    for provider in made:  # tests release themselves; this only guards against leaks
        for vm in list(provider._vms.values()):
            if not vm.deleted:
                provider._delete([vm])
