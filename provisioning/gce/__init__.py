"""`provider=gce`: Google Compute Engine Spot VMs (see `provider.py`), GCS transfers (`storage.py`).

Importing this package registers the backend with its typed config; the Google client libraries
load only when a provider is built (`api.py`), so the dry run and validation need no cloud SDK
or credentials.
"""

from provisioning.gce.config import GceConfig
from provisioning.gce.provider import GceProvider
from provisioning.registry import register_provider

register_provider(GceProvider.name, GceProvider, GceConfig)

__all__ = ["GceConfig", "GceProvider"]
