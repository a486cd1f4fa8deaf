"""This project's Hydra plugins: the launcher ``hydra/launcher=parallel`` (parallel.py) and the
user's repository on the config search path (user_repo.py).

The orchestrator's entry points (``python -m orchestrator``, the validate command, the
simulator's composer) import only :func:`register_plugins`; the plugin modules import the
orchestrator, never the other way round, so the import graph has no circle.
"""


def register_plugins() -> None:
    """Register these plugins with Hydra directly (the entry points call it before composing).

    Hydra finds plugins by scanning the ``hydra_plugins`` namespace package, which an editable
    install (a path hook, not a folder on ``sys.path``) hides from it when the command runs
    outside the checkout. Registering them here works for every kind of install; a plugin the
    scan already found is not registered twice.
    """
    from hydra.core.plugins import Plugins

    from hydra_plugins.transient_launcher import parallel, user_repo

    plugins = Plugins.instance()  # scans first, so what it finds is not registered twice
    known = {f"{c.__module__}.{c.__name__}" for c in plugins.discover()}
    for clazz in (parallel.ParallelLauncher, user_repo.UserRepoSearchPathPlugin,
                  user_repo.UserRepoConfigSource):
        if f"{clazz.__module__}.{clazz.__name__}" not in known:
            plugins.register(clazz)
