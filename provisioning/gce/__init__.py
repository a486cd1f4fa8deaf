"""`provider=gce`: Google Compute Engine Spot VMs (see `provider.py`), GCS transfers (`storage.py`).

Importing this package registers the backend; the Google client libraries load only when a
provider is built (`api.py`), so the dry run and validation need no cloud SDK or credentials.
"""

from __future__ import annotations

from typing import Any

from provisioning.base import Provider
from provisioning.registry import register_provider


def make_provider(**options: Any) -> Provider:
    """`get_provider("gce", ...)`: `config` (GceConfig), `journal`, `runner_factory`, ..."""
    from provisioning.gce.provider import GceProvider

    return GceProvider(**options)


register_provider("gce", make_provider)
