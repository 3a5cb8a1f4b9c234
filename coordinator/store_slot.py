"""The coordinator's store as its components hold it: handed at wiring, open at start.

The runtime wires its components before it starts, and opens the store only
when it starts (`ursa.coordinator.service.CoordinatorService.start`). Each
component that persists is handed the one `StoreSlot` the runtime owns, and
reads `StoreSlot.store` when it needs the store; the runtime fills the slot
once, when it opens the store. A component used before that is a wiring
bug: it gets a `StoreNotOpenError`, not a None to check.
"""

from __future__ import annotations

from ursa.coordinator.store import CoordinatorStore

__all__ = ["StoreNotOpenError", "StoreSlot"]


class StoreNotOpenError(RuntimeError):
    """A component asked for the store before the runtime opened it."""


class StoreSlot:
    """Where the runtime's one `CoordinatorStore` is, once it is open."""

    def __init__(self) -> None:
        self._store: CoordinatorStore | None = None

    def fill(self, store: CoordinatorStore) -> None:
        """The runtime opened ``store`` (once).

        Raises:
            RuntimeError: the slot holds a store already.
        """
        if self._store is not None:
            raise RuntimeError("the coordinator's store is open already")
        self._store = store

    @property
    def is_open(self) -> bool:
        """Whether the runtime has opened the store."""
        return self._store is not None

    @property
    def store(self) -> CoordinatorStore:
        """The open store.

        Raises:
            StoreNotOpenError: the runtime has not started yet.
        """
        if self._store is None:
            raise StoreNotOpenError("the coordinator's store is not open yet")
        return self._store
