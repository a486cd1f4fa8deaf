"""The fake cloud on isolated hosts with an image baked once per pytest session.

`make gce-fake` runs the headline sweep (tests/provisioning/test_gce_headline.py) and the sweep
killed and resumed on the same fake cloud (tests/orchestrator/test_resume.py). Both boot their
VMs from an image baked as a user would (README "Baked images"): `python -m orchestrator.image
bake` on the fake, one VM of the base family installing the hosts' runtime (TensorFlow's CPU
build, scikit-learn, our wheel) from a package index on the bed's bridge. That bake is the
costliest single step of the target (minutes: TensorFlow installed on a VM), so it happens
once: `gce_isolated_bed` is one isolated bed for the session, `baked_gce_image` bakes on a fake
of its own and hands the image's disk on; each test makes its own `IsolatedFakeGce` on the bed
and imports the image (`IsolatedFakeGce.import_image`), as another project's fake would see a
shared image.

The fixtures are registered in tests/conftest.py (a session fixture imported into two test
modules would be two fixtures, baked twice). Heavy imports stay inside the functions: every test
session imports this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# the fake cloud's settings: there, where the benchmark (no pytest) imports them too
from tests.fakes.isolated_gce import FAKE_TIMES, FAMILY, ZONES, provider_args  # noqa: F401

if TYPE_CHECKING:
    from tests.provisioning.gce_fixtures import IsolatedFakeGce
    from tests.testbed.isolated import Disk, IsolatedTestBed

BAKE_TIMEOUT_S = 900
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class BakedImage:
    """An image `orchestrator.image bake` made: its URL (what `provider.image` takes), its
    disk on the session bed, and how long the bake took."""

    url: str
    disk: Disk
    bake_s: float

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[1]


def bake_image(fake: IsolatedFakeGce, bed: IsolatedTestBed, cwd: Path) -> str:
    """`python -m orchestrator.image bake` on the fake, the VM installing from the bed's index."""
    from provisioning import host_runtime
    from tests.testbed import wheelhouse

    index_url = bed.serve_index(wheelhouse.wheelhouse(wheelhouse.HOST_REQUIREMENTS, "3.13"))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.image", "bake", "--zone", ZONES[1],
         *provider_args(fake, bed), f"provider.index_url={index_url}"],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=BAKE_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    url = done.stdout.strip().splitlines()[-1]
    print(f"baked image: {time.monotonic() - started:.1f} s: {url}")
    name = url.rsplit("/", 1)[1]
    assert name.startswith(f"transient-host-cpu-{host_runtime.load().digest('cpu')[:12]}-")
    assert "runtime installed (Python 3.13)" in done.stdout, done.stdout
    assert fake.images[name]["status"] == "READY" and fake.live_instances() == []
    return url


@pytest.fixture(scope="session")
def gce_isolated_bed() -> Iterator[IsolatedTestBed]:
    """One isolated bed for the session's fake clouds (each adds the hosts of its VMs); at the
    end everything is removed and nothing may be left."""
    from tests.testbed.isolated import IsolatedTestBed, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    bed = IsolatedTestBed()
    try:
        yield bed
    finally:
        sizes = subprocess.run(["du", "-sm", *map(str, bed.dir.glob("*/*"))],
                               capture_output=True, text=True).stdout.split("\n")
        started = time.monotonic()
        bed.close()
        big = sorted((ln.split("\t") for ln in sizes if ln), key=lambda x: -int(x[0]))[:4]
        print(f"gce bed removed in {time.monotonic() - started:.1f} s; largest (MB): {big}")
    assert not bed.leftovers(), f"isolated bed left {bed.leftovers()}"


@pytest.fixture(scope="session")
def baked_gce_image(gce_isolated_bed: IsolatedTestBed,
                    tmp_path_factory: pytest.TempPathFactory) -> BakedImage:
    """The hosts' runtime baked into an image once per session (module docstring)."""
    from tests.provisioning.gce_fixtures import IsolatedFakeGce

    started = time.monotonic()
    with IsolatedFakeGce(gce_isolated_bed, vms=1, login_refused_s=2.0, zones=ZONES,
                         **FAKE_TIMES) as fake:
        url = bake_image(fake, gce_isolated_bed, tmp_path_factory.mktemp("bake"))
        disk = fake.custom_images[url.split("/compute/v1/", 1)[-1]]
    return BakedImage(url, disk, round(time.monotonic() - started, 1))


def fake_with_image(bed: IsolatedTestBed, image: BakedImage, vms: int,
                    **options: Any) -> IsolatedFakeGce:
    """A fake cloud of `vms` isolated hosts (not started) that knows the session's image."""
    from tests.provisioning.gce_fixtures import IsolatedFakeGce

    fake = IsolatedFakeGce(bed, vms=vms, login_refused_s=2.0, zones=ZONES,
                           **{**FAKE_TIMES, **options})
    fake.import_image(image.url, image.disk)
    return fake
