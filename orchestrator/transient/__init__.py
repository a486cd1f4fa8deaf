"""Transient servers: revocation models, recovery policies, stragglers and sync policies."""
