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


def register_backend(name: str) -> Callable[[BedFactory], BedFactory]:
    """Decorator: add a bed factory to the suite under `name`."""

    def add(factory: BedFactory) -> BedFactory:
        BACKENDS[name] = factory
        return factory

    return add


@register_backend("local")
@contextlib.contextmanager
def local_bed(tmp_path: Path) -> Iterator[Bed]:
    config = LocalProviderConfig(stop_grace_s=0.5)
    journal_path = tmp_path / JOURNAL_FILE
    provider = LocalProvider(config, journal=Journal(journal_path))
    yield Bed("local", provider, tmp_path, journal_path, sys.executable, config, spare_hosts=99)
