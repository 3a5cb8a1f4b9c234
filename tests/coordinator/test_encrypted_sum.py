"""The blind running sum of an encrypted mean: duplicates, bad reports, limits."""

from __future__ import annotations

import pytest

from ursa.coordinator.aggregation import EmptyRoundError, UpdateOutcome
from ursa.coordinator.encrypted_sum import (
    ReportError,
    add_report,
    finalize_encrypted_sum,
    init_encrypted_sum,
    parse_report,
)
from ursa.crypto.errors import CiphertextError, KeyMismatchError
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    add_encrypted,
    decrypt_real_sum,
    encrypt_reals,
    generate_keypair,
)
from ursa.edge_sdk.methods.climb import dual as device_climb

CONFIG = device_climb.ClimbConfig(max_parties=10)
"""A two-value codec the devices already use (CLIMB's dual report)."""

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


def _encrypt(public: PaillierPublicKey, *values: float) -> bytes:
    vector = encrypt_reals(public, CONFIG.codec(), CONFIG.max_parties, list(values))
    return vector.to_bytes(public)


def test_the_sum_of_three_values_decrypts_to_the_plaintext_sums(keys: Keys) -> None:
    public, secret = keys
    state = init_encrypted_sum(public, max_parties=10, length=3)
    for i, values in enumerate([(1.0, 2.0, 3.0), (0.5, -1.0, 0.25)]):
        state, outcome = add_report(state, f"d{i}", _encrypt(public, *values))
        assert outcome is UpdateOutcome.ACCEPTED

    summed = finalize_encrypted_sum(state)

    assert summed.num_parties == 2 and state.num_reports == 2
    totals = decrypt_real_sum(secret, CONFIG.codec(), CONFIG.max_parties, summed)
    assert totals == pytest.approx([1.5, 1.0, 3.25], abs=1e-6)


def test_duplicate_report_is_ignored(keys: Keys) -> None:
    public, _ = keys
    state = init_encrypted_sum(public, max_parties=10, length=2)
    state, _ = add_report(state, "d0", _encrypt(public, 1.0, 0.0))
    again, outcome = add_report(state, "d0", _encrypt(public, 9.0, 0.0))
    assert outcome is UpdateOutcome.DUPLICATE
    assert again is state


def test_bad_reports_are_rejected(keys: Keys) -> None:
    public, _ = keys
    other_public, _ = generate_keypair(512)
    one = encrypt_reals(public, CONFIG.codec(), CONFIG.max_parties, [1.0, 0.0])
    two_parties = add_encrypted(public, one, one).to_bytes(public)
    state = init_encrypted_sum(public, max_parties=10, length=2)

    with pytest.raises(ReportError, match="2 values"):
        parse_report(public, _encrypt(public, 1.0, 2.0, 3.0), 2)
    with pytest.raises(CiphertextError, match="parties"):
        add_report(state, "d", two_parties)
    with pytest.raises(CiphertextError):
        add_report(state, "d", _encrypt(public, 1.0, 0.0)[:-3])
    with pytest.raises(KeyMismatchError):
        add_report(state, "d", _encrypt(other_public, 1.0, 0.0))


def test_party_limit_and_empty_sum(keys: Keys) -> None:
    public, _ = keys
    state = init_encrypted_sum(public, max_parties=1, length=2)
    with pytest.raises(EmptyRoundError):
        finalize_encrypted_sum(state)
    state, _ = add_report(state, "a", _encrypt(public, 1.0, 0.0))
    with pytest.raises(ReportError, match="max_parties"):
        add_report(state, "b", _encrypt(public, 1.0, 0.0))
    with pytest.raises(ReportError):
        init_encrypted_sum(public, max_parties=0, length=2)
    with pytest.raises(ReportError):
        init_encrypted_sum(public, max_parties=1, length=0)
