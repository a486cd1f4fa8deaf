"""Where this project's source checkout is: the one definition of the project root.

Local roles import `trainer` from it (`provider=local` puts it on PYTHONPATH), remote hosts get
the wheel built from it (`provider=ssh`/`gce`), and the orchestrator finds its config tree,
experiments and reference data in it (`orchestrator.paths`). It lives here, below both users,
because `provisioning/` may not import `orchestrator/`.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
