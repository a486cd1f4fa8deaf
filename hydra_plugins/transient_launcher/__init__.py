"""This project's Hydra plugins: the launcher ``hydra/launcher=parallel`` (parallel.py) and the
user's repository on the config search path (user_repo.py)."""
