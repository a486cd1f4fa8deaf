"""Compute Engine errors, classified once into the provider contract's error types.

Where each error surfaces (gce-notes.md §B1): a stock-out and most quota errors arrive inside the
*finished insert operation* (HTTP 200 on insert, `httpErrorStatusCode` 503/403 on the operation);
an accelerator type the zone does not offer is a *synchronous* 400 from `insert()`. Both paths
end here as (HTTP status, [(code or reason, message, quota metric)]) so the decision is made in
one place:

- stock-out (`ZONE_RESOURCE_POOL_EXHAUSTED*`, `insufficientCapacity`, ...) -> `ZoneCapacityError`:
  block this zone, try the next;
- quota (`QUOTA_EXCEEDED` / `quotaExceeded`) -> `QuotaError` naming the metric; it blocks the
  region, or every region for a global quota (any metric ending in `_ALL_REGIONS`, e.g.
  `GPUS_ALL_REGIONS` and `CPUS_ALL_REGIONS`, or a message saying "globally"): a quota raise,
  not another zone, fixes it;
- rate limits, 5xx, lost connections -> `TransientApiError`: retried with backoff;
- anything else, accelerator-not-found included -> `BadRequestError` (never succeeds as written).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from provisioning.base import BadRequestError, CapacityError, ProvisionError

#: Codes that mean "this zone cannot run it now" (SkyPilot's GCP failover table, gce-notes §B2).
ZONE_CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "insufficientCapacity", "UNSUPPORTED_OPERATION", "RESOURCE_NOT_READY",
})
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
RATE_CODES = frozenset({"RESOURCE_OPERATION_RATE_EXCEEDED", "rateLimitExceeded",
                        "userRateLimitExceeded"})
#: Project-wide quotas end in this (GPUS_ALL_REGIONS, CPUS_ALL_REGIONS): no region helps.
GLOBAL_QUOTA_SUFFIX = "_ALL_REGIONS"
_QUOTA_MESSAGE = re.compile(r"Quota '([A-Z0-9_]+)' exceeded")
_TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})


class ZoneCapacityError(CapacityError):
    """No capacity in `zone` now; another zone (or later) may succeed."""

    def __init__(self, zone: str, message: str) -> None:
        super().__init__(f"{zone}: {message}")
        self.zone = zone


class QuotaError(CapacityError):
    """A project quota is exhausted: `metric` in `region` (None: in every region)."""

    def __init__(self, metric: str, region: str | None, message: str) -> None:
        where = f"region {region}" if region else "all regions"
        super().__init__(f"quota {metric} exhausted in {where}: {message} (ask for a quota "
                         "increase: https://console.cloud.google.com/iam-admin/quotas)")
        self.metric = metric
        self.region = region


class TransientApiError(ProvisionError):
    """A rate limit, server error or lost connection: the same request may succeed later."""


@dataclass(frozen=True)
class ErrorItem:
    """One entry of an error list, whichever form the client gave it in."""

    code: str
    message: str
    quota_metric: str | None = None


class GuestAttributesOffError(BadRequestError):
    """getGuestAttributes answered 403 or 412: an organisation policy
    (`compute.disableGuestAttributesAccess`) or the account's role keeps guest attributes from
    us. Not a reason to stop: host keys are then pinned on first use, the GPU is checked by the
    trainer alone."""


def region_of(zone: str) -> str:
    """`us-central1-a` -> `us-central1`."""
    return zone.rsplit("-", 1)[0]


def is_global_quota(metric: str, message: str = "") -> bool:
    """A project-wide quota (`*_ALL_REGIONS`, or GCE's message says "globally")."""
    return metric.endswith(GLOBAL_QUOTA_SUFFIX) or "globally" in message


def items_from_operation(operation: Any) -> list[ErrorItem]:
    """Error items of a finished `compute_v1.Operation` (protos with code/message/details)."""
    items = []
    for err in operation.error.errors:
        metric = None
        for detail in err.error_details:
            info = detail.quota_info
            if info.metric_name:
                metric = info.metric_name.rsplit("/", 1)[-1].upper()
        items.append(ErrorItem(err.code, err.message, metric))
    return items


def items_from_exception(error: Any) -> list[ErrorItem]:
    """Error items of a `google.api_core.exceptions.GoogleAPICallError` (dicts or protos)."""
    items = []
    for err in getattr(error, "errors", None) or []:
        if isinstance(err, dict):
            items.append(ErrorItem(str(err.get("reason") or err.get("code") or ""),
                                   str(err.get("message", ""))))
        else:
            items.append(ErrorItem(str(getattr(err, "code", "")), str(getattr(err, "message", ""))))
    if not items:
        items.append(ErrorItem("", str(getattr(error, "message", "") or error)))
    return items


def classify(zone: str, http_status: int | None, items: Iterable[ErrorItem]) -> ProvisionError:
    """The contract error for a failed insert in `zone`. The one place that decides."""
    items = list(items)
    text = "; ".join(f"{i.code}: {i.message}" if i.code else i.message for i in items)
    for item in items:
        if item.code in QUOTA_CODES or _QUOTA_MESSAGE.search(item.message):
            found = _QUOTA_MESSAGE.search(item.message)
            metric = found.group(1) if found else (item.quota_metric or "UNKNOWN_QUOTA")
            region = None if is_global_quota(metric, item.message) else region_of(zone)
            return QuotaError(metric, region, item.message)
    for item in items:
        if item.code in ZONE_CAPACITY_CODES:
            return ZoneCapacityError(zone, text)
    if any(item.code in RATE_CODES for item in items) or http_status in _TRANSIENT_HTTP:
        return TransientApiError(f"{zone}: HTTP {http_status}: {text}")
    return BadRequestError(f"{zone}: HTTP {http_status}: {text}")


def classify_exception(zone: str, error: BaseException) -> ProvisionError:
    """Classify an exception raised by a client call (sync errors, connection failures)."""
    from google.api_core import exceptions as gexc

    if isinstance(error, ProvisionError):
        return error
    if isinstance(error, gexc.GoogleAPICallError):
        return classify(zone, error.code, items_from_exception(error))
    if isinstance(error, ConnectionError | TimeoutError | OSError):
        return TransientApiError(f"{zone}: {type(error).__name__}: {error}")
    try:
        import requests

        if isinstance(error, requests.RequestException):
            return TransientApiError(f"{zone}: {type(error).__name__}: {error}")
    except ImportError:  # pragma: no cover - requests comes with google-auth
        pass
    return ProvisionError(f"{zone}: {type(error).__name__}: {error}")
