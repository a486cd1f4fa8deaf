"""``python -m orchestrator.gc [--dry-run] [--project P]``: delete the orphaned VMs of this tool.

The command the README documents. Orphans are a cloud backend's business: the GCE backend owns
how they are found and deleted (`provisioning/gce/orphans.py`, labels identify each VM's
orchestrator process); this entry only runs it.
"""

from __future__ import annotations

import sys

from provisioning.gce.orphans import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
