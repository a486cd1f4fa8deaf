"""`provider=gce`: Google Compute Engine Spot VMs (see `provider.py`), GCS transfers (`storage.py`).

Importing this package registers the backend with its typed config; the Google client libraries
load only when a provider is built (`api.py`), so the dry run and validation need no cloud SDK
or credentials.
"""

from provisioning.gce.config import GceConfig
from provisioning.registry import register_provider

# the provider module (and with it paramiko, for the VMs' SSH) loads when first needed
register_provider("gce", "provisioning.gce.provider:GceProvider", GceConfig)

__all__ = ["GceConfig"]
