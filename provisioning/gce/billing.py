"""Today's Compute Engine prices from Google's Cloud Billing Catalog API, over the shipped
catalogue (conf/pricing/gce.yaml).

Spot prices "can change up to once every day" (https://cloud.google.com/spot-vms/pricing), so a
shipped file ages; with Google credentials at hand the API has today's figure per region. The
v1 REST protocol is read with google-auth's AuthorizedSession (no extra dependency):
``GET {endpoint}/v1/services/6F81-5844-456A/skus?currencyCode=USD&pageSize=5000&pageToken=..``.
GPU SKUs give a price per GPU-hour; a machine type costs vCPUs x its series' core price + GiB x
its RAM price. An entry without a SKU keeps the shipped figure. What was read is cached (JSON)
for a day under $XDG_CACHE_HOME/transient-orchestrator/pricing/. Every failure (no credentials,
network, 403) leaves the shipped catalogue and logs one warning line, never a traceback.

Settings: ``pricing.live`` (auto: only when Application Default Credentials are in a file, so
nothing probes the metadata server; true: also ask google.auth.default() everywhere; false:
never), ``pricing.billing_endpoint`` or $TRANSIENT_BILLING_ENDPOINT (a local stand-in).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from provisioning.catalog import PricingConfig, RegionPrice, region_of

log = logging.getLogger(__name__)

COMPUTE_SERVICE_ID = "6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
DEFAULT_ENDPOINT = "https://cloudbilling.googleapis.com"
ENDPOINT_ENV = "TRANSIENT_BILLING_ENDPOINT"
LIVE_SOURCE = "Cloud Billing Catalog API"  # pricing.source of live prices (the planner prints it)
CACHE_TTL_S = 86400.0  # a day: Spot prices change at most daily
#: A failed read (no access to the API, no network) is remembered this long: the shipped prices
#: are used without asking again, so a user without the API sees one warning an hour, not one
#: per command.
FAILURE_TTL_S = 3600.0
SCOPES = ("https://www.googleapis.com/auth/cloud-billing.readonly",)
DEFAULT_REGION = "us-central1"  # the shipped catalogue's defaults are us-central1's
MARKETS = {"OnDemand": "on_demand", "Preemptible": "spot"}

#: "Nvidia Tesla T4 GPU running in Americas", "Nvidia L4 GPU attached to Spot Preemptible VMs
#: ..."; "T4 Virtual Workstation GPU" and "A100 80GB GPU" do not match (another product).
_GPU = re.compile(r"\bnvidia (?:tesla )?(k80|p100|v100|t4|l4|a100) gpu\b", re.I)
#: "N1 Predefined Instance Core running in ...", "Spot Preemptible E2 Instance Ram running in".
_MACHINE = re.compile(r"^(?:spot )?(?:preemptible )?(n1|e2|g2|a2)(?: predefined)? instance "
                      r"(core|ram)\b", re.I)

#: kind ("gpu", "core", "ram") -> name (t4, n1) -> region -> market -> USD per unit-hour
Rates = dict[str, dict[str, dict[str, dict[str, float]]]]


def unit_price(sku: dict[str, Any]) -> float | None:
    """USD per usage unit of a SKU: its last tier (the rate past any free tier)."""
    infos = sku.get("pricingInfo") or []
    tiers = (infos[0].get("pricingExpression") or {}).get("tieredRates") or [] if infos else []
    if not tiers:
        return None
    price = tiers[-1].get("unitPrice") or {}
    return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9


def rates_from_skus(skus: list[dict[str, Any]]) -> Rates:
    """The per-unit rates our catalogue needs, by kind, name, region and market."""
    rates: Rates = {"gpu": {}, "core": {}, "ram": {}}
    for sku in skus:
        category = sku.get("category") or {}
        market = MARKETS.get(category.get("usageType", ""))
        description = sku.get("description", "")
        if category.get("resourceFamily") != "Compute" or market is None:
            continue
        if (gpu := _GPU.search(description)) and category.get("resourceGroup") == "GPU":
            kind, name = "gpu", gpu.group(1).lower()
        elif machine := _MACHINE.search(description):
            kind, name = machine.group(2).lower(), machine.group(1).lower()
        else:
            continue
        price = unit_price(sku)
        if price is None:
            continue
        for region in sku.get("serviceRegions") or []:
            rates[kind].setdefault(name, {}).setdefault(region, {})[market] = price
    return rates


def _merged(shipped: RegionPrice, live: dict[str, float | None]) -> RegionPrice:
    """Shipped prices with those the API had replacing them, market by market."""
    on_demand, spot = live.get("on_demand"), live.get("spot")
    return RegionPrice(
        on_demand_usd_per_h=shipped.on_demand_usd_per_h if on_demand is None else round(on_demand, 6),
        preemptible_usd_per_h=shipped.preemptible_usd_per_h if spot is None else round(spot, 6))


def _apply(offer: Any, regions: set[str], price_in: Any) -> None:
    """Set an offer's default (us-central1) and per-region prices from ``price_in(region)``
    (market -> price or None); regions and markets without one keep their shipped figure."""
    default = _merged(offer, price_in(DEFAULT_REGION))
    offer.on_demand_usd_per_h = default.on_demand_usd_per_h
    offer.preemptible_usd_per_h = default.preemptible_usd_per_h
    for region in sorted(regions):
        shipped = offer.regions.get(region) or RegionPrice(offer.on_demand_usd_per_h,
                                                           offer.preemptible_usd_per_h)
        offer.regions[region] = _merged(shipped, price_in(region))


def apply_rates(pricing: PricingConfig, rates: Rates, date: str) -> PricingConfig:
    """A copy of ``pricing`` with the API's prices wherever it had the SKUs, dated ``date``."""
    live = copy.deepcopy(pricing)
    zone_regions = {region_of(z) for z in pricing.all_zones()}
    for name, offer in live.gpus.items():
        per_region = rates["gpu"].get(name, {})
        _apply(offer, set(offer.regions) | {region_of(z) for z in offer.zones},
               lambda r, per_region=per_region: per_region.get(r, {}))
    for machine_type, offer in live.machine_types.items():
        series = machine_type.split("-", 1)[0]
        core, ram = rates["core"].get(series, {}), rates["ram"].get(series, {})
        if offer.vcpus is None or offer.memory_gb is None:
            continue

        def price_in(region: str, offer: Any = offer, core: Any = core, ram: Any = ram
                     ) -> dict[str, float | None]:
            c, m = core.get(region, {}), ram.get(region, {})
            return {market: (offer.vcpus * c[market] + offer.memory_gb * m[market]
                             if market in c and market in m else None)
                    for market in MARKETS.values()}
        _apply(offer, set(offer.regions) | zone_regions, price_in)
    live.source, live.date = LIVE_SOURCE, date
    return live


def endpoint_of(pricing: PricingConfig) -> str:
    """Where the Catalog API is: the setting, else $TRANSIENT_BILLING_ENDPOINT, else Google."""
    return (pricing.billing_endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT
            ).rstrip("/")


def cache_path(endpoint: str) -> Path:
    """One cache file per endpoint, so a stand-in's prices never pass for Google's."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(endpoint.encode()).hexdigest()[:12]
    return base / "transient-orchestrator" / "pricing" / f"gce-{digest}.json"


def read_skus(session: Any, endpoint: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Every Compute Engine SKU, following nextPageToken. Raises on an HTTP error."""
    skus: list[dict[str, Any]] = []
    token = ""
    while True:
        params = {"currencyCode": "USD", "pageSize": "5000"}
        if token:
            params["pageToken"] = token
        response = session.get(f"{endpoint}/v1/services/{COMPUTE_SERVICE_ID}/skus",
                               params=params, timeout=timeout_s)
        if response.status_code != 200:
            try:
                error = response.json().get("error") or {}
            except ValueError:
                error = {}
            raise RuntimeError(f"HTTP {response.status_code} {error.get('status', '')}: "
                               f"{error.get('message', response.reason)}")
        page = response.json()
        skus.extend(page.get("skus") or [])
        token = page.get("nextPageToken") or ""
        if not token:
            return skus


def _file_credentials_present() -> bool:
    """Whether ADC lives in a file (GOOGLE_APPLICATION_CREDENTIALS or gcloud's
    application-default login): ``auto`` asks nothing else, so no metadata-server probe."""
    from google.auth import _cloud_sdk, environment_vars

    if os.environ.get(environment_vars.CREDENTIALS):
        return True
    return Path(_cloud_sdk.get_application_default_credentials_path()).is_file()


def _credentials() -> Any:
    import google.auth

    credentials, _ = google.auth.default(scopes=list(SCOPES))
    return credentials


def live_pricing(pricing: PricingConfig, now: float | None = None) -> PricingConfig:
    """The gce catalogue at today's prices when ``pricing.live`` allows and credentials are
    present (cached for a day), else ``pricing`` unchanged. Never raises: a failure is one
    warning line and the shipped catalogue."""
    mode = str(pricing.live).lower()
    if pricing.name != "gce" or mode == "false":
        return pricing
    if mode != "true" and not _file_credentials_present():
        return pricing
    now = time.time() if now is None else now
    endpoint = endpoint_of(pricing)
    path = cache_path(endpoint)
    try:
        cached = json.loads(path.read_text())
        age = now - float(cached["read_at"])
        if cached.get("failed") and 0 <= age < FAILURE_TTL_S:
            return pricing  # said once already, within the hour
        if not cached.get("failed") and 0 <= age < CACHE_TTL_S:
            return apply_rates(pricing, cached["rates"], cached["date"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no cache or an unreadable one: read the API
    quiet = [logging.getLogger(name) for name in ("google.auth", "urllib3")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # their retries and fallbacks would be lines besides our one
        logger.setLevel(logging.ERROR)
    try:
        return _read_live(pricing, endpoint, path, now)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def _first_sentence(ex: BaseException) -> str:
    text = str(ex).splitlines()[0] if str(ex) else type(ex).__name__
    return text.split(". ", 1)[0]


def _read_live(pricing: PricingConfig, endpoint: str, path: Path, now: float) -> PricingConfig:
    """Read the API, cache what it said and apply it; a failure is one warning line."""
    try:
        from google.auth.exceptions import DefaultCredentialsError
        from google.auth.transport.requests import AuthorizedSession

        try:
            credentials = _credentials()
        except DefaultCredentialsError as ex:
            log.warning("pricing: no Google credentials (%s); shipped prices of %s",
                        _first_sentence(ex), pricing.date)
            return pricing
        rates = rates_from_skus(read_skus(AuthorizedSession(credentials), endpoint))
    except Exception as ex:  # any failure means the shipped catalogue
        log.warning("pricing: Cloud Billing Catalog API unavailable (%s); shipped prices of %s "
                    "(not asked again for an hour)", _first_sentence(ex), pricing.date)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"endpoint": endpoint, "read_at": now,
                                        "failed": _first_sentence(ex)}))
        return pricing
    date = datetime.datetime.fromtimestamp(now, datetime.UTC).date().isoformat()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"endpoint": endpoint, "read_at": now, "date": date,
                                    "rates": rates}))
    except OSError as ex:
        log.warning("pricing: cannot cache live prices at %s (%s)", path, ex.strerror)
    return apply_rates(pricing, rates, date)
