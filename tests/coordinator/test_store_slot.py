"""StoreSlot: empty until the runtime fills it once; a typed error before."""

from __future__ import annotations

from pathlib import Path

import pytest

from ursa.coordinator.store import CoordinatorStore
from ursa.coordinator.store_slot import StoreNotOpenError, StoreSlot


def test_the_slot_refuses_before_it_is_filled_and_keeps_one_store(
    tmp_path: Path,
) -> None:
    slot = StoreSlot()
    assert not slot.is_open
    with pytest.raises(StoreNotOpenError, match="not open yet"):
        _ = slot.store
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    slot.fill(store)
    assert slot.is_open and slot.store is store
    other = CoordinatorStore(tmp_path / "d.sqlite3")
    with pytest.raises(RuntimeError, match="open already"):
        slot.fill(other)
    assert slot.store is store
    other.close()
    store.close()
