"""The in-memory backend of provider=sim keeps the launch contract (provisioning/base.py)."""

from pathlib import Path

from provisioning.base import ClusterRequest, HostSpec, HostState, Role
from provisioning.registry import backend, get_provider
from provisioning.sim import SimProvider, SimProviderConfig


def _cluster(provider: SimProvider):
    return provider.acquire(ClusterRequest("r", [
        HostSpec("ps-0", Role.PS), HostSpec("worker-0", Role.WORKER),
        HostSpec("chief-0", Role.CHIEF, colocate_with="ps-0")], Path("/tmp/r")))


def test_registered_with_its_typed_config() -> None:
    found = backend("sim")
    assert found.config is SimProviderConfig and found.provider is SimProvider
    provider = get_provider("sim", {"name": "sim"})
    assert isinstance(provider, SimProvider) and provider.can_revoke and not provider.billed


def test_replace_keeps_or_drops_endpoints() -> None:
    provider = SimProvider()
    cluster = _cluster(provider)
    worker = cluster.hosts_for(Role.WORKER)[0]
    kept = provider.replace(cluster, [worker.id])
    new = kept.hosts_for(Role.WORKER)[0]
    assert new.id != worker.id and new.endpoint == worker.endpoint
    moved = provider.replace(kept, [new.id], keep_endpoints=False).hosts_for(Role.WORKER)[0]
    assert moved.endpoint != new.endpoint
    assert provider.poll(cluster)[worker.id] != HostState.RUNNING  # the lost host was released


def test_colocated_host_goes_and_comes_back_with_its_machine() -> None:
    provider = SimProvider()
    cluster = _cluster(provider)
    ps, chief = cluster.hosts_for(Role.PS)[0], cluster.hosts_for(Role.CHIEF)[0]
    assert chief.machine == ps.id and chief.address == ps.address and chief.port != ps.port
    provider.revoke(ps)
    states = provider.poll(cluster)
    assert states[ps.id] == states[chief.id] == HostState.REVOKED
    assert states[cluster.hosts_for(Role.WORKER)[0].id] == HostState.RUNNING
    after = provider.replace(cluster, [ps.id], keep_endpoints=False)
    new_ps, new_chief = after.hosts_for(Role.PS)[0], after.hosts_for(Role.CHIEF)[0]
    assert new_chief.id != chief.id and new_chief.machine == new_ps.id
    assert set(provider.poll(after).values()) == {HostState.RUNNING}
