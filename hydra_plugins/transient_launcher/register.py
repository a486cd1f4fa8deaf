"""The entry points' one call that registers this package's plugins (its own module: the
package's ``__init__`` holds no code, so importing :mod:`.user_repo` alone, as the simulator's
composer does, ties it to nothing else)."""


def register_plugins() -> None:
    """Register these plugins with Hydra directly (the entry points call it before composing).

    Hydra finds plugins by scanning the ``hydra_plugins`` namespace package, which an editable
    install (a path hook, not a folder on ``sys.path``) hides from it when the command runs
    outside the checkout. Registering them here works for every kind of install; a plugin the
    scan already found is not registered twice. Code below the entry points that only composes
    (the simulator's composer) registers the user's repository alone
    (:func:`hydra_plugins.transient_launcher.user_repo.register`): the launcher imports the
    orchestrator's sweep code, which imports the simulator.
    """
    from hydra_plugins.transient_launcher import parallel, user_repo

    user_repo.register(parallel.ParallelLauncher)
