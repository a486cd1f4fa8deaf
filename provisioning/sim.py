"""The `sim` backend: hosts that exist only inside a simulation (``provider=sim``).

Nothing is started: ``orchestrator.simulate`` plays the run as a discrete-event simulation and
uses this provider only for what the recovery decision code asks of a provider (acquire,
replace, release), so the very same :mod:`orchestrator.transient.recovery` code runs against
simulated hosts. A host's endpoint is ``sim:<index>`` (unique per machine; a replacement keeps it
when asked to, as on a real backend, and gets a fresh one otherwise). A colocated host shares its
owner's machine: same address, its own port, lost and replaced with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioning.base import (
    BadRequestError,
    Cluster,
    ClusterRequest,
    Host,
    HostId,
    HostRunner,
    HostSpec,
    HostState,
    Provider,
    ProviderConfig,
    ResourceJournal,
)
from provisioning.catalog import Market, PricingConfig
from provisioning.registry import register_provider

SIM_ADDRESS = "sim"


@dataclass
class SimProviderConfig(ProviderConfig):
    """`provider=sim`: nothing is provisioned (the simulation's own knobs are `sim.*`,
    `orchestrator/config/simulate.py`). `ready_timeout_s` is kept for the common schema and
    unused: no role starts."""

    name: str = "sim"


class SimProvider(Provider):
    """In-memory hosts; ``runner`` refuses, because a simulated host runs no process.
    ``revoke`` marks the machine revoked at once: the simulation's clock plays the notice."""

    name = "sim"
    can_revoke = True
    simulated = True
    billed = False  # simulated: the cost is what the cluster would cost, nothing is billed

    @classmethod
    def transient_market(cls, pricing: PricingConfig) -> Market:
        """The simulated cloud sells transient VMs as the priced one does (preemptible in the
        papers' 2019 catalog, Spot in today's)."""
        return Market(pricing.transient_market)

    def __init__(self, config: SimProviderConfig | None = None, *,
                 journal: ResourceJournal | None = None) -> None:
        self.config = config or SimProviderConfig()
        self._ids = itertools.count()
        self._ports = itertools.count()  # one endpoint per host ever made: never reused
        self._state: dict[HostId, HostState] = {}
        self._revoked_machines: set[HostId] = set()

    def _new_host(self, run_id: str, spec: HostSpec, workdir: Path, owner: Host | None,
                  port: int | None = None) -> Host:
        host_id = f"{run_id}-{spec.name}-{next(self._ids)}"
        self._state[host_id] = HostState.RUNNING
        port = next(self._ports) if port is None else port
        if owner is None:
            return Host(host_id, spec, SIM_ADDRESS, port, workdir / spec.name)
        return Host(host_id, spec, owner.address, port, owner.workdir, machine=owner.id)

    def acquire(self, request: ClusterRequest) -> Cluster:
        hosts: list[Host] = []
        by_name: dict[str, Host] = {}
        for spec in request.hosts:
            owner = by_name.get(spec.colocate_with or "")
            host = self._new_host(request.run_id, spec, request.workdir, owner)
            by_name[spec.name] = host
            hosts.append(host)
        return Cluster(request.run_id, hosts)

    def runner(self, host: Host) -> HostRunner:
        raise BadRequestError("provider sim starts no process: the run is simulated by "
                              "orchestrator.simulate")

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        return {h.id: HostState.REVOKED if h.machine in self._revoked_machines
                else self._state.get(h.id, HostState.REVOKED) for h in cluster.hosts}

    def replace(self, cluster: Cluster, lost: Sequence[HostId],
                keep_endpoints: bool = True) -> Cluster:
        lost_ids = set(cluster.same_machine(list(lost)))  # KeyError for a stranger
        hosts: list[Host] = []
        new_by_name: dict[str, Host] = {}
        for host in cluster.hosts:
            if host.id in lost_ids:
                if self._state.get(host.id) == HostState.RUNNING:
                    self._state[host.id] = HostState.TERMINATED  # released
                owner = new_by_name.get(host.spec.colocate_with or "")
                host = self._new_host(cluster.run_id, host.spec, host.workdir.parent, owner,
                                      host.port if keep_endpoints else None)
                new_by_name[host.spec.name] = host
            hosts.append(host)
        return Cluster(cluster.run_id, hosts)

    def release(self, cluster: Cluster) -> None:
        for host in cluster.hosts:
            if self._state.get(host.id) == HostState.RUNNING:
                self._state[host.id] = HostState.TERMINATED

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        """Mark the host's machine revoked, with every host on it (the simulation's clock plays
        the notice)."""
        self._revoked_machines.add(host.machine)


register_provider(SimProvider.name, SimProvider, SimProviderConfig)
