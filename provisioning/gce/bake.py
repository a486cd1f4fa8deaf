"""Baking a GCE image with the hosts' runtime preinstalled (issue 19 §3), so a run's VMs only
unpack our wheel. The command is `python -m orchestrator.image bake` (orchestrator/image.py).

One VM from the base image (`provider.image_family`) is set up exactly as a run sets a bare VM up
(`provisioning/ssh/setup.py`: the hosts' dependency set installed on the VM from
`provider.index_url`, or a wheelhouse), what a role imports compiled to bytecode once (so the
image's VMs do not each compile it), our wheel and run files removed (only the venv stays), the
VM stopped, `images.insert` from its boot disk, the VM deleted. The image is named
`transient-host-<cpu|gpu>-<dependency-set digest>-<base image digest>`: a run with
`provider.image=projects/P/global/images/<that name>` finds the venv ready (same `remote_root`,
`ssh_user`, dependency set and Python) and only unpacks our wheel; a run whose dependency set is
not the image's is refused before any VM (`GceConfig.check`), so a stale image is never used
silently. Baking again with the same set and base does nothing (the image exists). Nothing is left
on failure: the VM is deleted whatever happens, an image whose insert failed is deleted.
"""

from __future__ import annotations

import contextlib
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from provisioning.base import BadFieldError, ClusterRequest, HostSpec, Role
from provisioning.gce.config import GceConfig
from provisioning.gce.ssh import trainer_extra
from provisioning.host_runtime import baked_image_name
from provisioning.ssh.setup import INSTALL_TIMEOUT_S

STOP_TIMEOUT_S = 300.0
#: What a role imports (trainer/startup.py, models.py, problems.py), compiled on the baking VM.
_WARM_UP = ("import keras, tensorflow, sklearn.datasets, sklearn.model_selection; "
            "from keras import layers; import trainer.loop, trainer.evaluator")
IMAGE_TIMEOUT_S = 1800.0  # creating an image from a 100 GB disk takes minutes


class _Images:
    """The image and stop calls the provider's API layer has no use for, on the same client
    settings (endpoint, credentials, project)."""

    def __init__(self, cfg: GceConfig) -> None:
        from google.api_core.client_options import ClientOptions
        from google.cloud import compute_v1

        from provisioning.gce.api import resolve_credentials

        credentials, self.project = resolve_credentials(cfg)
        options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
        kw: dict[str, Any] = dict(credentials=credentials, client_options=options,
                                  transport="rest")
        self.compute = compute_v1
        self.instances = compute_v1.InstancesClient(**kw)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kw)
        self.images = compute_v1.ImagesClient(**kw)
        self.global_ops = compute_v1.GlobalOperationsClient(**kw)

    def exists(self, name: str) -> bool:
        from google.api_core import exceptions as gexc

        try:
            self.images.get(project=self.project, image=name)
            return True
        except gexc.NotFound:
            return False

    def stop(self, zone: str, name: str, timeout_s: float) -> None:
        op = self.instances.stop(project=self.project, zone=zone, instance=name)
        self._wait(lambda: self.zone_ops.wait(project=self.project, zone=zone,
                                              operation=op.name), timeout_s, f"stopping {name}")
        deadline = time.monotonic() + timeout_s
        while self.instances.get(project=self.project, zone=zone,
                                 instance=name).status != "TERMINATED":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not stopped after {timeout_s:g} s")
            time.sleep(1.0)

    def insert(self, name: str, zone: str, disk: str, labels: dict[str, str],
               timeout_s: float) -> None:
        image = self.compute.Image(name=name, labels=labels,
                                   source_disk=f"projects/{self.project}/zones/{zone}/disks/{disk}")
        op = self.images.insert(project=self.project, image_resource=image)
        self._wait(lambda: self.global_ops.wait(project=self.project, operation=op.name),
                   timeout_s, f"creating image {name}")

    def delete(self, name: str) -> None:
        from google.api_core import exceptions as gexc

        with contextlib.suppress(gexc.NotFound):
            self.images.delete(project=self.project, image=name)

    def _wait(self, wait, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while True:
            op = wait()
            if op.status == self.compute.Operation.Status.DONE:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout_s:g} s")
        if op.error.errors:
            raise RuntimeError(f"{what} failed: {op.error.errors[0].message}")


def bake(cfg: GceConfig, gpu: str | None = None, machine_type: str = "n1-standard-4",
         zone: str | None = None, workdir: Path | None = None, log=print  # type: ignore[no-untyped-def]
         ) -> str:
    """Bake (or find) the image for this dependency set on `cfg`'s base image; its URL
    (projects/P/global/images/NAME). Raises BadRequestError for a config that cannot bake."""
    from provisioning.gce.provider import GceProvider
    from provisioning.journal import Journal

    if cfg.python is not None:
        raise BadFieldError("provider.python", "set: VMs of that image already have their "
                            "runtime, there is nothing to bake")
    zone = zone or (cfg.zones[0] if cfg.zones else None)
    if zone is None:
        raise BadFieldError("provider.zones", "empty: name the zone to bake in")
    extra = trainer_extra(gpu is not None, cfg.extra)  # what the VM installs (VmSsh's choice)
    api = _Images(cfg)
    base = cfg.image or f"projects/{cfg.image_project}/global/images/family/{cfg.image_family}"
    name = baked_image_name(base, extra)
    url = f"projects/{api.project}/global/images/{name}"
    if api.exists(name):
        log(f"image {url} is already baked for this dependency set")
        return url
    workdir = workdir or Path(tempfile.mkdtemp(prefix="transient-bake-"))
    provider = GceProvider(cfg, journal=Journal(workdir / "journal.jsonl"))
    request = ClusterRequest(run_id=f"bake-{name[-21:-9]}", workdir=workdir, hosts=[
        HostSpec("ps-0", Role.PS, machine_type, gpu, zone, False)])
    log(f"baking {url}: a {machine_type} VM in {zone} from "
        f"{cfg.image or cfg.image_family} sets itself up")
    cluster = provider.acquire(request)
    inserted = False
    try:
        host = cluster.hosts[0]
        runner = provider.runner(host)
        runner.setup()
        env = runner.machine.environment  # type: ignore[attr-defined]
        root = runner.machine.root  # type: ignore[attr-defined]
        # The bytecode of what a role imports goes into the image too: the venv is installed
        # without it (host_setup.py), and each VM of the image would otherwise compile
        # TensorFlow's and Keras' modules at its first import (about a minute of CPU).
        runner.machine.connection.run(  # type: ignore[attr-defined]
            " ".join(shlex.quote(a) for a in ("env", *(f"{k}={v}" for k, v in env.env.items()),
                                              env.command[0], "-c", _WARM_UP)),
            timeout_s=INSTALL_TIMEOUT_S)
        # only the venv goes into the image: not this run's wheel, environment or files
        runner.machine.connection.run(  # type: ignore[attr-defined]
            f"cd {shlex.quote(root)} && rm -rf wheels runs wheelhouse envs/[0-9a-f]* "
            "envs/*.lock")
        vm = provider.vm_of(host.id)
        log(f"{vm.name}: runtime installed (Python {env.version}); stopping it")
        api.stop(vm.zone, vm.name, STOP_TIMEOUT_S)
        inserted = True
        api.insert(name, vm.zone, vm.name, {"tool": "transient-ps", "deps": name.split("-")[3],
                                            "extra": extra}, IMAGE_TIMEOUT_S)
        inserted = False  # done: kept
    finally:
        if inserted:  # its insert failed or was interrupted: nothing half-made is left
            api.delete(name)
        provider.release(cluster)
    log(f"baked {url} (use it with provider.image={url})")
    return url
