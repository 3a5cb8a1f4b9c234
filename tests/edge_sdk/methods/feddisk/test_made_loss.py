from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.encrypted_sum import add_report, init_encrypted_sum
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import (
    encrypt_reals,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk.mean_bounds import ImplausibleSumError
from ursa.edge_sdk.methods.feddisk.made_loss import (
    MadeLossCodec,
    MadeLossError,
    decrypt_fleet_loss,
    encrypt_made_loss,
    fleet_loss,
    loss_report_values,
)
from ursa.edge_sdk.methods.feddisk.made_stopper import weighted_mean_loss
from ursa.protocol.messages import MADE_LOSS_LENGTH


@pytest.fixture(scope="module")
def keys():  # type: ignore[no-untyped-def]
    return generate_keypair(512)  # test-only key size: the logic, not the security


def test_encrypted_sum_after_bytes_round_trip_equals_plaintext_weighted_mean(
    keys,  # type: ignore[no-untyped-def]
) -> None:
    public, secret = keys
    codec = MadeLossCodec()
    losses, counts = [12.5, -3.25, 40.0, 7.125], [9, 30, 1, 17]
    state = init_encrypted_sum(
        public, max_parties=codec.max_parties, length=MADE_LOSS_LENGTH
    )
    for i, (loss, n) in enumerate(zip(losses, counts, strict=True)):
        wire = encrypt_made_loss(public, codec, loss, n).to_bytes(public)
        state, _ = add_report(state, f"dev{i}", wire)
    assert state.total is not None
    summed = encrypted_vector_from(state.total.to_bytes(public), public)

    fleet = decrypt_fleet_loss(secret, codec, summed)

    assert fleet.num_parties == 4
    assert fleet.num_examples == sum(counts)
    assert fleet.mean_nll == pytest.approx(weighted_mean_loss(losses, counts), abs=1e-6)


def test_report_clips_a_diverged_loss_and_refuses_bad_sizes() -> None:
    codec = MadeLossCodec(loss_bound=100.0, max_examples=50)

    assert loss_report_values(1e9, 2, codec).tolist() == [200.0, 2.0]
    assert loss_report_values(-1e9, 1, codec).tolist() == [-100.0, 1.0]
    for bad_loss, n in ((float("nan"), 3), (float("inf"), 3), (1.0, 0), (1.0, 51)):
        with pytest.raises(MadeLossError):
            loss_report_values(bad_loss, n, codec)


def test_decrypt_refuses_a_sum_of_the_wrong_shape_or_key(
    keys,  # type: ignore[no-untyped-def]
) -> None:
    public, secret = keys
    codec = MadeLossCodec()
    three = encrypt_made_loss(public, codec, 1.0, 3)
    other_public, _ = generate_keypair(512)
    foreign = encrypt_made_loss(other_public, codec, 1.0, 3)
    wrong_length = encrypt_reals(
        public, codec.codec(), codec.max_parties, np.array([1.0, 2.0, 3.0])
    )

    assert decrypt_fleet_loss(secret, codec, three).mean_nll == pytest.approx(1.0)
    with pytest.raises(MadeLossError):
        decrypt_fleet_loss(secret, codec, wrong_length)
    with pytest.raises(CryptoError):
        decrypt_fleet_loss(secret, codec, foreign)


@pytest.mark.parametrize(
    ("totals", "parties", "reason"),
    [
        ([10.0, 1.0], 2, r"slot 1 sums to 1 over 2 parties"),  # n >= 1 each
        ([0.0, 101.0], 2, r"slot 1 sums to 101 over 2 parties"),  # n <= 50 each
        ([-301.0, 3.0], 2, r"a mean beyond the bound 100"),  # |nll| <= 100
        ([1e4 + 1.0, 100.0], 2, r"slot 0 sums to 10001 over 2"),
    ],
)
def test_a_loss_sum_no_honest_fleet_reports_is_refused(
    totals: list[float], parties: int, reason: str
) -> None:
    codec = MadeLossCodec(loss_bound=100.0, max_examples=50)
    with pytest.raises(ImplausibleSumError, match=reason):
        fleet_loss(totals, parties, codec)


def test_an_honest_loss_sum_at_the_bound_gives_the_bound() -> None:
    codec = MadeLossCodec(loss_bound=100.0, max_examples=50)
    fleet = fleet_loss([-100.0 * 7, 7.0], 2, codec)
    assert (fleet.mean_nll, fleet.num_examples, fleet.num_parties) == (-100.0, 7.0, 2)
