"""The backends the provider conformance suite runs against (tests/provisioning/test_conformance.py).

Each entry builds a test bed for one backend: a provider wired to a journal, plus what the
suite needs to know to drive it. A new backend adds one function decorated with
`@register_backend("<name>")`, called with the test's `tmp_path` and pytest `request` (for
session fixtures such as the SSH test bed); it may skip (pytest.skip with a loud reason) when
its hosts cannot exist on this machine (no root for network namespaces, no emulator), and must
remove everything it created when the `with` block ends.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning.base import Host, Provider
from provisioning.journal import JOURNAL_FILE, Journal
from provisioning.local import LocalProvider, LocalProviderConfig


@dataclass
class Bed:
    """One backend ready for the suite.

    `workdir` is the orchestrator-side directory of the run (ClusterRequest.workdir, logs and
    fetched files go below it); `python` runs Python *on the hosts* (test commands are
    `[python, "-c", code]`); `config` is the provider config `journal.clean_up` needs to
    rebuild the provider after a "crash"; `spare_hosts` how many more machines than the suite
    acquires at once the backend can hand out (replace needs one). `preempt(host)`, for a
    backend that cannot revoke on demand (`can_revoke` False): the cloud takes the host's
    machine away from outside (the fake's preemption), so the suite still checks what `poll`
    and the runners make of a loss."""

    name: str
    provider: Provider
    workdir: Path
    journal_path: Path
    python: str
    config: Any
    spare_hosts: int = 1
    notes: dict[str, Any] = field(default_factory=dict)
    preempt: Callable[[Host], None] | None = None


BedFactory = Callable[[Path, Any], contextlib.AbstractContextManager[Bed]]
BACKENDS: dict[str, BedFactory] = {}
#: The tier marks of each backend's checks (tests/conftest.py, docs/contributing.md).
BACKEND_MARKS: dict[str, tuple[str, ...]] = {}


def register_backend(name: str, marks: tuple[str, ...] = ()) -> Callable[[BedFactory], BedFactory]:
    """Decorator: add a bed factory to the suite under `name`, its checks carrying `marks`:
    `slow` when its hosts take seconds to build (real sshds), `namespaces` when they are
    test-bed hosts (root, network namespaces), so the fast tier stays fast and runs anywhere."""

    def add(factory: BedFactory) -> BedFactory:
        BACKENDS[name] = factory
        BACKEND_MARKS[name] = marks
        return factory

    return add


@register_backend("local")
@contextlib.contextmanager
def local_bed(tmp_path: Path, request: Any) -> Iterator[Bed]:
    config = LocalProviderConfig(stop_grace_s=0.5)
    journal_path = tmp_path / JOURNAL_FILE
    provider = LocalProvider(config, journal=Journal(journal_path))
    yield Bed("local", provider, tmp_path, journal_path, sys.executable, config, spare_hosts=99)


@register_backend("ssh", marks=("slow", "namespaces"))
@contextlib.contextmanager
def ssh_bed(tmp_path: Path, request: Any) -> Iterator[Bed]:
    """The session's four namespace sshd hosts (tests/testbed): three machines for the suite's
    cluster and a spare, each with a root of this test's own (nothing a test leaves on a host
    is seen by the next). Skips loudly without root, `ip` or sshd."""
    from provisioning.registry import get_provider, make_config
    from tests.testbed.fixtures import host_python, provider_options

    testbed = request.getfixturevalue("ssh_testbed")
    options = provider_options(testbed, stop_grace_s=0.5)
    for entry in options["hosts"]:
        entry["root"] = str(tmp_path / "hosts" / entry["name"])
    config = make_config("ssh", options)
    journal_path = tmp_path / JOURNAL_FILE
    provider = get_provider("ssh", config, journal=Journal(journal_path))
    yield Bed("ssh", provider, tmp_path, journal_path, host_python(), config, spare_hosts=1)


@register_backend("gce", marks=("slow", "namespaces"))
@contextlib.contextmanager
def gce_bed(tmp_path: Path, request: Any) -> Iterator[Bed]:
    """The real `compute_v1` client against the fake Compute API (tests/fakes/gce_server.py),
    every VM one of the session's namespace sshd hosts (three VMs for the suite's cluster and a
    spare address); a VM deleted or preempted takes its host's processes with it. Checkpoints
    mirror to a bucket of gcp-storage-emulator (`provider.storage`), so the suite's store checks
    run the gce stores; it listens on the bed's gateway, where the VMs reach it (their dataset
    downloads). Skips loudly without root, `ip` or sshd."""
    from provisioning.gce.provider import GceProvider
    from tests.provisioning.gce_fixtures import (
        BUCKET,
        PROJECT,
        ZONES,
        gce_config,
        processes_die_with_vm,
        storage_emulator,
    )
    from tests.provisioning.test_gce_ssh import fake_on_bed
    from tests.testbed.fixtures import host_python

    testbed = request.getfixturevalue("ssh_testbed")
    with storage_emulator(address=testbed.gateway), fake_on_bed(
            testbed, 4, project=PROJECT, zones=tuple(ZONES), provision_s=0.05, staging_s=0.05,
            insert_op_s=0.05, delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2,
            on_gone=processes_die_with_vm(testbed)) as fake:

        def preempt(host: Host) -> None:
            vm = next(i for i in fake.live_instances() if i.ip == host.address)
            fake.preempt(vm.zone, vm.name)

        config = gce_config(fake, tmp_path, ssh_user="root", ssh_key=str(testbed.client_key),
                            python=host_python(), remote_root=str(tmp_path / "vms"),
                            storage=f"gs://{BUCKET}/conformance")
        journal_path = tmp_path / JOURNAL_FILE
        provider = GceProvider(config, journal=Journal(journal_path))
        yield Bed("gce", provider, tmp_path, journal_path, host_python(), config,
                  spare_hosts=1, preempt=preempt)
        assert fake.live_instances() == [], "the suite left VMs behind"
