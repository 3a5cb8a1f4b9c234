"""Fixtures the unit tests of Dubhe's steps share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.crypto.paillier_keys import generate_keypair


@pytest.fixture(scope="module")
def step_keys() -> tuple[PaillierPublicKey, PaillierSecretKey]:
    """A small Paillier key pair (the epoch's)."""
    return generate_keypair(512)


@pytest.fixture
def empty_store(tmp_path: Path) -> Iterator[CoordinatorStore]:
    """A fresh store with no round in it."""
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    yield store
    store.close()
