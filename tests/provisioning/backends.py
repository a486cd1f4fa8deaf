"""The backends the provider conformance suite runs against (tests/provisioning/test_conformance.py).

Each entry builds a test bed for one backend: a provider wired to a journal, plus what the
suite needs to know to drive it. A new backend adds one function decorated with
`@register_backend("<name>")`; it may skip (pytest.skip with a loud reason) when its hosts
cannot exist on this machine (no root for network namespaces, no emulator), and must remove
everything it created when the `with` block ends.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioning.base import Provider
from provisioning.journal import JOURNAL_FILE, Journal
from provisioning.local import LocalProvider, LocalProviderConfig


@dataclass
class Bed:
    """One backend ready for the suite.

    `workdir` is the orchestrator-side directory of the run (ClusterRequest.workdir, logs and
    fetched files go below it); `python` runs Python *on the hosts* (test commands are
    `[python, "-c", code]`); `config` is the provider config `journal.clean_up` needs to
    rebuild the provider after a "crash"; `spare_hosts` how many more machines than the suite
    acquires at once the backend can hand out (replace needs one)."""

    name: str
    provider: Provider
    workdir: Path
    journal_path: Path
    python: str
    config: Any
    spare_hosts: int = 1
    notes: dict[str, Any] = field(default_factory=dict)


BedFactory = Callable[[Path], contextlib.AbstractContextManager[Bed]]
BACKENDS: dict[str, BedFactory] = {}
SLOW_BACKENDS: set[str] = set()  # their checks run with the slow tests (-m slow)


def register_backend(name: str, slow: bool = False) -> Callable[[BedFactory], BedFactory]:
    """Decorator: add a bed factory to the suite under `name`; `slow` when its hosts take
    seconds to build (real sshds), so the fast suite stays fast."""

    def add(factory: BedFactory) -> BedFactory:
        BACKENDS[name] = factory
        if slow:
            SLOW_BACKENDS.add(name)
        return factory

    return add


@register_backend("local")
@contextlib.contextmanager
def local_bed(tmp_path: Path) -> Iterator[Bed]:
    config = LocalProviderConfig(stop_grace_s=0.5)
    journal_path = tmp_path / JOURNAL_FILE
    provider = LocalProvider(config, journal=Journal(journal_path))
    yield Bed("local", provider, tmp_path, journal_path, sys.executable, config, spare_hosts=99)


@register_backend("ssh", slow=True)
@contextlib.contextmanager
def ssh_bed(tmp_path: Path) -> Iterator[Bed]:
    """Four real sshd hosts in network namespaces (tests/testbed): three machines for the
    suite's cluster and a spare. Skips loudly without root, `ip` or sshd."""
    import pytest

    from provisioning.registry import get_provider, make_config
    from tests.testbed import SshTestBed, skip_reason
    from tests.testbed.fixtures import host_python, provider_options

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with SshTestBed(tmp_path / "sshbed", hosts=4) as testbed:
        config = make_config("ssh", provider_options(testbed, stop_grace_s=0.5))
        journal_path = tmp_path / JOURNAL_FILE
        provider = get_provider("ssh", config, journal=Journal(journal_path))
        yield Bed("ssh", provider, tmp_path, journal_path, host_python(), config, spare_hosts=1)
