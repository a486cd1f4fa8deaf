"""An isolated-host image with the hosts' runtime baked in: the image `python -m orchestrator.image
bake` makes, made once per machine and cached outside the checkout, for the SSH and GCE fault
end-to-end tests (tests/orchestrator/test_ssh_e2e.py, tests/provisioning/test_gce_e2e.py).

Those tests are about what happens to a run when machines are revoked, cut off, frozen or
killed; each would otherwise spend its first minute installing TensorFlow on every host. So
their hosts boot from an image that already holds the hosts' runtime, as a user's would (README
"Baked images"), and the run only unpacks our wheel there. The image is made by the project's
own code, not by the test: `provisioning.gce.bake.bake` on the fake Compute API whose VMs are
isolated hosts (tests/provisioning/gce_fixtures.py), the VM installing the hosts' dependency set
(pyproject's `host-cpu` extra) from a package index on the bed's bridge, serving wheels
downloaded for the image's Python (tests/testbed/wheelhouse.py). The VM's disk becomes the
image: a layer over the Debian 13 root filesystem (tests/testbed/images.py) holding the user
`transient` (the GCE provider's default `ssh_user`, made by the guest agent) and the venv under
`/var/tmp/transient` (its default `remote_root`), owned by that user; no wheel of ours, no run.

Keyed by what decides its content: the baked image's name (the dependency set's digest and the
base family), the base root filesystem's recipe digest, and the code that bakes it and lays the
venv out (`CODE`: a change there bakes a new image, so a stale one is never used). Built into a
temporary directory and renamed into place under a file lock, so concurrent test processes
(pytest-xdist workers) wait for one build and never see half an image; read-only afterwards
(overlayfs lower layers must not change while mounted). About a minute on a quiet 2-core
machine, plus the wheel download the first time.

CLI (run by `make isolated-images`): `python -m tests.testbed.baked build` builds it if missing
and prints its layer.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provisioning import host_runtime
from provisioning.checkout import PROJECT_ROOT
from tests.testbed import images, wheelhouse
from tests.testbed.isolated import Disk

BASE = "trixie"  # Debian 13, Python 3.13: not the orchestrator's minor
FAMILY = ("debian-cloud", "debian-13")  # what the fake boots BASE from
EXTRA = "cpu"  # the fake's VMs have no GPU: TensorFlow's CPU build
#: What makes the image: this file, the bake, and the host-side setup that names the venv.
CODE = (Path(__file__), PROJECT_ROOT / "provisioning/gce/bake.py",
        PROJECT_ROOT / "provisioning/ssh/host_setup.py")
ZONE = "us-central1-a"


@dataclass(frozen=True)
class BakedRuntime:
    """The cached image: its name as `bake` gives it, the disk a host boots from it, and the
    user and root whose venv it holds (GceConfig's defaults)."""

    name: str
    disk: Disk
    user: str
    root: str
    python: str  # "3.13"

    def url(self, project: str) -> str:
        """Its URL in `project` (a fake that knows it: `IsolatedFakeGce.add_image`)."""
        return f"projects/{project}/global/images/{self.name}"


def _base_url() -> str:
    return f"projects/{FAMILY[0]}/global/images/family/{FAMILY[1]}"


def image_name() -> str:
    """The name `bake` gives this project's image on BASE (the dependency set's digest in it)."""
    return host_runtime.baked_image_name(_base_url(), EXTRA)


def entry() -> Path:
    """The cache entry (holding `layer/`), whether built or not."""
    code = hashlib.sha256(b"".join(p.read_bytes() for p in CODE)).hexdigest()[:8]
    return images.cache_dir() / "baked" / f"{image_name()}-{images.IMAGES[BASE].digest()}-{code}"


def _runtime() -> BakedRuntime:
    from provisioning.gce.config import GceConfig

    defaults = GceConfig()
    return BakedRuntime(image_name(), Disk(BASE, (entry() / "layer",)), defaults.ssh_user,
                        defaults.remote_root, images.IMAGES[BASE].python)


def is_built() -> bool:
    return (entry() / ".complete").exists()


def build() -> BakedRuntime:
    """The baked image, built first if this machine has none (safe to call concurrently)."""
    images.build(BASE)
    wheelhouse._cached(entry(), _bake)
    return _runtime()


def _bake(tmp: Path) -> str:
    """Bake the image on a bed of its own and move the VM's disk layer to `tmp/layer`."""
    from provisioning.gce.bake import bake
    from provisioning.gce.config import CREDENTIALS_ANONYMOUS, GceConfig
    from tests.provisioning.gce_fixtures import IsolatedFakeGce
    from tests.testbed.isolated import IsolatedTestBed

    started = time.monotonic()
    wheels = wheelhouse.wheelhouse(wheelhouse.HOST_REQUIREMENTS, images.IMAGES[BASE].python)
    tmp.mkdir(parents=True)
    said: list[str] = []
    with IsolatedTestBed() as bed, tempfile.TemporaryDirectory(prefix="bake-") as work:
        index = bed.serve_index(wheels)
        with IsolatedFakeGce(bed, vms=1, families={FAMILY[1]: BASE}, login_refused_s=0.0,
                             zones=(ZONE,), provision_s=0.05, staging_s=0.05, insert_op_s=0.05,
                             delete_op_s=0.05, stop_s=0.05, wait_cap_s=0.2) as fake:
            cfg = GceConfig(project=fake.project, zones=[ZONE], api_endpoint=fake.endpoint,
                            credentials=CREDENTIALS_ANONYMOUS, ssh_key=str(bed.client_key),
                            image_project=FAMILY[0], image_family=FAMILY[1], index_url=index,
                            extra=EXTRA, gpu_check=False, preflight_checks=False,
                            poll_interval_s=0.5, ready_poll_s=0.1, host_key_poll_s=0.2,
                            host_key_timeout_s=120.0)
            url = bake(cfg, workdir=Path(work), log=said.append)
            if url.rsplit("/", 1)[1] != image_name():
                raise RuntimeError(f"bake made {url}, expected {image_name()}")
            (layer,) = fake.custom_images[url].layers
            # the bed's directory and the cache are one file system: a rename, not a copy
            layer.rename(tmp / "layer")
    return (f"{image_name()} on {BASE}: baked in {time.monotonic() - started:.0f} s; "
            + " / ".join(said))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["build"]:
        print("usage: python -m tests.testbed.baked build", file=sys.stderr)
        return 2
    from tests.testbed.isolated import skip_reason

    reason = skip_reason()
    if reason:
        print(f"baked image NOT built: {reason}", file=sys.stderr)
        return 0  # the tests that need it skip loudly
    if is_built():
        print(f"baked image: cached at {entry() / 'layer'}")
        return 0
    started = time.monotonic()
    built = build()
    print(f"baked image {built.name}: built in {time.monotonic() - started:.0f} s at "
          f"{entry() / 'layer'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

