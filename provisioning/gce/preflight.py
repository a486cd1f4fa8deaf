"""Checks made before any VM is created, in one pass, one line per problem (audit rows 9, 21).

A new project has `GPUS_ALL_REGIONS = 0`; without these checks the run creates the on-demand PS,
fails on the workers and deletes the PS again, and a wrong bucket fails only after every VM has
booted. Read here, with one projects.get, one regions.get per region, one
images.getFromFamily (and one images.list when it answers 404) and one
networks.getEffectiveFirewalls:

- quotas the plan needs: per region `CPUS` (Spot: `PREEMPTIBLE_CPUS` where the region has that
  quota, else `CPUS`, as GCE counts them), the GPU's `NVIDIA_<GPU>_GPUS` /
  `PREEMPTIBLE_NVIDIA_<GPU>_GPUS`, `IN_USE_ADDRESSES` (one per VM with an external IP); project-wide
  `GPUS_ALL_REGIONS` and `CPUS_ALL_REGIONS`; the boot disks' `SSD_TOTAL_GB` (pd-balanced,
  pd-ssd) or `DISKS_TOTAL_GB` (pd-standard). A region short of quota is a problem only when no
  other region of `provider.zones` could hold the whole cluster (the zone fallback moves there);
- the image family resolves (`provider.image_family` in `provider.image_project`), else one
  images.list names the newest family of its line; the boot disk holds its image;
- the network's firewall lets SSH reach the VMs and the trainer ports pass between them (one
  networks.getEffectiveFirewalls, `firewall.py`);
- the bucket of `provider.storage` takes an object write and delete, with
  `provider.credentials` (what Storage Object Admin allows; no bucket metadata read);
- the project's OS Login mode (`enable-oslogin` in its common metadata), returned for the caller;
  OS Login with 2-step verification refused, and the VMs' service account exists and, with a
  lease, may delete its VM (`access.py`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioning.base import BadRequestError, ProvisionError
from provisioning.gce.access import account_lines, metadata_true
from provisioning.gce.body import ATTACHED_GPUS, VmRequest, built_in_gpu
from provisioning.gce.config import BOOT_DISK_QUOTAS, GceConfig
from provisioning.gce.errors import region_of
from provisioning.machine_shapes import gpus_per_vm

#: Catalog GPU -> the name in GCE's quota metrics (NVIDIA_T4_GPUS, PREEMPTIBLE_NVIDIA_T4_GPUS).
GPU_QUOTA_NAMES = {"t4": "T4", "v100": "V100", "p100": "P100", "p4": "P4", "k80": "K80",
                   "l4": "L4", "a100": "A100", "a100-80gb": "A100_80GB", "h100": "H100"}
GLOBAL_METRICS = ("GPUS_ALL_REGIONS", "CPUS_ALL_REGIONS")
QUOTA_URL = "https://console.cloud.google.com/iam-admin/quotas"
#: vCPUs per GPU of the accelerator-optimized families (a2-highgpu-2g: 24).
_CPUS_PER_GPU = {"a2": 12, "a3": 26}


class PreflightError(BadRequestError):
    """What stops a run before any VM exists: one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


#: Shapes whose vCPUs are not their series' per-GPU count times their GPUs (compute/docs/gpus).
_CPUS_OF_SHAPE = {"a2-megagpu-16g": 96}


def machine_cpus(machine_type: str) -> int | None:
    """vCPUs of a machine type from its name (n1-standard-4: 4; a2-highgpu-2g: 24); None when
    the name does not say (the CPU quotas are then not checked for it)."""
    if machine_type in _CPUS_OF_SHAPE:
        return _CPUS_OF_SHAPE[machine_type]
    found = re.fullmatch(r"[a-z0-9]+-(?:standard|highmem|highcpu)-(\d+)", machine_type)
    if found:
        return int(found.group(1))
    found = re.fullmatch(r"([a-z0-9]+)-[a-z]+gpu-(\d+)g", machine_type)
    if found and found.group(1) in _CPUS_PER_GPU:
        return _CPUS_PER_GPU[found.group(1)] * int(found.group(2))
    return None


def vm_demand(vm: VmRequest, cfg: GceConfig, region_quotas: dict[str, tuple[float, float]]
              ) -> Counter[str]:
    """The quota metrics one VM counts against in a region with `region_quotas`: a Spot VM
    counts against PREEMPTIBLE_* where the region grants that quota, else the standard one;
    its boot disk against SSD_TOTAL_GB or DISKS_TOTAL_GB (`BOOT_DISK_QUOTAS`), Spot or not."""

    def regional(metric: str) -> str:
        preemptible = f"PREEMPTIBLE_{metric}"
        granted = region_quotas.get(preemptible, (0.0, 0.0))[0] > 0
        return preemptible if vm.transient and granted else metric

    demand: Counter[str] = Counter()
    cpus = machine_cpus(vm.machine_type)
    if cpus:
        demand["CPUS_ALL_REGIONS"] += cpus
        demand[regional("CPUS")] += cpus
    fixed = built_in_gpu(vm.machine_type)
    gpu = fixed[0] if fixed is not None else vm.gpu if vm.gpu in ATTACHED_GPUS else None
    if gpu is not None:
        count = gpus_per_vm(vm.machine_type, gpu)  # a2-highgpu-4g counts 4
        demand["GPUS_ALL_REGIONS"] += count
        if gpu in GPU_QUOTA_NAMES:
            demand[regional(f"NVIDIA_{GPU_QUOTA_NAMES[gpu]}_GPUS")] += count
    if cfg.external_ip:
        demand["IN_USE_ADDRESSES"] += 1
    if cfg.boot_disk_type in BOOT_DISK_QUOTAS:
        demand[BOOT_DISK_QUOTAS[cfg.boot_disk_type]] += cfg.boot_disk_gb
    return demand


def quota_lines(demand: Counter[str], quotas: dict[str, tuple[float, float]],
                where: str, metrics: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """(fits, short): one line per metric of `demand` that `quotas` (metric -> (limit, usage))
    holds, and one per metric it cannot hold."""
    fits, short = [], []
    for metric in sorted(metrics if metrics is not None else demand):
        need = demand.get(metric, 0)
        if not need or metric not in quotas:
            continue  # a metric GCE does not list for this scope is not limited there
        limit, usage = quotas[metric]
        free = max(0, int(limit - usage))
        line = f"quota {metric} {where}: the plan needs {need}, {free} free"
        if need > free:
            short.append(f"{line} (limit {limit:g}, {usage:g} in use); ask for an increase "
                         f"at {QUOTA_URL}")
        else:
            fits.append(line)
    return fits, short


@dataclass(frozen=True)
class PreflightResult:
    problems: list[str]
    os_login: bool  # the project's metadata turns OS Login on
    #: one line per check that passed (quotas that hold the plan, the image the family
    #: resolves to, the bucket), which the dry run shows beside the problems
    passed: list[str] = field(default_factory=list)


def check(api: Any, cfg: GceConfig, vms: Sequence[VmRequest]) -> PreflightResult:
    """Every check of the module docstring; never creates anything (the bucket's probe object
    is deleted at once)."""
    problems: list[str] = []
    passed: list[str] = []
    try:
        info = api.project_info()
    except ProvisionError as error:
        return PreflightResult([f"provider.project: cannot read project {api.project}: "
                                f"{error}"], False)
    os_login = metadata_true(info.metadata.get("enable-oslogin"))
    total: Counter[str] = Counter()
    for vm in vms:
        total.update(vm_demand(vm, cfg, {}))
    fits, short = quota_lines(total, info.quotas, "(all regions)", GLOBAL_METRICS)
    passed += fits
    problems += short
    fits, short = _regional_lines(api, cfg, vms)
    passed += fits
    problems += short
    if not cfg.image:
        fits, short = _image_lines(api, cfg)
        passed += fits
        problems += short
    fits, short = _firewall_lines(api, cfg, vms)
    passed += fits
    problems += short
    fits, short = account_lines(api, cfg, info, os_login)  # OS Login 2FA, the VMs' account
    passed += fits
    problems += short
    if cfg.storage:
        from provisioning.gce.storage import bucket_problem

        problem = bucket_problem(cfg.storage, cfg=cfg)
        if problem is not None:
            problems.append(f"provider.storage: {problem}")
        else:
            passed.append(f"bucket of {cfg.storage} exists and takes a write")
    return PreflightResult(problems, os_login, passed)


def family_line(family: str) -> tuple[str, str | None]:
    """(product, OS release) of an image family's name: `common-cu129-ubuntu-2404-nvidia-580`
    -> ("common", "ubuntu-2404"); families of one line differ only in CUDA and driver."""
    found = re.search(r"(?:ubuntu|debian|rocky|centos)-\d+", family)
    return family.split("-", 1)[0], found[0] if found else None


def newest_family_of_line(api: Any, image_project: str, family: str
                          ) -> tuple[bool, tuple[str, str] | None]:
    """(whether `family` has images, all deprecated; (family, image) of the newest image that
    is not deprecated among the other families of its line, or None), from one filtered
    images.list of `image_project`."""
    product, release = family_line(family)
    line = f"{re.escape(product)}-.*{release}.*" if release else f"{re.escape(product)}-.*"
    images = api.list_images(image_project, f'family eq "{line}"')  # the API's RE2 form
    retired = any(i.family == family for i in images)
    live = [i for i in images if not i.deprecated and i.family != family
            and family_line(i.family) == (product, release)]
    if not live:
        return retired, None
    newest = max(live, key=lambda i: i.created)
    return retired, (newest.family, newest.name)


def _image_lines(api: Any, cfg: GceConfig) -> tuple[list[str], list[str]]:
    """(fits, short) for `provider.image_family`: it resolves (getFromFamily answers 404 once
    every image of a family is deprecated: Deep Learning VM families retire at their end of
    availability), and `provider.boot_disk_gb` holds its image. On a 404 the newest family of
    the same line is named, so the line says what to set."""
    family, project = cfg.image_family, cfg.image_project
    try:
        image = api.image_from_family(project, family)
    except BadRequestError as error:
        hint = (f"list the families with gcloud compute images list --project {project} "
                "--no-standard-images")
        try:
            retired, newest = newest_family_of_line(api, project, family)
        except ProvisionError:  # listing not allowed: the generic hint
            retired, newest = False, None
        if newest is not None:
            why = "retired: every image of it is deprecated" if retired else "no such family"
            hint = (f"{why}; the newest family of its line is {newest[0]} (image "
                    f"{newest[1]}): set provider.image_family={newest[0]}")
        return [], [f"provider.image_family: {error} ({hint})"]
    except ProvisionError as error:
        return [], [f"provider.image_family: cannot resolve {family}: {error}"]
    fits = [f"image family {family} (project {project}) resolves to {image.name}"]
    if image.disk_gb and cfg.boot_disk_gb < image.disk_gb:
        return fits, [f"provider.boot_disk_gb: {cfg.boot_disk_gb} GB is smaller than image "
                      f"{image.name} ({image.disk_gb} GB), which GCE refuses: set it to at "
                      f"least {image.disk_gb}"]
    return fits, []


def network_of(cfg: GceConfig, project: str) -> tuple[str, str]:
    """(project, name) of `provider.network` (`global/networks/N`, or a full
    `projects/P/global/networks/N` of a shared VPC)."""
    found = re.search(r"projects/([^/]+)/global/networks/([^/]+)$", cfg.network)
    return (found[1], found[2]) if found else (project, cfg.network.rsplit("/", 1)[-1])


def _firewall_lines(api: Any, cfg: GceConfig, vms: Sequence[VmRequest]
                    ) -> tuple[list[str], list[str]]:
    """(fits, short) for SSH to the VMs and the trainer ports between them
    (`firewall.py`): `provider.trainer_port` and one more port per further role on a VM."""
    from provisioning.gce.firewall import firewall_lines

    project, network = network_of(cfg, api.project)
    try:
        found = api.effective_firewalls(project, network)
    except ProvisionError as error:
        from google.api_core import exceptions as gexc

        text = " ".join(str(error).split())
        if isinstance(error.__cause__, gexc.Forbidden):  # a role without the read: not judged
            return [f"firewall of network {network}: not checked ({text})"], []
        return [], [f"provider.network: cannot read the firewall of network {network} "
                    f"(project {project}): {text}"]
    roles = max((len(vm.host_ids) for vm in vms), default=1)
    ports = [cfg.trainer_port + i for i in range(roles)]
    return firewall_lines(found, network, cfg.tags, ports, cfg.inside_vpc)


def _regional_lines(api: Any, cfg: GceConfig, vms: Sequence[VmRequest]
                    ) -> tuple[list[str], list[str]]:
    """(fits, short) for the regions the VMs go to first; nothing short when another region of
    `provider.zones` can hold the whole cluster (then a line saying the fallback goes there)."""
    cache: dict[str, dict[str, tuple[float, float]] | str] = {}

    def quotas(region: str) -> dict[str, tuple[float, float]] | str:
        if region not in cache:
            try:
                cache[region] = api.region_quotas(region)
            except ProvisionError as error:
                cache[region] = f"cannot read the quotas of region {region}: {error}"
        return cache[region]

    def region_lines(region: str, members: Sequence[VmRequest]) -> tuple[list[str], list[str]]:
        found = quotas(region)
        if isinstance(found, str):
            return [], [f"provider.zones: {found}"]
        demand: Counter[str] = Counter()
        for vm in members:
            demand.update(vm_demand(vm, cfg, found))
        regional = [m for m in demand if m not in GLOBAL_METRICS]
        return quota_lines(demand, found, f"in region {region}", regional)

    first: dict[str, list[VmRequest]] = {}
    for vm in vms:
        first.setdefault(region_of(vm.zone), []).append(vm)
    fits: list[str] = []
    short: list[str] = []
    for region, members in first.items():
        ok, lacking = region_lines(region, members)
        fits += ok
        short += lacking
    if not short:
        return fits, []
    for region in dict.fromkeys(region_of(z) for z in cfg.zones):
        if region in first:
            continue
        ok, lacking = region_lines(region, vms)
        if not lacking:  # the whole cluster fits there: the zone fallback can move it
            return [f"quotas of region {region} hold the whole cluster, those of "
                    f"{', '.join(first)} do not: the zone fallback moves it there", *ok], []
    return fits, short
