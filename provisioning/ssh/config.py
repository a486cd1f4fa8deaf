"""`provider=ssh` options: a static inventory of machines reached over SSH, and how to use them.

Stored in Hydra's ConfigStore as `ssh_schema` by the registry; `conf/provider/ssh.yaml` is the
commented example. `check()` is the semantic validation the type schema cannot make (run
before anything is provisioned, so a wrong key path is a one-line config error).
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provisioning.base import STOP_GRACE_S, HostSpec, ProviderConfig, machine_file_unchecked
from provisioning.catalog import PricingConfig

#: Where hosts install the trainer's dependencies from, by default: the public package index.
DEFAULT_INDEX_URL = "https://pypi.org/simple"


@dataclass
class SshHostConfig:
    """One machine of the inventory."""

    name: str = ""  # inventory name, used by `placement` and in messages
    address: str = ""  # hostname or IP: the orchestrator connects to it, roles serve gRPC on it
    port: int = 22  # sshd port
    user: str | None = None  # login user; None = the orchestrator's user
    key_path: str = "~/.ssh/id_ed25519"  # private key file on the orchestrator (never sent)
    root: str = ".transient"  # host directory for environments and runs (relative: to $HOME)
    python: str | None = None  # interpreter whose env has the trainer's deps; None = install them
    labels: dict[str, str] = field(default_factory=dict)  # e.g. {gpu: T4}: roles wanting a GPU type
    spare: bool = False  # only used to replace lost machines, never placed at start

    def login(self) -> str:
        return self.user or getpass.getuser()

    def key_file(self) -> Path:
        return Path(os.path.expanduser(self.key_path))

    def gpu(self) -> str | None:
        """The GPU `labels.gpu` names, spelled as the catalog spells GPUs (`gpu_name`)."""
        label = self.labels.get("gpu")
        return None if label is None else gpu_name(str(label))


@dataclass
class SshProviderConfig(ProviderConfig):
    """`provider=ssh`: roles run on the inventory's machines over SSH (paramiko)."""

    name: str = "ssh"
    hosts: list[SshHostConfig] = field(default_factory=list)  # the inventory
    placement: dict[str, str] = field(default_factory=dict)  # plan host (ps-0) -> inventory name
    known_hosts: str = "~/.ssh/known_hosts"  # host keys checked (and pinned) here
    trust_on_first_use: bool = False  # accept and pin an unknown host key (recorded)
    connect_timeout_s: float = 10.0  # TCP connect, SSH banner and auth, each
    command_timeout_s: float = 60.0  # one short remote command (setup installs get longer)
    heartbeat_interval_s: float = 2.0  # liveness check of every machine
    heartbeat_timeout_s: float = 6.0  # unanswered this long = connection dropped (reconnected)
    unreachable_grace_s: float = 60.0  # dropped while other machines answer: lost after this
    outage_grace_s: float = 300.0  # no machine answers (our own network): lost after this
    max_parallel_handshakes: int = 8  # below sshd's MaxStartups (10)
    first_port: int = 23400  # roles on a machine listen on first_port, first_port + 1, ...
    index_url: str | None = DEFAULT_INDEX_URL  # hosts without `python` install from it, on the host
    wheelhouse: str | None = None  # local dir of wheels for hosts without an index (wins if set)
    extra: str = "cpu"  # TensorFlow build hosts without `python` install (cpu, gpu)
    stop_grace_s: float = STOP_GRACE_S  # SIGTERM-to-SIGKILL grace when roles are stopped

    def contact_grace_s(self) -> float:
        return max(self.unreachable_grace_s, self.outage_grace_s)

    def check(self) -> list[tuple[str, str]]:
        """(field, problem) for every semantic mistake, fields as the user types them."""
        problems: list[tuple[str, str]] = []
        if not self.hosts:
            problems.append(("provider.hosts", "the inventory is empty; list at least one "
                             "machine (name, address, key_path)"))
        names: set[str] = set()
        addresses: dict[str, int] = {}  # one machine per address: see same_address
        for i, host in enumerate(self.hosts):
            where = f"provider.hosts.{i}"
            if not host.name:
                problems.append((f"{where}.name", "must be set"))
            elif host.name in names:
                problems.append((f"{where}.name", f"duplicate name {host.name!r}"))
            names.add(host.name)
            if not host.address:
                problems.append((f"{where}.address", "must be set"))
            elif same_address(host.address) in addresses:
                first = addresses[same_address(host.address)]
                problems.append((f"{where}.address", (
                    f"{host.address!r} is also provider.hosts.{first}.address: roles on both "
                    f"would serve gRPC on the same address and ports (from "
                    f"provider.first_port={self.first_port}); give each inventory machine its "
                    "own address")))
            else:
                addresses[same_address(host.address)] = i
            if not 0 < host.port < 65536:
                problems.append((f"{where}.port", f"{host.port} is not a TCP port"))
            key = host.key_file()
            if machine_file_unchecked(f"{where}.key_path"):
                pass
            elif not key.is_file():
                problems.append((f"{where}.key_path", f"no such key file {str(key)!r}"))
            elif not os.access(key, os.R_OK):
                problems.append((f"{where}.key_path", f"key file {str(key)!r} is not readable"))
        for role, target in self.placement.items():
            if target not in names:
                problems.append((f"provider.placement.{role}",
                                 f"{target!r} is not an inventory host ({', '.join(sorted(names))})"))
        if not self.trust_on_first_use \
                and not Path(os.path.expanduser(self.known_hosts)).is_file() \
                and not machine_file_unchecked("provider.known_hosts"):
            problems.append(("provider.known_hosts",
                             f"no such file {self.known_hosts!r}: host keys are checked against it "
                             "(or set provider.trust_on_first_use=true to pin them on first use)"))
        for name in ("connect_timeout_s", "command_timeout_s", "heartbeat_interval_s",
                     "heartbeat_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append((f"provider.{name}", "must be > 0"))
        if self.max_parallel_handshakes < 1:
            problems.append(("provider.max_parallel_handshakes", "must be >= 1"))
        if not 1024 <= self.first_port < 65000:
            problems.append(("provider.first_port", "must be in 1024..64999"))
        problems += runtime_install_problems(self.index_url, self.wheelhouse, self.extra,
                                             any(h.python is None for h in self.hosts))
        return problems

    def check_plan(self, hosts: Sequence[HostSpec], catalog: PricingConfig) -> list[tuple[str, str]]:
        """GPU labels the catalog does not know (a typo would keep GPU roles off the machine),
        and an inventory whose non-spare machines cannot hold the plan's machines (placed as
        `SshProvider.acquire` places them), before anything connects."""
        problems: list[tuple[str, str]] = []
        for i, host in enumerate(self.hosts):
            if host.gpu() is not None and host.gpu() not in catalog.gpus:
                problems.append((f"provider.hosts.{i}.labels.gpu", (
                    f"{host.labels['gpu']!r} names no GPU of catalog '{catalog.name}' (one of: "
                    f"{', '.join(catalog.gpus)}, in any case, e.g. T4 or nvidia-tesla-t4)")))
        owners = [s for s in hosts if s.colocate_with is None]
        pinned = {s.name: self.placement[s.name] for s in owners if s.name in self.placement}
        _, unplaced = assign(self.hosts, [(s.name, s.gpu) for s in owners if s.name not in pinned],
                             set(pinned.values()), spare_ok=False)
        spare = sum(h.spare for h in self.hosts)
        if unplaced and not problems and len(self.hosts) - spare < len(owners):
            problems.append(("provider.hosts", (
                f"{len(self.hosts) - spare} machines are not spare ({spare} spare), the plan "
                f"places {len(owners)} ({', '.join(s.name for s in owners)}): list more "
                "machines, or set spare: false on some")))
        elif unplaced and not problems:
            gpus = sorted({s.gpu for s in owners if s.name in unplaced and s.gpu}) or ["any"]
            problems.append(("provider.hosts", (
                f"no free non-spare machine labelled gpu: {' or '.join(gpus)} (or unlabelled) "
                f"for {', '.join(unplaced)}: label a machine with its GPU, or add one")))
        return problems


def runtime_install_problems(index_url: str | None, wheelhouse: str | None, extra: str,
                             needed: bool) -> list[tuple[str, str]]:
    """The keys of the hosts' runtime install (`provider.index_url`, `wheelhouse`, `extra`),
    shared by provider=ssh and provider=gce; `needed`: some host has no `python` of its own."""
    problems: list[tuple[str, str]] = []
    if index_url is not None and not index_url.startswith(("http://", "https://")):
        problems.append(("provider.index_url", f"{index_url!r} is not an http(s) URL of a "
                         "package index (e.g. https://pypi.org/simple)"))
    if extra not in ("cpu", "gpu"):
        problems.append(("provider.extra", f"{extra!r}: must be cpu or gpu"))
    if needed and not index_url and wheelhouse is None:
        problems.append(("provider.index_url", "null, and provider.wheelhouse is not set "
                         "either: a host without `python` installs the trainer's dependencies "
                         "from a package index or from a wheelhouse"))
    return problems


def same_address(address: str) -> str:
    """``address`` as one machine's key: case and an IP's spelling do not matter, and every
    loopback name is this machine. Two inventory entries with the same key would be given the
    same gRPC ports (each machine counts its ports from `first_port`), so roles clash."""
    text = address.strip().lower().strip("[]")
    if text == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text.rstrip(".")  # a host name (a trailing dot is the same name)
    return "loopback" if ip.is_loopback else str(ip)


def gpu_name(label: str) -> str:
    """An inventory GPU label as the catalog names GPUs (lower case, no vendor prefix):
    `T4`, `t4`, `nvidia-tesla-t4` (GCE's accelerator type) and `NVIDIA Tesla T4` are all `t4`."""
    name = re.sub(r"[\s_]+", "-", label.strip().lower())
    for prefix in ("nvidia-", "tesla-"):
        name = name.removeprefix(prefix)
    return name


def assign(hosts: Sequence[SshHostConfig], wanted: Sequence[tuple[str, str | None]],
           taken: Collection[str], spare_ok: bool) -> tuple[dict[str, SshHostConfig], list[str]]:
    """Inventory machines for (host name, catalog GPU or None) pairs, none of `taken` and no
    spare unless `spare_ok`: ({host name: machine}, names left without one). Hosts wanting a
    GPU go first, to a machine labelled with it, else an unlabelled one; hosts without one
    prefer unlabelled machines, so they do not take the GPU machines the others need."""
    free = [h for h in hosts if h.name not in taken and (spare_ok or not h.spare)]
    placed: dict[str, SshHostConfig] = {}
    unplaced: list[str] = []
    for name, gpu in sorted(wanted, key=lambda w: w[1] is None):
        choice = next((h for h in free if h.gpu() == gpu), None) or next(
            (h for h in free if h.gpu() != gpu and (gpu is None or h.gpu() is None)), None)
        if choice is None:
            unplaced.append(name)
        else:
            placed[name] = choice
            free.remove(choice)
    return placed, unplaced
