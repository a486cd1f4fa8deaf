"""Select a provider backend by name (the Hydra `provider` group's `name`).

Backends register themselves with `register_provider(name, factory, config)` when their package
is imported; packages are imported lazily, on first use of their name, so `local` runs without
any cloud SDK installed. A package may name its factory as ``"module:Class"``: composing the
config (every backend's schema is stored at start) then imports only its light config module,
and the provider's module (paramiko, Google clients) loads when a provider is built or its
class is read. `config` is the backend's typed schema (a `ProviderConfig` subclass
living next to the backend); `orchestrator/config/schema.py` stores each one in Hydra's
ConfigStore so `provider=<name>` composes against it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from provisioning.base import (
    DATA_DIR_FIELD,
    BadFieldError,
    BadRequestError,
    Provider,
    ProviderConfig,
    ResourceJournal,
    url_scheme,
)
from trainer.registry import Registry, UnknownNameError

DEFAULT_PROVIDER = "local"

# name -> module that registers it on import. Modules not present in this checkout are skipped.
_BACKEND_MODULES: dict[str, str] = {
    "local": "provisioning.local",
    "ssh": "provisioning.ssh",
    "gce": "provisioning.gce",
    "sim": "provisioning.sim",
}


@dataclass(frozen=True)
class Backend:
    """A registered backend: `factory(config, journal=...)` builds its provider; `provider`
    is the class (its `can_revoke` is read at validation, before anything is built). `target`
    is the factory or its ``"module:attribute"`` path, imported on first use."""

    name: str
    target: Callable[..., Provider] | str
    config: type[ProviderConfig]

    @property
    def factory(self) -> Callable[..., Provider]:
        if not isinstance(self.target, str):
            return self.target
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)

    @property
    def provider(self) -> type[Provider]:
        factory = self.factory
        return factory if isinstance(factory, type) and issubclass(factory, Provider) else Provider


class UnknownProviderError(BadRequestError, UnknownNameError):
    """`provider.name` names no backend of this installation (the project's one registry
    error, and a bad request to the provisioning layer)."""


_backends: Registry[Backend] = Registry("provider")


def register_provider(name: str, factory: type[Provider] | str,
                      config: type[ProviderConfig] = ProviderConfig) -> None:
    """Make `get_provider(name, cfg)` call `factory(cfg, journal=...)`; `factory` may be a
    ``"module:Class"`` path, imported when first needed. Re-registering replaces."""
    _backends.register(name, Backend(name, factory, config))


def unregister_provider(name: str) -> None:
    """Forget a registered backend (tests that register their own)."""
    _backends.unregister(name)


def provider_names() -> list[str]:
    """Every name `get_provider` accepts in this installation, sorted."""
    available = {name for name, module in _BACKEND_MODULES.items() if _module_exists(module)}
    return sorted(available | set(_backends.names()))


def backend(name: str) -> Backend:
    """The registered backend `name`, importing its module on first use.

    Raises BadRequestError naming the valid backends for an unknown name."""
    module = _BACKEND_MODULES.get(name)
    if name not in _backends and module is not None and _module_exists(module):
        importlib.import_module(module)
    if name not in _backends:
        raise UnknownProviderError("provider", name, provider_names())
    return _backends.get(name)


def all_backends() -> list[Backend]:
    """Every backend this installation has (their modules imported)."""
    return [backend(name) for name in provider_names()]


def get_provider(name: str = DEFAULT_PROVIDER, config: ProviderConfig | Mapping[str, Any] | None
                 = None, *, journal: ResourceJournal | None = None,
                 **options: object) -> Provider:
    """A new provider of backend `name`, built with its typed `config` (None = defaults; a
    mapping, e.g. a run's resolved `provider` section, is converted) and `options` (config
    fields to override).

    Raises BadRequestError naming the valid backends for an unknown name, or naming the bad
    option when the backend's config has no such field."""
    found = backend(name)
    if config is None or isinstance(config, Mapping):
        config = make_config(name, {**(config or {}), **options})
    elif options:
        config = make_config(name, {**dataclasses.asdict(config), **options})
    return found.factory(config, journal=journal)


def make_config(name: str, values: Mapping[str, Any]) -> ProviderConfig:
    """The backend's config dataclass from plain values (unknown keys: BadRequestError)."""
    from omegaconf import OmegaConf  # converts nested records (an inventory) and checks types

    cls = backend(name).config
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise BadRequestError(f"provider.{unknown[0]}: not an option of provider {name!r} "
                              f"({', '.join(sorted(known))})")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), {**values, "name": name})
        config = OmegaConf.to_object(merged)
    except Exception as error:  # OmegaConf's ValidationError and friends
        key = getattr(error, "full_key", "") or "?"
        raise BadRequestError(f"provider.{key}: {str(error).splitlines()[0]}") from error
    assert isinstance(config, cls)
    return config


def provider_class(name: str) -> type[Provider]:
    """The class of backend `name`, to read what it can do (`billed`, `plan_note`) without
    building one: the dry run asks too."""
    return backend(name).provider


def dataset_reader(url: str, preferred: str = DEFAULT_PROVIDER) -> type[Provider]:
    """The backend class whose `fetch_dataset` reads the `job.data_dir` `url`: backend
    `preferred` (the run's) for a local path or a scheme it lists in `dataset_schemes`, else
    the first backend that lists the scheme (a `gs://` dataset on a local run: it is downloaded
    to this machine whichever backend runs the hosts).

    Raises BadFieldError for `job.data_dir` naming the schemes this installation reads."""
    scheme = url_scheme(url)
    own = provider_class(preferred)
    if scheme is None or scheme in own.dataset_schemes:
        return own
    readers = {name: backend(name).provider for name in provider_names() if name != preferred}
    for reader in readers.values():
        if scheme in reader.dataset_schemes:
            return reader
    known = sorted(f"{s}:// ({name})" for name, cls in {preferred: own, **readers}.items()
                   for s in cls.dataset_schemes)
    raise BadFieldError(DATA_DIR_FIELD, f"no provider reads {scheme}:// URLs, only "
                        f"{''.join(k + ', ' for k in known)}and local folders")


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
