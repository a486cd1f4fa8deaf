"""The real player of a plan: one run for real (``run.py``: provision → deploy → train → record →
release), its data step (``data.py``), the fleet that owns the cluster, the deployer, the
supervisor, the control channel and progress. Never imports :mod:`orchestrator.simulate`."""
