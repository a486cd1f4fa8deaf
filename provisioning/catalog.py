"""The GPU / zone / price catalog: which zone offers which GPU, and what an hour costs.

The records double as the Hydra schema of the ``pricing`` config group (``conf/pricing/``), so a
catalog is plain YAML: GCE list prices by default, the papers' 2019 constants as an option.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from omegaconf import MISSING

from provisioning.machine_shapes import gpus_per_vm  # the one table of GPUs per shape

SECONDS_PER_HOUR = 3600.0
#: GCE stops a preemptible VM after 24 h at the latest (legacy model; Spot VMs have no cap).
PREEMPTIBLE_CAP_H = 24.0


class Market(enum.StrEnum):
    """How a cloud sells its transient VMs: decides whether the 24 h cap applies to them."""

    preemptible = "preemptible"  # GCE preemptible (the only kind in 2019): stopped after 24 h
    spot = "spot"  # GCE Spot (since 2021): no cap, unless the VM asks for a max run duration


@dataclass
class RegionPrice:
    """One region's prices of an offer: they differ by region (europe-west4 V100 Spot is 28 %
    below us-central1's), so a zone's answer carries its own price."""

    on_demand_usd_per_h: float = MISSING
    preemptible_usd_per_h: float = MISSING  # spot/preemptible price


@dataclass
class GpuOffer:
    on_demand_usd_per_h: float = MISSING  # per GPU (or per VM when the catalog says so)
    preemptible_usd_per_h: float = MISSING  # spot/preemptible price
    zones: list[str] = field(default_factory=list)  # zones that offer this GPU
    tflops: float | None = None  # FP32 peak, a speed-model feature
    regions: dict[str, RegionPrice] = field(default_factory=dict)  # region -> its own prices


@dataclass
class MachineOffer:
    on_demand_usd_per_h: float = MISSING  # the VM without its GPUs (they are priced per GPU)
    preemptible_usd_per_h: float = MISSING
    vcpus: int | None = None
    memory_gb: float | None = None
    regions: dict[str, RegionPrice] = field(default_factory=dict)  # region -> its own prices


def region_of(zone: str) -> str:
    """A GCE zone's region: ``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def _price(offer: GpuOffer | MachineOffer, transient: bool, region: str | None) -> float:
    """The offer's price in ``region`` where the catalog has one, else its default."""
    priced = offer.regions.get(region) if region else None
    source = priced if priced is not None else offer
    return source.preemptible_usd_per_h if transient else source.on_demand_usd_per_h


@dataclass
class PricingConfig:
    """A catalog. Names are lower-case GPU keys (``k80``) and GCE machine types."""

    name: str = MISSING
    source: str = ""  # where the prices come from, and when
    date: str = ""  # ISO date the prices were read (the planner prints it)
    gpu_price_includes_machine: bool = False  # the papers' constants are whole-VM prices
    transient_market: Market = MISSING  # how the priced cloud sells transient VMs (24 h cap?)
    gpus: dict[str, GpuOffer] = field(default_factory=dict)
    machine_types: dict[str, MachineOffer] = field(default_factory=dict)
    zones: list[str] = field(default_factory=list)  # zones known besides those of the GPUs
    live: str = "auto"  # gce: today's prices from the Cloud Billing Catalog API (auto|true|false)
    billing_endpoint: str = ""  # that API's endpoint ("" = $TRANSIENT_BILLING_ENDPOINT or Google's)

    def all_zones(self) -> list[str]:
        """Every zone the catalog knows, in a stable order."""
        seen = dict.fromkeys(self.zones)
        for offer in self.gpus.values():
            seen.update(dict.fromkeys(offer.zones))
        return list(seen)

    def zones_for(self, gpu: str) -> list[str]:
        """Zones offering ``gpu``; raises KeyError for a GPU the catalog lacks."""
        return list(self.gpus[gpu].zones)

    def hourly_price(self, machine_type: str, gpu: str | None, transient: bool,
                     zone: str | None = None) -> float:
        """USD per hour of one host: the VM plus its GPUs (or the GPU's whole-VM price), at
        the prices of ``zone``'s region where the catalog has them, else its defaults. A shape
        with several built-in GPUs (a2-highgpu-4g) pays for each.

        Raises KeyError when the machine type or GPU is not in the catalog; validation rejects
        such configs before anything asks for a price.
        """
        region = region_of(zone) if zone else None
        if gpu is not None:
            gpu_price = _price(self.gpus[gpu], transient, region)
            if self.gpu_price_includes_machine:
                return gpu_price
            gpu_price *= gpus_per_vm(machine_type, gpu)
        else:
            gpu_price = 0.0
        return _price(self.machine_types[machine_type], transient, region) + gpu_price


@dataclass(frozen=True)
class Retirement:
    """A GPU a cloud no longer offers: requests for it fail there; past runs stay analysable."""

    date: str  # ISO date from which it can no longer be used
    replacement: str  # the catalog GPU to ask for instead
    source: str  # where the retirement is announced


#: provider name -> GPU -> retirement. K80: "no longer usable as of May 1, 2024" (gce-notes §D);
#: the T4 is the closest Spot price class on GCE today.
RETIRED_GPUS: dict[str, dict[str, Retirement]] = {
    "gce": {"k80": Retirement("2024-05-01", "t4",
                              "https://cloud.google.com/compute/docs/eol/k80-eol")},
}


def retirement(provider: str, gpu: str | None) -> Retirement | None:
    """Why `gpu` cannot be provisioned by `provider` any more, or None when it can."""
    return RETIRED_GPUS.get(provider, {}).get(gpu or "")


def cost_usd(hourly_prices: list[float], seconds: float) -> float:
    """What hosts at these hourly prices cost for ``seconds`` (GCE bills per second)."""
    return sum(hourly_prices) * seconds / SECONDS_PER_HOUR
