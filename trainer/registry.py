"""One registry helper for every "select by name" table of the project, with one error type.

TensorFlow-free and dependency-free, so the trainer (models, problems), the orchestrator
(recovery and sync policies, revocation models) and the provisioning backends can all use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name no registry entry has; the message lists the valid ones."""

    def __init__(self, kind: str, name: object, valid: list[str]) -> None:
        super().__init__(f"unknown {kind} {name!r} ({', '.join(valid)})")
        self.kind, self.name, self.valid = kind, name, valid


class Registry(Generic[T]):
    """Entries by name. `kind` names what is registered in error messages ("recovery
    policy"). Registering a name again replaces the entry (a test may swap one in)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove an entry (a test's own); unknown names are ignored."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry; raises UnknownNameError listing the valid names."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
