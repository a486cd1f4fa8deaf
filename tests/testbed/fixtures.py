"""Pytest fixtures over the SSH test bed. Import them into a test module:

    from tests.testbed.fixtures import ssh_testbed, ssh_provider_config  # noqa: F401

`ssh_testbed` (session scope) starts 4 namespace hosts once for every test of the session and
removes them at the end (asserting nothing is left); tests that break a host (cut its link,
kill its sshd, change its key) use `ssh_testbed.add_host()` for a host of their own, or restore
what they broke. When this machine cannot run the test bed the tests are skipped with a loud
reason naming what is missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.testbed import SshTestBed, TestHost, skip_reason

SESSION_HOSTS = 4


def host_python() -> str:
    """The interpreter the namespace hosts declare: this venv's, whose environment already has
    the trainer's dependencies (the hosts share this machine's filesystem). The venv symlink is
    resolved so the path is the same whichever worktree runs the tests."""
    return os.path.join(os.path.realpath(sys.prefix), "bin", "python")


@pytest.fixture(scope="session")
def ssh_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshTestBed]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    bed = SshTestBed(tmp_path_factory.mktemp("sshbed"), hosts=SESSION_HOSTS)
    try:
        yield bed
    finally:
        bed.close()
    assert not bed.leftovers(), f"test bed left {bed.leftovers()}"


def inventory(bed: SshTestBed, hosts: list[TestHost] | None = None,
              spares: int = 0) -> list[dict[str, Any]]:
    """Inventory entries for `hosts` (default: the bed's first hosts), the last `spares` of
    them marked spare; every host declares `host_python()`."""
    entries = bed.inventory(hosts)
    for i, entry in enumerate(entries):
        entry["python"] = host_python()
        entry["spare"] = i >= len(entries) - spares
    return entries


def provider_options(bed: SshTestBed, hosts: list[TestHost] | None = None,
                     spares: int = 0, **overrides: Any) -> dict[str, Any]:
    """`provider=ssh` options (as a run's resolved `provider` section) for the test bed."""
    return {"hosts": inventory(bed, hosts, spares), "known_hosts": str(bed.known_hosts),
            "stop_grace_s": 1.0, **overrides}


@pytest.fixture
def ssh_provider_config(ssh_testbed: SshTestBed) -> dict[str, Any]:
    """Options for the session's hosts (no spares)."""
    return provider_options(ssh_testbed)


def write_provider_file(conf: Path, name: str, options: dict[str, Any]) -> Path:
    """``conf/provider/<name>.yaml``, an ``provider=ssh`` file over ``ssh_schema`` holding
    ``options`` (a Hydra search dir's, or a user repository's ``conf/``); returns ``conf``."""
    (conf / "provider").mkdir(parents=True, exist_ok=True)
    (conf / "provider" / f"{name}.yaml").write_text(
        "defaults:\n  - ssh_schema\n  - _self_\n" + yaml.safe_dump({"name": "ssh", **options}))
    return conf
