"""The cluster's hosts as the plan lays them out: the first step of a plan, and what the
provider's plan checks read (validation imports this, not the whole planner)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.config.schema import ExperimentConfig
from provisioning.base import HostSpec
from trainer.layout import ROLE_CHIEF, ROLE_EVALUATOR, ROLE_PS, ROLE_WORKER

__all__ = ["HostPlan", "host_specs", "plan_hosts"]


@dataclass
class HostPlan:
    """One server of the cluster and what it costs."""

    name: str  # e.g. worker-3
    role: str  # ps | worker | chief | evaluator
    index: int
    gpu: str | None
    zone: str | None
    machine_type: str
    transient: bool
    hourly_usd: float  # 0 for a colocated role: its machine is priced once, on its owner
    colocate_with: str | None = None  # the host whose machine it shares (chief_on_ps: ps-0)



def host_specs(hosts: list[HostPlan]) -> list[HostSpec]:
    """Planned hosts as the provider is asked for them (validation checks them against it)."""
    return [HostSpec(name=h.name, role=h.role, machine_type=h.machine_type, gpu=h.gpu,
                     zone=h.zone, transient=h.transient, colocate_with=h.colocate_with)
            for h in hosts]


def plan_hosts(cfg: ExperimentConfig) -> list[HostPlan]:
    """Expand the cluster into hosts: PS, workers (group by group), chief, evaluator."""
    c, catalog = cfg.cluster, cfg.pricing
    groups = list(c.worker_groups)
    if c.workers is not None:  # the homogeneous shorthand wins over the group's count
        groups = [replace(groups[0], count=c.workers)]
    first_zone = _zone_for(groups[0].gpu, groups[0].zone, cfg)
    hosts: list[HostPlan] = []

    def add(role: str, index: int, gpu: str | None, zone: str | None, machine: str,
            transient: bool, colocated: bool = False) -> None:
        if colocated:  # shares the first PS's machine (its own port): priced once, there
            owner = hosts[0]
            hosts.append(HostPlan(f"{role}-{index}", role, index, owner.gpu, owner.zone,
                                  owner.machine_type, owner.transient, 0.0, owner.name))
            return
        price = catalog.hourly_price(machine, gpu, transient, zone)
        hosts.append(HostPlan(f"{role}-{index}", role, index, gpu, zone, machine, transient,
                              round(price, 6)))

    for i in range(c.parameter_servers):
        add(ROLE_PS, i, None, c.ps_zone or first_zone, c.ps_machine_type, c.ps_transient)
    index = 0
    for group in groups:
        zone = _zone_for(group.gpu, group.zone, cfg)
        for _ in range(group.count):
            add(ROLE_WORKER, index, group.gpu, zone, group.machine_type, group.transient)
            index += 1
    on_ps = c.chief_on_ps
    chief_transient = c.ps_transient if on_ps else c.chief_transient
    add(ROLE_CHIEF, 0, None, c.ps_zone or first_zone, c.chief_machine_type, chief_transient, on_ps)
    if c.evaluator:
        add(ROLE_EVALUATOR, 0, None, c.ps_zone or first_zone, c.chief_machine_type,
            chief_transient, on_ps)
    return hosts


def _zone_for(gpu: str | None, zone: str | None, cfg: ExperimentConfig) -> str | None:
    if zone is not None or gpu is None:
        return zone
    return cfg.pricing.zones_for(gpu)[0]
