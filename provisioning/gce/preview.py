"""What `provider=gce` would create for a plan, for the dry run: VMs grouped by zone.

Reads the planned hosts only (no Google libraries, no credentials): colocated roles
(`colocate_with`) join their owner's VM, GPUs are shown as attached or built in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioning.gce.body import ATTACHED_GPUS, built_in_gpu


@dataclass
class VmPreview:
    slot: str  # plan name of the VM's first host
    zone: str
    machine_type: str
    gpu: str  # "t4 (attached)", "1× l4 (built in)" or "-"
    spot: bool
    hosts: list[str] = field(default_factory=list)


def preview_vms(hosts: Sequence[Any], fallback_zones: Sequence[str] = ()) -> list[VmPreview]:
    """One entry per VM, in plan order. `hosts` are plan hosts (name, gpu, zone, machine_type,
    transient, colocate_with); a host without a zone goes to the first fallback zone."""
    vms: dict[str, VmPreview] = {}
    for host in hosts:
        owner = getattr(host, "colocate_with", None)
        if owner in vms:
            vms[owner].hosts.append(host.name)
            continue
        machine = str(host.machine_type)
        fixed = built_in_gpu(machine)
        if fixed is not None:
            gpu = f"{fixed[1]}× {fixed[0]} (built in)"
        elif host.gpu in ATTACHED_GPUS:
            gpu = f"{host.gpu} (attached)"
        else:
            gpu = host.gpu or "-"
        zone = host.zone or (fallback_zones[0] if fallback_zones else "?")
        vms[host.name] = VmPreview(host.name, zone, machine, gpu, bool(host.transient),
                                   [host.name])
    return list(vms.values())
