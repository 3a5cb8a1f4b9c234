"""Dubhe's records in the store: one row per answer, its natural key, a round."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.coordinator.methods.dubhe.test_selection import FakeContext
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.dubhe.records import DubheRecords, DubheRound, natural_key
from ursa.coordinator.store import CoordinatorStore, NaturalKey
from ursa.crypto.paillier_keys import generate_keypair
from ursa.protocol.messages import EncryptedDistribution, Heartbeat, Volunteer


def test_a_round_round_trips_and_other_rounds_stay_apart(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    records = DubheRecords(store)
    records.add_volunteer(1, "a", (True, False))
    records.add_volunteer(2, "b", (False, True))
    records.set_tries(1, (("a",), ("b", "c")))
    records.add_distribution(1, "a", b"\x00ciphertexts")
    records.set_candidates(1, (1, 0))
    store.close()

    store = CoordinatorStore(tmp_path / "c.sqlite3")
    records = DubheRecords(store)
    assert records.round(1) == DubheRound(
        volunteers={"a": (True, False)},
        tries=(("a",), ("b", "c")),
        distributions={"a": b"\x00ciphertexts"},
        candidates=(1, 0),
    )
    assert records.round(2).volunteers == {"b": (False, True)}
    assert records.round(3) == DubheRound({}, None, {}, None)
    assert (records.volunteer_count(1), records.volunteer_count(3)) == (1, 0)
    store.close()


def test_an_answer_is_its_own_de_duplication(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    records = DubheRecords(store)
    volunteer = Volunteer(federation="f", round=1, sender="a", draws=(True,))
    distribution = EncryptedDistribution(
        federation="f", round=1, sender="a", distribution=b"x"
    )
    assert not store.is_duplicate(volunteer.message_id, natural_key(volunteer))
    records.add_volunteer(1, "a", volunteer.draws)
    fresh = volunteer.model_copy(update={"message_id": "fresh"})
    assert store.is_duplicate(fresh.message_id, natural_key(fresh))
    later = Volunteer(federation="f", round=2, sender="a", draws=(True,))
    assert not store.is_duplicate(later.message_id, natural_key(later))
    assert not store.is_duplicate("d", natural_key(distribution))  # another kind
    records.add_distribution(1, "a", b"x")
    assert store.is_duplicate("d", natural_key(distribution))
    store.close()


def test_the_selection_names_the_keys_of_its_own_messages_only(
    tmp_path: Path,
) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    public_key, _ = generate_keypair(512)
    dubhe = DubheSelection(
        FakeContext(store, public_key),
        tries=1,
        num_classes=2,
        volunteer_s=1,
        distributions_s=1,
        agent_s=1,
    )
    volunteer = Volunteer(federation="f", round=4, sender="a", draws=(True,))
    assert dubhe.natural_key(volunteer) == NaturalKey.method_row(
        "dubhe", "volunteers.4", "a"
    )
    heartbeat = Heartbeat(federation="f", round=4, sender="a", seq=1)
    assert dubhe.natural_key(heartbeat) is None
    store.close()


def test_damaged_draws_are_a_typed_error(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    store.add_method_row("dubhe", "volunteers.1", "a", b'{"not": "a list"}')
    with pytest.raises(ValueError, match="not a list"):
        DubheRecords(store).round(1)
    store.close()
