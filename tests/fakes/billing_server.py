"""A fake Cloud Billing Catalog API v1 (REST) for tests, spoken to by google-auth's
AuthorizedSession as provisioning/gce/billing.py speaks to Google's.

- ``GET /v1/services/6F81-5844-456A/skus?currencyCode=USD&pageSize=N&pageToken=T``: the SKUs in
  pages of ``page_size`` (the smaller of it and the request's), ``nextPageToken`` on all but the
  last, as the real API pages; 401 without ``Authorization: Bearer <token issued here>``;
  ``deny`` answers 403 PERMISSION_DENIED (the API not enabled / no billing permission);
- ``POST /token``: OAuth's JWT-bearer grant of a service account, so a ``service_account``
  credentials file whose ``token_uri`` points here (google-auth honours it for service accounts,
  not for ``authorized_user`` files) gives the client a bearer token the real way;
- ``calls`` counts SKU page requests.

Stdlib only; everything on 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SERVICE = "6F81-5844-456A"
CLIENT_EMAIL = "pricing@fake-project.iam.gserviceaccount.com"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"  # what google-auth signs for


def sku(description: str, group: str, usage: str, regions: list[str], usd: float,
        unit: str = "h") -> dict[str, Any]:
    """One SKU in the API's JSON shape (a single tier at ``usd`` per ``unit``)."""
    units, nanos = int(usd), round((usd - int(usd)) * 1e9)
    return {
        "name": f"services/{SERVICE}/skus/{abs(hash((description, tuple(regions)))) % 10**12:012X}",
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{"pricingExpression": {
            "usageUnit": unit, "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
            "displayQuantity": 1,
            "tieredRates": [{"startUsageAmount": 0,
                             "unitPrice": {"currencyCode": "USD", "units": str(units),
                                           "nanos": nanos}}]},
            "currencyConversionRate": 1, "effectiveTime": "2026-11-29T08:00:00Z"}],
        "serviceProviderName": "Google",
    }


def realistic_skus() -> list[dict[str, Any]]:
    """A few SKUs as Google lists them (descriptions, groups, units), prices chosen so tests
    can tell them from the shipped catalogue's."""
    return [
        sku("Nvidia Tesla T4 GPU running in Americas", "GPU", "OnDemand", ["us-central1"], 0.35),
        sku("Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "GPU",
            "Preemptible", ["us-central1"], 0.1301),
        sku("Nvidia Tesla T4 GPU running in Belgium", "GPU", "OnDemand", ["europe-west1"], 0.3611),
        sku("Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Belgium", "GPU",
            "Preemptible", ["europe-west1"], 0.0875),
        sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas", "GPU", "OnDemand",
            ["us-central1"], 0.55),  # another product: never a T4's price
        sku("Commitment v1: Nvidia Tesla T4 GPU running in Americas for 1 Year", "GPU",
            "Commit1Yr", ["us-central1"], 0.22),
        sku("Nvidia L4 GPU attached to Spot Preemptible VMs running in Netherlands", "GPU",
            "Preemptible", ["europe-west4"], 0.1999),
        sku("N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand",
            ["us-central1"], 0.031611),
        sku("N1 Predefined Instance Ram running in Americas", "N1Standard", "OnDemand",
            ["us-central1"], 0.004237, "GiBy.h"),
        sku("Spot Preemptible N1 Predefined Instance Core running in Belgium", "N1Standard",
            "Preemptible", ["europe-west1"], 0.0071),
        sku("Spot Preemptible N1 Predefined Instance Ram running in Belgium", "N1Standard",
            "Preemptible", ["europe-west1"], 0.00095, "GiBy.h"),
        sku("G2 Instance Core running in Americas", "G2Standard", "OnDemand", ["us-central1"],
            0.024988),
        sku("G2 Instance Ram running in Americas", "G2Standard", "OnDemand", ["us-central1"],
            0.002928, "GiBy.h"),
    ]


class FakeBilling:
    """State of the fake: SKUs, page size, issued tokens, whether to deny, calls."""

    def __init__(self, skus: list[dict[str, Any]] | None = None, page_size: int = 4) -> None:
        self.skus = realistic_skus() if skus is None else skus
        self.page_size = page_size
        self.tokens: set[str] = set()
        self.deny = False
        self.calls = 0
        self.endpoint = ""

    def token_file(self, directory: Path) -> Path:
        """A ``service_account`` ADC file (a fresh throwaway RSA key) whose token grant goes to
        this fake's /token."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        path = directory / "adc.json"
        path.write_text(json.dumps({
            "type": "service_account", "project_id": "fake-project", "private_key_id": "k1",
            "private_key": pem, "client_email": CLIENT_EMAIL, "client_id": "1",
            "token_uri": f"{self.endpoint}/token"}))
        return path


def _claims(jwt: str) -> dict[str, Any]:
    """A JWT's payload (unverified: the fake only checks who asks and for what)."""
    try:
        payload = jwt.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}


def _handler(fake: FakeBilling) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, state: str, message: str) -> None:
            self._send(status, {"error": {"code": status, "message": message, "status": state}})

        def do_POST(self) -> None:
            form = urllib.parse.parse_qs(self.rfile.read(
                int(self.headers.get("Content-Length") or 0)).decode())
            claims = _claims((form.get("assertion") or [""])[0])
            if (self.path != "/token" or form.get("grant_type") != [JWT_GRANT]
                    or claims.get("iss") != CLIENT_EMAIL
                    or claims.get("aud") != GOOGLE_TOKEN_AUDIENCE):
                self._send(400, {"error": "invalid_grant"})
                return
            token = f"ya29.billing-{len(fake.tokens)}"
            fake.tokens.add(token)
            self._send(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path != f"/v1/services/{SERVICE}/skus":
                self._error(404, "NOT_FOUND", "Requested entity was not found.")
                return
            fake.calls += 1
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer ") or auth[7:] not in fake.tokens:
                self._error(401, "UNAUTHENTICATED", "Request is missing required "
                            "authentication credential.")
                return
            if fake.deny:
                self._error(403, "PERMISSION_DENIED", "Cloud Billing API has not been used in "
                            "project 0 before or it is disabled.")
                return
            size = min(fake.page_size, int(query.get("pageSize") or 5000))
            start = int(query.get("pageToken") or 0)
            page = fake.skus[start:start + size]
            body: dict[str, Any] = {"skus": page}
            if start + size < len(fake.skus):
                body["nextPageToken"] = str(start + size)
            self._send(200, body)

    return Handler


@contextmanager
def billing_server(fake: FakeBilling | None = None) -> Iterator[FakeBilling]:
    """Serve a FakeBilling on 127.0.0.1 at a free port (``fake.endpoint``) while in the block."""
    fake = fake or FakeBilling()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
