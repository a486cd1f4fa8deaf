"""The simulated cloud: which market revokes a plan's VMs and when (the measured lifetimes),
how long a replacement takes to start, and what the VMs cost while they live.

:class:`orchestrator.simulate.engine.Simulation` plays the run (training, recoveries,
stragglers) and asks this module for the cloud's part; the real run gets the same facts from its
provider (:mod:`provisioning`) and its pricing.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.schema import ExperimentConfig
from orchestrator.config.transient import GCE_NOTICE_S, RevocationModel
from orchestrator.plan import BackendTraits, HostPlan, RunPlan
from orchestrator.simulate.models import SimModels
from orchestrator.transient.revocation import (
    LifetimeModel,
    RevocationSchedule,
    _sample_fitted,
    zone_to_region,
)
from provisioning import catalog
from provisioning.catalog import PREEMPTIBLE_CAP_H, Market
from trainer.layout import ROLE_WORKER


def cloud_market(cfg: ExperimentConfig, backend: BackendTraits
                 ) -> tuple[Market | None, float | None]:
    """The market whose revocations a prediction of ``cfg`` on ``backend`` (its plan's
    ``backend``) draws, and the hours after which a transient VM ends whatever its lifetime
    (None: never).

    Not a setting of its own, so a plan cannot be simulated on another market than the one it
    would run on (``Provider.transient_market``): ``provider=sim`` simulates the priced cloud
    (``pricing.transient_market``: preemptible in the papers' 2019 catalog, Spot in today's); a
    real backend names the VMs it creates (GCE makes Spot VMs, and validation holds the pricing
    to it), and None for backends no cloud revokes (local processes, an SSH inventory), whose
    runs lose only what the ``revocation`` model injects. Preemptible VMs end at 24 h; a Spot VM
    ends at the provider's max run duration when one is set."""
    market = backend.transient_market
    if market is None:
        return None, None
    cap_s = cfg.provider.transient_lifetime_cap_s()
    caps = ([PREEMPTIBLE_CAP_H] if market == Market.preemptible else []) + (
        [cap_s / 3600.0] if cap_s else [])
    return market, min(caps) if caps else None


class CloudLifetimes(LifetimeModel):
    """The simulated cloud's revocations: measured lifetimes per GPU and region.

    Preemptible: the Kaplan–Meier CDF of the measurements (right-censored at 24 h), and a VM
    that outlives them is stopped at the 24 h cap. Spot: the fitted Weibull, without the cap
    (past 24 h its tail is an extrapolation), unless the VM has a max run duration. A GPU nobody
    measured (T4, L4, A100) is revoked by the measured GPUs pooled: each draw picks a measured
    GPU with the odds of its share of the VMs measured (in the host's region where measured),
    so the band reflects preemption as measured, not a figure made up for that GPU."""

    name = "cloud"

    def __init__(self, cfg: Any, models: dict[str, Any], market: Market,
                 region: str | None, cap_h: float | None) -> None:
        super().__init__(cfg)
        self.models = {**models, "cap_hours": float("inf")}  # the cap is applied below
        self.sampling = "empirical" if market == Market.preemptible else "weibull"
        self.region = region
        self.cap_h = cap_h

    def sample_lifetime_h(self, host: Any, rng: random.Random) -> float | None:
        from orchestrator.config.transient import TraceSampling

        region = self.region if self.region else zone_to_region(host.zone)
        region = None if region == "all" else region
        gpus = self.models["gpus"]
        gpu = (host.gpu or "K80").upper()
        if gpu not in {g.upper() for g in gpus}:  # unmeasured: the measured GPUs pooled
            names = sorted(gpus)
            weights = [(gpus[g].get(region or "all") or gpus[g]["all"]).get("vms", 1)
                       for g in names]
            gpu = rng.choices(names, weights)[0]
        life = _sample_fitted(self.models, gpu, region, TraceSampling(self.sampling), rng)
        if self.cap_h is None:
            return life
        return self.cap_h if life is None else min(life, self.cap_h)


def cloud_revocations(cfg: ExperimentConfig, plan: RunPlan, seed: int,
                      models: SimModels) -> RevocationSchedule:
    """The run's revocations: the experiment's ``revocation`` model when it has one, else the
    simulated cloud's (:class:`CloudLifetimes` on the market of :func:`cloud_market`), else
    none (no cloud revokes local processes or an SSH inventory)."""
    rev = cfg.revocation
    if rev.model != RevocationModel.none:
        return RevocationSchedule.from_config(rev, plan.hosts)
    market, cap_h = cloud_market(cfg, plan.backend)
    if market is None:
        return RevocationSchedule.from_config(rev, plan.hosts)
    notice = rev.notice_s or GCE_NOTICE_S  # the cloud's notice unless one is configured
    cloud = CloudLifetimes(dataclasses.replace(rev, seed=seed, notice_s=notice),
                           models.lifetime_models(str(cfg.sim.lifetimes)),
                           market, cfg.sim.lifetime_region, cap_h)
    # the cloud revokes transient VMs only (include_ps/include_chief inject, not model);
    # roles sharing ps-0's VM go with it (see Simulation.revoke)
    cloud.cfg = dataclasses.replace(cloud.cfg, include_ps=False, include_chief=False)
    return RevocationSchedule(cloud, [h for h in plan.hosts if h.colocate_with is None])


def provision_delay(models: SimModels, host: HostPlan, rng: random.Random) -> float:
    """A replacement's request-to-ready time: CM-DARE's replacement servers for GPU hosts,
    a VM start-up for CPU hosts (PS, chief); on this machine (a local calibration) a new
    process, whose TensorFlow start a restart pays separately."""
    if models.local_start_s is not None:
        return models.local_start_s if host.role == ROLE_WORKER else 0.0
    if host.gpu is None:
        return models.vm_startup_s(host.transient, rng)
    return models.replacement_s(host.gpu, rng)


@dataclass
class Billing:
    """Every VM billed from its request until its revocation or the end of the run."""

    billed: list[tuple[str, float, float]] = field(default_factory=list)  # (slot, start, end)
    since: dict[str, float] = field(default_factory=dict)  # slots billed now, from when

    def start(self, name: str, at: float) -> None:
        self.since[name] = at

    def stop(self, name: str, at: float) -> None:
        start = self.since.pop(name, None)
        if start is not None:
            self.billed.append((name, start, at))

    def stop_all(self, at: float) -> None:
        for name in list(self.since):
            self.stop(name, at)

    def cost_usd(self, hosts: dict[str, Any], roles: tuple[str, ...] | None = None,
                 lo: float = 0.0, hi: float = float("inf")) -> float:
        """USD of the billed time inside [lo, hi] of the hosts (by slot name: ``hourly_usd``,
        ``role``) whose role is in ``roles`` (None: all)."""
        total = 0.0
        for name, start, end in self.billed:
            host = hosts[name]
            if roles is None or host.role in roles:
                seconds = max(0.0, min(end, hi) - max(start, lo))
                total += catalog.cost_usd([host.hourly_usd], seconds)
        return total
