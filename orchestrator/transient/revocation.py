"""Revocation models: which servers are revoked when, as a seeded, reproducible plan.

A model (``revocation.model``) turns the run's hosts into :class:`RevocationEvent` records; a
:class:`RevocationSchedule` hands them to the run loop as they fall due. Models are small
classes registered by name (:func:`get_revocation_model` lists the valid names on error).

Clocks: ``at_s`` is *run time* in seconds since the chief's ``train_start``. The event time is
when the revocation *begins*: the run loop then calls ``provider.revoke(host, notice_s)``, which
delivers the notice (if any) and kills the host ``notice_s`` later. Lifetime models draw a
lifetime on the *cloud clock* (hours) and map it to run time with ``time_scale``
(1 run second = ``time_scale`` cloud seconds), so a 24 h trace can play out in minutes.

Reproducibility: every host slot and generation has its own random stream, seeded from
``(seed, model, host name, generation)``. Adding a worker or replacing one does not change the
draws of the others. Python's ``random.Random`` seeds a string through SHA-512, independent of
``PYTHONHASHSEED``.

Fitted-model files (``revocation.model_file``): the JSON (or YAML) that
``python -m analysis lifetimes --export FILE`` writes, schema_version 1::

    {"schema_version": 1, "cap_hours": 24.0,
     "gpus": {"K80": {"all": M, "us-west1": M, ...}, ...}}
    M = {"empirical_cdf": {"hours": [0, 1, ..., 24], "cdf": [0, ..., 0.46]},
         "exponential": {"rate_per_h": r}, "weibull": {"lambda_h": l, "rho": k}}

It is read here directly, so the orchestrator needs neither pandas nor lifelines.
"""

from __future__ import annotations

import abc
import bisect
import csv
import functools
import hashlib
import json
import random
import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from orchestrator.config.errors import ConfigError
from orchestrator.config.transient import RevocationConfig, RevocationModel, TraceSampling
from orchestrator.paths import REFERENCE_DATA_DIR
from provisioning import catalog
from trainer import layout
from trainer.registry import Registry

#: CM-DARE's per-region lifetimes of 396 preemptible GPU VMs (hour bins, 24 h cap).
LIFETIMES_CSV = REFERENCE_DATA_DIR / "cmdare/derived/lifetimes_by_region.csv"
#: GCE stopped every preemptible VM after this long: a lifetime at the cap is "not revoked".
TRACE_CAP_H = 24.0
#: GPU whose lifetimes a CPU-only host (local runs) uses: CM-DARE's largest sample (156 VMs).
DEFAULT_TRACE_GPU = "K80"
#: Key of the pooled (all regions) entry in a fitted-model file.
POOLED_REGION = "all"
ROLES = layout.ROLES
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")


class HostLike(Protocol):
    """What a model needs of a host: ``provisioning.HostSpec`` and ``plan.HostPlan`` fit."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def gpu(self) -> str | None: ...
    @property
    def zone(self) -> str | None: ...
    @property
    def transient(self) -> bool: ...


@dataclass(frozen=True)
class RevocationEvent:
    """One planned revocation. Exactly one of ``at_s`` / ``at_step`` is set.

    ``host_name`` None = any eligible live host of ``role``, chosen (seeded) when it falls due.
    ``lifetime_h`` is the cloud-clock lifetime drawn by a lifetime model (None for schedules).
    """

    host_name: str | None
    role: str
    at_s: float | None
    at_step: int | None
    notice_s: float
    model: str
    lifetime_h: float | None = None

    def to_record(self) -> dict[str, Any]:
        """Fields for an ``events.jsonl`` line (the ``host`` key names the slot)."""
        record = asdict(self)
        record["host"] = record.pop("host_name")
        return record


def zone_to_region(zone: str | None) -> str | None:
    """``us-west1-b`` → ``us-west1``; a region (or ``local``) passes through; None stays None."""
    if zone is None:
        return None
    match = _ZONE_RE.match(zone)
    return match.group(1) if match else zone


def is_revocable(host: HostLike, cfg: RevocationConfig) -> bool:
    """Transient hosts are; PS and chief also when ``include_ps`` / ``include_chief`` say so."""
    role = str(host.role)
    return bool(
        host.transient
        or (role == layout.ROLE_PS and cfg.include_ps)
        or (role == layout.ROLE_CHIEF and cfg.include_chief)
    )


# --- the model registry -------------------------------------------------------------------


_MODELS: Registry[type[RevocationModelBase]] = Registry("revocation model")


def register_revocation_model(cls: type[RevocationModelBase]) -> type[RevocationModelBase]:
    """Class decorator: make ``cls`` selectable as ``revocation.model=<cls.name>``."""
    return _MODELS.register(cls.name, cls)


def get_revocation_model(cfg: RevocationConfig) -> RevocationModelBase:
    """The model named by ``cfg.model``, built from ``cfg``.

    Raises ConfigError naming the valid models, or what the model itself rejects (a model file
    that cannot be read)."""
    name = str(cfg.model)
    if name not in _MODELS:
        raise ConfigError("revocation.model", f"unknown model '{name}'",
                          "one of: " + ", ".join(_MODELS.names()))
    return _MODELS.get(name)(cfg)


class RevocationModelBase(abc.ABC):
    """Turns hosts into planned revocations. Pure: the same config and hosts give the same plan."""

    name: ClassVar[str]

    def __init__(self, cfg: RevocationConfig) -> None:
        self.cfg = cfg

    @abc.abstractmethod
    def plan(self, hosts: Sequence[HostLike], horizon_s: float | None = None
             ) -> list[RevocationEvent]:
        """Events for the initial hosts, time events after ``horizon_s`` (None = no limit)
        dropped. Raises ConfigError when the config cannot apply to these hosts."""

    def plan_replacement(self, host: HostLike, start_s: float, generation: int,
                         horizon_s: float | None = None) -> RevocationEvent | None:
        """The revocation of the ``generation``-th replacement in ``host``'s slot, which came up
        at run second ``start_s``; None = it is never revoked (the default)."""
        return None

    def rng(self, host_name: str, generation: int = 0) -> random.Random:
        """An independent, reproducible stream per (seed, model, slot, generation).

        The key is hashed first: ``random.Random`` seeded with strings that differ in one
        character gives nearly equal first draws (0.088, 0.080, 0.081 for worker-0/1/2), so
        every host would be revoked at almost the same moment."""
        return random.Random(_stream_seed(self.cfg.seed, self.name, host_name, generation))


def _stream_seed(*parts: object) -> int:
    key = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


@register_revocation_model
class NoRevocations(RevocationModelBase):
    """Nothing is ever revoked."""

    name = RevocationModel.none.value

    def plan(self, hosts: Sequence[HostLike], horizon_s: float | None = None
             ) -> list[RevocationEvent]:
        return []


@register_revocation_model
class ScheduledRevocations(RevocationModelBase):
    """Exactly the configured events: a host name (``worker-1``) or a role (``worker`` = any
    eligible live worker when due). Targeting a host that is not revocable is a config error,
    so a schedule never silently revokes an on-demand parameter server."""

    name = RevocationModel.schedule.value

    def plan(self, hosts: Sequence[HostLike], horizon_s: float | None = None
             ) -> list[RevocationEvent]:
        by_name = {h.name: h for h in hosts}
        events = []
        for i, spec in enumerate(self.cfg.events):
            path = f"revocation.events.{i}.target"
            if spec.target in ROLES:
                role, host_name = spec.target, None
                if not any(str(h.role) == role and is_revocable(h, self.cfg) for h in hosts):
                    raise ConfigError(path, f"no revocable {role} in this cluster",
                                      _eligibility_hint(role))
            elif spec.target in by_name:
                host = by_name[spec.target]
                role, host_name = str(host.role), host.name
                if not is_revocable(host, self.cfg):
                    raise ConfigError(path, f"{host.name} is not transient",
                                      _eligibility_hint(role))
            else:
                raise ConfigError(path, f"unknown host or role '{spec.target}'",
                                  "one of: " + ", ".join([*ROLES, *by_name]))
            if spec.at_s is not None and horizon_s is not None and spec.at_s > horizon_s:
                continue
            events.append(RevocationEvent(host_name, role, spec.at_s, spec.at_step,
                                          self.cfg.notice_s, self.name))
        return events


class LifetimeModel(RevocationModelBase):
    """A model that draws one lifetime per host (and per replacement) on the cloud clock."""

    @abc.abstractmethod
    def sample_lifetime_h(self, host: HostLike, rng: random.Random) -> float | None:
        """A lifetime in cloud hours; None = never revoked (e.g. survived the 24 h cap)."""

    def plan(self, hosts: Sequence[HostLike], horizon_s: float | None = None
             ) -> list[RevocationEvent]:
        events = [self.plan_replacement(h, 0.0, 0, horizon_s)
                  for h in hosts if is_revocable(h, self.cfg)]
        return sorted((e for e in events if e is not None), key=lambda e: e.at_s or 0.0)

    def plan_replacement(self, host: HostLike, start_s: float, generation: int,
                         horizon_s: float | None = None) -> RevocationEvent | None:
        lifetime_h = self.sample_lifetime_h(host, self.rng(host.name, generation))
        if lifetime_h is None:
            return None
        kill_s = start_s + lifetime_h * catalog.SECONDS_PER_HOUR / self.cfg.time_scale
        at_s = max(start_s, kill_s - self.cfg.notice_s)  # the notice comes before the kill
        if horizon_s is not None and at_s > horizon_s:
            return None
        return RevocationEvent(host.name, str(host.role), at_s, None, self.cfg.notice_s,
                               self.name, lifetime_h)


@register_revocation_model
class ExponentialRevocations(LifetimeModel):
    """Memoryless revocations at ``rate_per_hour`` per server (cloud clock), no cap."""

    name = RevocationModel.exponential.value

    def sample_lifetime_h(self, host: HostLike, rng: random.Random) -> float | None:
        if self.cfg.rate_per_hour <= 0:
            raise ConfigError("revocation.rate_per_hour",
                              f"must be > 0 (got {self.cfg.rate_per_hour:g})")
        return rng.expovariate(self.cfg.rate_per_hour)


@register_revocation_model
class TraceRevocations(LifetimeModel):
    """Lifetimes resampled per GPU type and region from GCE measurements.

    Without ``model_file``: empirical resampling of CM-DARE's 396 VMs (a uniformly drawn VM of
    the host's GPU and region; its revocation hour bin, uniform inside the bin; a VM that
    reached the 24 h cap is right-censored and means "not revoked"). A region without data falls
    back to the GPU's VMs in all regions. With ``model_file``: the fitted model, sampled as
    ``sampling`` says. GPU: ``revocation.gpu``, else the host's, else DEFAULT_TRACE_GPU.
    """

    name = RevocationModel.trace.value

    def __init__(self, cfg: RevocationConfig) -> None:
        super().__init__(cfg)
        self._fitted = load_model_file(cfg.model_file) if cfg.model_file else None

    def sample_lifetime_h(self, host: HostLike, rng: random.Random) -> float | None:
        gpu = self.cfg.gpu or host.gpu or DEFAULT_TRACE_GPU
        region = self.cfg.region or zone_to_region(host.zone)
        if self._fitted is not None:
            return _sample_fitted(self._fitted, gpu, region, self.cfg.sampling, rng)
        return _sample_empirical(gpu, region, rng)


# --- lifetime data --------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredLifetime:
    """One measured VM: revoked in (lower_h, upper_h], or survived to the cap (not revoked)."""

    gpu: str
    region: str
    revoked: bool
    lower_h: float
    upper_h: float


@functools.lru_cache(maxsize=2)
def load_measured_lifetimes(path: Path = LIFETIMES_CSV) -> tuple[MeasuredLifetime, ...]:
    """CM-DARE's lifetimes (cached: the file is read once per process)."""
    with open(path, newline="") as f:
        return tuple(
            MeasuredLifetime(row["gpu"], row["region"], row["revoked"].strip().lower() == "true",
                             float(row["lifetime_hours_lower"]), float(row["lifetime_hours"]))
            for row in csv.DictReader(f)
        )


@functools.lru_cache(maxsize=2)
def _lifetime_pools(
    path: Path = LIFETIMES_CSV,
) -> dict[tuple[str, str | None], list[MeasuredLifetime]]:
    """VMs by (lower-case GPU, region), and by (GPU, None) over all regions: one index, so a
    draw costs a dict lookup rather than a scan of the 396 rows."""
    pools: dict[tuple[str, str | None], list[MeasuredLifetime]] = {}
    for vm in load_measured_lifetimes(path):
        pools.setdefault((vm.gpu.lower(), vm.region), []).append(vm)
        pools.setdefault((vm.gpu.lower(), None), []).append(vm)
    return pools


def _sample_empirical(gpu: str, region: str | None, rng: random.Random) -> float | None:
    pools = _lifetime_pools()
    if (gpu.lower(), None) not in pools:
        known = sorted({vm.gpu for vm in load_measured_lifetimes()})
        raise ConfigError("revocation.gpu", f"no measured lifetimes for GPU '{gpu}'",
                          "one of: " + ", ".join(known))
    pool = pools.get((gpu.lower(), region)) or pools[(gpu.lower(), None)]
    vm = rng.choice(pool)
    if not vm.revoked:
        return None  # right-censored at the 24 h cap: this VM was never revoked
    return vm.lower_h + rng.random() * (vm.upper_h - vm.lower_h)


def load_model_file(path: str | Path) -> dict[str, Any]:
    """A fitted-model file (format in the module docstring). Raises ConfigError if unreadable."""
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            models = yaml.safe_load(text)
        else:
            models = json.loads(text)
    except (OSError, ValueError) as ex:
        raise ConfigError("revocation.model_file", f"cannot read '{path}': {ex}") from None
    if not isinstance(models, dict) or not isinstance(models.get("gpus"), dict):
        raise ConfigError("revocation.model_file", f"'{path}' has no 'gpus' mapping",
                          "write it with: python -m analysis lifetimes --export FILE")
    return models


def _sample_fitted(models: dict[str, Any], gpu: str, region: str | None,
                   sampling: TraceSampling, rng: random.Random) -> float | None:
    gpus = models["gpus"]
    key = next((g for g in gpus if g.lower() == gpu.lower()), None)
    if key is None:
        raise ConfigError("revocation.gpu", f"no fitted model for GPU '{gpu}'",
                          "one of: " + ", ".join(gpus))
    entry = gpus[key].get(region or POOLED_REGION) or gpus[key][POOLED_REGION]
    cap_h = float(models.get("cap_hours", TRACE_CAP_H))
    if sampling == TraceSampling.weibull:
        lifetime = rng.weibullvariate(entry["weibull"]["lambda_h"], entry["weibull"]["rho"])
    elif sampling == TraceSampling.exponential:
        lifetime = rng.expovariate(entry["exponential"]["rate_per_h"])
    else:
        hours, cdf = entry["empirical_cdf"]["hours"], entry["empirical_cdf"]["cdf"]
        u = rng.random()
        if u >= cdf[-1]:
            return None
        i = min(max(bisect.bisect_right(cdf, u), 1), len(hours) - 1)  # the bin whose step covers u
        lifetime = hours[i - 1] + rng.random() * (hours[i] - hours[i - 1])
    return None if lifetime >= cap_h else lifetime


def _eligibility_hint(role: str) -> str:
    return {
        layout.ROLE_PS: "set revocation.include_ps=true or cluster.ps_transient=true",
        layout.ROLE_CHIEF: "set revocation.include_chief=true or cluster.chief_transient=true",
    }.get(role, "mark the group transient: cluster.worker_groups.N.transient=true")


# --- run-time cursor ------------------------------------------------------------------------


class RevocationSchedule:
    """Hands planned revocations to the run loop as they fall due, at most once each.

    The loop calls :meth:`due` on every tick and :meth:`on_replacement` when a replacement host
    took over a slot. A slot revoked by this schedule is not revoked again until replaced.
    """

    def __init__(self, model: RevocationModelBase, hosts: Sequence[HostLike],
                 horizon_s: float | None = None) -> None:
        self.model = model
        self.horizon_s = horizon_s
        self._hosts = {h.name: h for h in hosts}
        self._pending = list(model.plan(hosts, horizon_s))
        self._generation = dict.fromkeys(self._hosts, 0)
        self._revoked: set[str] = set()
        self._pick = random.Random(_stream_seed(model.cfg.seed, "pick"))
        self.skipped: list[RevocationEvent] = []  # due, but the target was not alive

    @classmethod
    def from_config(cls, cfg: RevocationConfig, hosts: Sequence[HostLike],
                    horizon_s: float | None = None) -> RevocationSchedule:
        return cls(get_revocation_model(cfg), hosts, horizon_s)

    @property
    def pending(self) -> list[RevocationEvent]:
        """Events not yet due (a copy), in plan order."""
        return list(self._pending)

    def next_at_s(self) -> float | None:
        """Run second of the earliest pending time event; None when there is none."""
        times = [e.at_s for e in self._pending if e.at_s is not None]
        return min(times) if times else None

    def due(self, now_s: float, step: int, alive: Collection[str]) -> list[RevocationEvent]:
        """Pop every event whose time or step has come, resolved to a host name, in time order.

        ``alive``: names of the host slots running now. A role target picks (seeded) among the
        alive revocable hosts of that role; an event whose target is not alive goes to
        ``skipped`` instead. Calling again with the same arguments returns nothing new."""
        ready = [e for e in self._pending
                 if (e.at_s is not None and e.at_s <= now_s)
                 or (e.at_step is not None and e.at_step <= step)]
        self._pending = [e for e in self._pending if e not in ready]
        fired = []
        for event in sorted(ready, key=lambda e: (e.at_s is None, e.at_s or 0, e.at_step or 0)):
            live = [n for n in sorted(alive) if n not in self._revoked and n in self._hosts]
            if event.host_name is None:
                live = [n for n in live if str(self._hosts[n].role) == event.role
                        and is_revocable(self._hosts[n], self.model.cfg)]
                if not live:
                    self.skipped.append(event)
                    continue
                event = replace(event, host_name=self._pick.choice(live))
            elif event.host_name not in live:
                self.skipped.append(event)
                continue
            self._revoked.add(event.host_name)
            fired.append(event)
        return fired

    def on_replacement(self, host_name: str, now_s: float) -> RevocationEvent | None:
        """A replacement took over slot ``host_name`` at run second ``now_s``: it may be revoked
        again, and lifetime models draw its own lifetime (returned, and added to pending)."""
        self._revoked.discard(host_name)
        self._generation[host_name] = self._generation.get(host_name, 0) + 1
        event = self.model.plan_replacement(self._hosts[host_name], now_s,
                                            self._generation[host_name], self.horizon_s)
        if event is not None:
            self._pending.append(event)
        return event
