"""CLIMB's dual reports summed blind: the plaintext sums, the device's length."""

from __future__ import annotations

import pytest

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.encrypted_sum import (
    ReportError,
    add_report,
    finalize_encrypted_sum,
)
from ursa.coordinator.methods.climb.dual_sum import (
    init_dual_sum,
    sum_dual_reports,
)
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_real_sum,
    encrypt_reals,
    generate_keypair,
)
from ursa.edge_sdk.methods.climb import dual as device_climb

CONFIG = device_climb.ClimbConfig(max_parties=10)

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


def _report(public: PaillierPublicKey, f: float, lam: float) -> bytes:
    return device_climb.encrypt_dual_report(public, CONFIG, f, lam).to_bytes(public)


def test_running_sum_decrypts_to_the_plaintext_sums(keys: Keys) -> None:
    public, secret = keys
    values = [(0.5, 0.0), (1.25, 2.0), (3.0, 0.75)]
    state = init_dual_sum(public, max_parties=CONFIG.max_parties)
    for i, (f, lam) in enumerate(values):
        state, outcome = add_report(state, f"d{i}", _report(public, f, lam))
        assert outcome is UpdateOutcome.ACCEPTED

    summed = finalize_encrypted_sum(state)
    totals = decrypt_real_sum(secret, CONFIG.codec(), CONFIG.max_parties, summed)

    assert summed.num_parties == 3 and state.num_reports == 3
    assert totals[0] == pytest.approx(4.75, abs=1e-6)
    assert totals[1] == pytest.approx(2.75, abs=1e-6)
    reports = [device_climb.encrypt_dual_report(public, CONFIG, *v) for v in values]
    again = decrypt_real_sum(
        secret, CONFIG.codec(), CONFIG.max_parties, sum_dual_reports(public, reports)
    )
    assert again == pytest.approx(totals, abs=1e-9)


def test_a_report_of_another_length_is_refused(keys: Keys) -> None:
    public, _ = keys
    three = encrypt_reals(public, CONFIG.codec(), CONFIG.max_parties, [1.0, 2.0, 3.0])
    one = device_climb.encrypt_dual_report(public, CONFIG, 1.0, 0.0)
    state = init_dual_sum(public, max_parties=CONFIG.max_parties)

    with pytest.raises(ReportError, match="2 values"):
        add_report(state, "d", three.to_bytes(public))
    with pytest.raises(ReportError, match="length 3"):
        sum_dual_reports(public, [one, three])
