"""This project's Hydra plugins: the launcher ``hydra/launcher=parallel`` (parallel.py) and the
user's repository on the config search path (user_repo.py).

The orchestrator's entry points (``python -m orchestrator``, the validate command, the
simulator's composer) import only :func:`register.register_plugins`; the plugin modules import the
orchestrator, never the other way round, so the import graph has no circle.
"""
