"""This project's Hydra launcher plugin: ``hydra/launcher=parallel`` (see parallel.py)."""
