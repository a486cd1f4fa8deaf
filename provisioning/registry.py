"""Select a provider backend by name (the Hydra `provider` group's `name`).

Backends register themselves with `register_provider` when their module is imported; modules are
imported lazily, on first use of their name, so `local` runs without any cloud SDK installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from provisioning.base import BadRequestError, Provider

DEFAULT_PROVIDER = "local"

# name -> module that registers it on import. Modules not present in this checkout are skipped.
_BACKEND_MODULES: dict[str, str] = {
    "local": "provisioning.local",
    "ssh": "provisioning.ssh",
    "gce": "provisioning.gce",
    "sim": "provisioning.sim",
}
_factories: dict[str, Callable[..., Provider]] = {}


def register_provider(name: str, factory: Callable[..., Provider]) -> None:
    """Make `get_provider(name, **options)` call `factory(**options)`. Re-registering replaces."""
    _factories[name] = factory


def provider_names() -> list[str]:
    """Every name `get_provider` accepts in this installation, sorted."""
    available = {name for name, module in _BACKEND_MODULES.items() if _module_exists(module)}
    return sorted(available | set(_factories))


def get_provider(name: str = DEFAULT_PROVIDER, **options: object) -> Provider:
    """A new provider of backend `name`, built with `options` (backend keyword arguments).

    Raises BadRequestError naming the valid backends for an unknown name, or the bad option
    when the backend does not accept one."""
    factory = _factory(name)
    try:
        return factory(**options)
    except TypeError as error:
        raise BadRequestError(f"provider.{name}: bad option: {error}") from error


def provider_class(name: str) -> type[Provider]:
    """The class of backend `name`, to read what it can do (`billed`, `plan_note`) without
    building one: the dry run asks too. A factory that is not a class answers as `Provider`."""
    factory = _factory(name)
    return factory if isinstance(factory, type) and issubclass(factory, Provider) else Provider


def _factory(name: str) -> Callable[..., Provider]:
    if (
        name not in _factories
        and name in _BACKEND_MODULES
        and _module_exists(_BACKEND_MODULES[name])
    ):
        importlib.import_module(_BACKEND_MODULES[name])
    factory = _factories.get(name)
    if factory is None:
        valid = ", ".join(provider_names())
        raise BadRequestError(f"provider: unknown provider {name!r} ({valid})")
    return factory


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
