"""The user's repository on Hydra's config search path, before the packaged config.

Two Hydra plugins (found by Hydra's scan of ``hydra_plugins``, and registered explicitly by
:func:`hydra_plugins.transient_launcher.register.register_plugins` for installs the scan cannot see):

- :class:`UserRepoSearchPathPlugin` puts ``userrepo://<root>`` in front of the packaged config
  (``pkg://orchestrator.conf``) when the command runs inside a user repository
  (:func:`orchestrator.user_repo.user_root`);
- :class:`UserRepoConfigSource` reads that root as one config tree: group ``experiment`` from
  ``<root>/experiments/`` (and ``<root>/conf/experiment/``), every other group from
  ``<root>/conf/<group>/``. Files at the top of ``conf/`` are not read: the primary config is
  the packaged one.

An experiment defined twice in the repository (``experiments/x.yaml`` and
``conf/experiment/x.yaml``) is an error naming both files; a user file of the same name as a
packaged one is simply found first.
"""

# No `from __future__ import annotations`: Hydra's scanner runs this module before it is in
# sys.modules (see parallel.py).
import os
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from orchestrator import user_repo

_FILTERED = ("__pycache__", "__init__.py")


class UserRepoSearchPathPlugin(SearchPathPlugin):
    """Prepends the user repository (or experiment files pinned by ``orchestrator.validate``)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if any(e.provider == user_repo.PROVIDER for e in search_path.get_path()):
            return  # registered by the scan and by hand: one entry is enough
        root = user_repo.user_root()
        if root is None and not user_repo.pinned_names():
            return
        path = f"{user_repo.SCHEME}://{root if root is not None else ''}"
        main = [e for e in search_path.get_path() if e.provider == "main"]
        if main:
            search_path.prepend(user_repo.PROVIDER, path, anchor=main[0].provider)
        else:
            search_path.append(user_repo.PROVIDER, path)


class UserRepoConfigSource(ConfigSource):
    """A user repository as a config tree (``experiments/`` is the ``experiment`` group)."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        self.root = Path(self.path) if self.path else None

    @staticmethod
    def scheme() -> str:
        return user_repo.SCHEME

    def _experiment_name(self, config_path: str) -> str | None:
        group, _, rest = config_path.partition("/")
        return rest if group == "experiment" and rest else None

    def _group_dirs(self, config_path: str) -> list[Path]:
        """The folders that make up group ``config_path`` ("" = the top of the tree)."""
        if self.root is None:
            return []
        conf = self.root / user_repo.CONF
        if config_path == "":
            return [conf] if conf.is_dir() else []
        group, _, rest = config_path.partition("/")
        if group == "experiment":
            return [d / rest if rest else d for d in user_repo.experiment_dirs(self.root)
                    if (d / rest).is_dir()]
        return [conf / config_path] if (conf / config_path).is_dir() else []

    def _files(self, config_path: str) -> list[Path]:
        """The files defining config ``config_path`` (without ``.yaml``)."""
        name = self._experiment_name(config_path)
        if name is not None:
            return user_repo.experiment_candidates(self.root, name)
        if "/" not in config_path or self.root is None:
            return []  # top-level files would replace the packaged primary config
        path = self.root / user_repo.CONF / f"{config_path}.yaml"
        return [path] if path.is_file() else []

    @staticmethod
    def _strip(config_path: str) -> str:
        return config_path[:-len(".yaml")] if config_path.endswith(".yaml") else config_path

    def load_config(self, config_path: str) -> ConfigResult:
        files = self._files(self._strip(config_path))
        if not files:
            raise ConfigLoadError(f"Config not found : {config_path}")
        if len(files) > 1:
            name = self._experiment_name(self._strip(config_path)) or config_path
            raise user_repo.ambiguity_error(name, files)
        with open(files[0], encoding="utf-8") as f:
            try:
                header = ConfigSource._get_header_dict(f.read(512))
                f.seek(0)
                cfg = OmegaConf.load(f)  # the file as the stream: YAML errors name it
            except UnicodeDecodeError as ex:  # a binary file, or another encoding
                raise user_repo.not_text_error(files[0], ex) from None
        return ConfigResult(config=cfg, path=f"{self.scheme()}://{self.path}",
                            provider=self.provider, header=header)

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        if config_path == "":
            return True
        if config_path == "experiment" and user_repo.pinned_names():
            return True
        return bool(self._group_dirs(config_path))

    def is_config(self, config_path: str) -> bool:
        return bool(self._files(self._strip(config_path)))

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        names: set = set()
        want_groups = results_filter in (None, ObjectType.GROUP)
        want_configs = results_filter in (None, ObjectType.CONFIG)
        if config_path == "" and want_groups and (
                user_repo.pinned_names() or (self.root and user_repo.experiment_dirs(self.root))):
            names.add("experiment")
        for folder in self._group_dirs(config_path):
            for entry in os.listdir(folder):
                if entry in _FILTERED or entry.startswith("."):
                    continue
                full = folder / entry
                if full.is_dir() and want_groups:
                    names.add(entry)
                elif (config_path and want_configs and full.is_file()
                      and entry.endswith(".yaml")):
                    names.add(entry[:-len(".yaml")])
        if config_path == "experiment" and want_configs:
            names.update(user_repo.pinned_names())
        return sorted(names)


def register(*extra: type) -> None:
    """Register this module's two plugins (and ``extra`` plugin classes) with Hydra, each
    unless Hydra's scan found it already (see
    :func:`hydra_plugins.transient_launcher.register.register_plugins`)."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # scans first, so what it finds is not registered twice
    known = {f"{c.__module__}.{c.__name__}" for c in plugins.discover()}
    for clazz in (UserRepoSearchPathPlugin, UserRepoConfigSource, *extra):
        if f"{clazz.__module__}.{clazz.__name__}" not in known:
            plugins.register(clazz)
