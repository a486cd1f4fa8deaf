"""Analyses of distributed training on transient cloud GPUs: performance models, revocation
lifetimes, cost, Sync-Switch, and the HTML report (``python -m analysis --help``).

Reads the papers' measured data shipped in ``analysis/reference_data/`` and the project's own
run directories (files only; never imports ``orchestrator``).
"""
