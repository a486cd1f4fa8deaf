"""The `sim` backend: hosts that exist only inside a simulation (``provider=sim``).

Nothing is started: ``orchestrator.simulate`` plays the run as a discrete-event simulation and
uses this provider only for what the recovery decision code asks of a provider (acquire,
replace, release), so the very same :mod:`orchestrator.transient.recovery` code runs against
simulated hosts. A host's endpoint is ``sim:<index>`` (unique per slot; a replacement keeps it,
as on a real backend).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from provisioning.base import (
    BadRequestError,
    Cluster,
    ClusterRequest,
    Host,
    HostId,
    HostRunner,
    HostState,
    Provider,
)
from provisioning.registry import register_provider

SIM_ADDRESS = "sim"


class SimProvider(Provider):
    """In-memory hosts; ``runner`` refuses, because a simulated host runs no process."""

    name = "sim"
    billed = False  # simulated: the cost is what the cluster would cost, nothing is billed

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._state: dict[HostId, HostState] = {}

    def acquire(self, request: ClusterRequest) -> Cluster:
        hosts = []
        for port, spec in enumerate(request.hosts):
            host_id = f"{request.run_id}-{spec.name}-{next(self._ids)}"
            hosts.append(Host(host_id, spec, SIM_ADDRESS, port, request.workdir / spec.name))
            self._state[host_id] = HostState.RUNNING
        return Cluster(request.run_id, hosts)

    def runner(self, host: Host) -> HostRunner:
        raise BadRequestError("provider sim starts no process: the run is simulated by "
                              "orchestrator.simulate")

    def poll(self, cluster: Cluster) -> dict[HostId, HostState]:
        return {h.id: self._state.get(h.id, HostState.REVOKED) for h in cluster.hosts}

    def replace(self, cluster: Cluster, lost: Sequence[HostId]) -> Cluster:
        lost_ids = set(lost)
        for host_id in lost_ids:
            cluster.host(host_id)  # KeyError for a stranger
        hosts = []
        for host in cluster.hosts:
            if host.id in lost_ids:
                self._state[host.id] = HostState.REVOKED
                new_id = f"{cluster.run_id}-{host.spec.name}-{next(self._ids)}"
                host = Host(new_id, host.spec, host.address, host.port, host.workdir)
                self._state[new_id] = HostState.RUNNING
            hosts.append(host)
        return Cluster(cluster.run_id, hosts)

    def release(self, cluster: Cluster) -> None:
        for host in cluster.hosts:
            if self._state.get(host.id) == HostState.RUNNING:
                self._state[host.id] = HostState.TERMINATED

    def revoke(self, host: Host, notice_s: float = 0.0) -> None:
        """Mark the host revoked (the simulation clock handles the notice)."""
        self._state[host.id] = HostState.REVOKED


register_provider("sim", SimProvider)
