"""The GCE backend's data model: one VM of a run from before its insert to after its delete
(`Vm`), how GCE's raw states map onto the contract's, and the names of the files a run keeps
(where its VMs landed, their pinned host keys). Read by the verbs (`provider.py`) and the
instance code (`instance.py`)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from provisioning.base import Host, HostSpec, HostState
from provisioning.gce.body import VmRequest, label_value
from provisioning.gce.ssh import VmSsh
from provisioning.journal import read_process_start_ticks

#: Raw GCE instance status -> HostState, for VMs we have not asked to delete. Anything stopping,
#: stopped or gone without our asking is a revocation (a Spot preemption, a maintenance event).
STATE_MAP: dict[str, HostState] = {
    "PROVISIONING": HostState.PENDING, "STAGING": HostState.PENDING,
    "PENDING": HostState.PENDING, "REPAIRING": HostState.PENDING,
    "RUNNING": HostState.RUNNING,
    "PENDING_STOP": HostState.REVOKED, "STOPPING": HostState.REVOKED,
    "SUSPENDING": HostState.REVOKED, "SUSPENDED": HostState.REVOKED,
    "TERMINATED": HostState.REVOKED, "STOPPED": HostState.REVOKED,
    "DEPROVISIONING": HostState.REVOKED,
}
KNOWN_HOSTS_FILE = "known_hosts"
PLACEMENT_FILE = "placement.json"  # where a run's VMs landed (zone per VM), in its run dir


@dataclass
class Vm:
    """One VM of a run, from before its insert to after its delete."""

    request: VmRequest
    run_id: str
    slot: str  # plan name of the VM's first host (ps-0, worker-3), stable across replacements
    specs: list[HostSpec]
    internal_ip: str = ""
    external_ip: str = ""
    host_keys: list[tuple[str, str]] | None = None
    created: bool = False  # its insert may have succeeded: delete it on release
    deleted: bool = False  # we deleted it (or it never came to exist)
    revoked_reason: str | None = None
    ssh: VmSsh | None = None  # the SSH side, once RUNNING (connects on first runner())
    zone_hint: str | None = None  # tried before the hosts' plan zone (a replacement's slot)
    hosts: list[Host] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def zone(self) -> str:
        return self.request.zone


def address_held(error: BaseException) -> bool:
    """The requested internal IP is still held by a VM that is going away."""
    text = str(error)
    return "already being used" in text or "ipInUseByAnotherResource" in text \
        or "IP_IN_USE" in text


def owner_labels() -> dict[str, str]:
    """Who created a VM: this machine and process, so `orchestrator.gc` can tell a live run."""
    pid = os.getpid()
    return {"owner-host": label_value(socket.gethostname()), "owner-pid": str(pid),
            "owner-start": str(read_process_start_ticks(pid) or 0)}
