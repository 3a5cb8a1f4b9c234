from __future__ import annotations

import math

import numpy as np
import pytest

from ursa.coordinator.encrypted_sum import add_report, finalize_encrypted_sum
from ursa.coordinator.methods.climb.dual_sum import init_dual_sum
from ursa.crypto.paillier import encrypt_reals, encrypted_vector_from, generate_keypair
from ursa.edge_sdk.mean_bounds import ImplausibleSumError
from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    ClimbError,
    DualMeans,
    apply_dual_means,
    apply_dual_means_all,
    decrypt_dual_means,
    dual_means,
    encrypt_dual_report,
    plain_dual_means,
    report_values,
)

CONFIG = ClimbConfig(eta_d=0.1, epsilon=0.002, lambda_max=5.0, max_parties=50)


@pytest.fixture(scope="module")
def keys():  # type: ignore[no-untyped-def]
    return generate_keypair(512)  # test-only key size: the logic, not the security


def test_dual_step_by_hand() -> None:
    means = DualMeans(mean_loss=1.0, mean_lambda=0.25, num_parties=4)

    step = apply_dual_means(0.5, 2.0, means, CONFIG)

    assert step.weight == pytest.approx(1.25)
    assert step.next_lambda == pytest.approx(0.5 + 0.1 * (2.0 - 1.0 - 0.002))


def test_lambda_is_clipped_to_zero_and_the_cap() -> None:
    means = DualMeans(mean_loss=10.0, mean_lambda=0.0, num_parties=2)
    assert apply_dual_means(0.1, 0.0, means, CONFIG).next_lambda == 0.0
    high = DualMeans(mean_loss=0.0, mean_lambda=0.0, num_parties=2)
    assert apply_dual_means(4.9, 900.0, high, CONFIG).next_lambda == 5.0


def test_unclipped_weights_of_the_reporters_sum_to_their_number() -> None:
    rng = np.random.default_rng(0)
    losses, lambdas = rng.uniform(0, 3, 20), rng.uniform(0, 1, 20)
    means = plain_dual_means(losses, lambdas, CONFIG)

    weights, _ = apply_dual_means_all(losses, lambdas, means, CONFIG)

    assert weights.sum() == pytest.approx(20.0)
    np.testing.assert_allclose(weights, 1.0 + lambdas - lambdas.mean())


def test_the_weight_is_clipped_to_zero_and_one_plus_the_cap() -> None:
    below = DualMeans(mean_loss=1.0, mean_lambda=3.0, num_parties=10)
    assert apply_dual_means(0.0, 1.0, below, CONFIG).weight == 0.0
    forged = DualMeans(mean_loss=1.0, mean_lambda=-50.0, num_parties=10)
    assert apply_dual_means(5.0, 1.0, forged, CONFIG).weight == CONFIG.max_weight
    assert CONFIG.max_weight == 1.0 + CONFIG.lambda_max


def _run(keys, encrypted: bool, steps: int = 4) -> np.ndarray:  # type: ignore[no-untyped-def]
    public, secret = keys
    rng = np.random.default_rng(1)
    lambdas = np.zeros(6)
    for _ in range(steps):
        losses = rng.uniform(0.0, 4.0, lambdas.size)
        if encrypted:
            state = init_dual_sum(public, max_parties=CONFIG.max_parties)
            for i, (f, lam) in enumerate(zip(losses, lambdas, strict=True)):
                report = encrypt_dual_report(public, CONFIG, float(f), float(lam))
                state, _ = add_report(state, f"d{i}", report.to_bytes(public))
            wire = finalize_encrypted_sum(state).to_bytes(public)  # down to the devices
            means = decrypt_dual_means(
                secret, CONFIG, encrypted_vector_from(wire, public)
            )
            assert means.num_parties == lambdas.size
        else:
            means = plain_dual_means(losses, lambdas, CONFIG)
        steps_out = [
            apply_dual_means(float(lam), float(f), means, CONFIG)
            for f, lam in zip(losses, lambdas, strict=True)
        ]
        lambdas = np.array([s.next_lambda for s in steps_out])
    return lambdas


def test_encrypted_path_matches_plaintext_after_bytes_round_trip(keys) -> None:  # type: ignore[no-untyped-def]
    plain = _run(keys, encrypted=False)
    enc = _run(keys, encrypted=True)

    assert plain.max() > 0  # the constraint was active for someone
    np.testing.assert_allclose(enc, plain, atol=1e-6)


def test_decrypted_means_are_within_fixed_point_precision(keys) -> None:  # type: ignore[no-untyped-def]
    public, secret = keys
    values = [(0.123456789, 1.5), (2.5, 0.0), (999.0, 4.25)]
    reports = [encrypt_dual_report(public, CONFIG, f, lam) for f, lam in values]
    state = init_dual_sum(public, max_parties=CONFIG.max_parties)
    for i, r in enumerate(reports):
        state, _ = add_report(state, str(i), r.to_bytes(public))

    means = decrypt_dual_means(secret, CONFIG, finalize_encrypted_sum(state))

    assert means.mean_loss == pytest.approx((0.123456789 + 2.5 + 999.0) / 3, abs=2**-24)
    assert means.mean_lambda == pytest.approx(5.75 / 3, abs=2**-24)


def test_loss_above_the_bound_is_clipped_and_bad_values_raise() -> None:
    np.testing.assert_array_equal(
        report_values(5000.0, 1.0, CONFIG), [CONFIG.loss_bound, 1.0]
    )
    for loss, lam in [(-0.1, 0.0), (math.nan, 0.0), (1.0, -0.5), (1.0, 5.5)]:
        with pytest.raises(ClimbError):
            report_values(loss, lam, CONFIG)
    with pytest.raises(ClimbError):
        plain_dual_means([1.0, 2.0], [0.0], CONFIG)


def test_a_sum_of_the_wrong_length_is_refused(keys) -> None:  # type: ignore[no-untyped-def]
    public, secret = keys
    three = encrypt_reals(public, CONFIG.codec(), CONFIG.max_parties, [1.0, 2.0, 3.0])
    with pytest.raises(ClimbError, match="2 values"):
        decrypt_dual_means(secret, CONFIG, three)


def test_dual_means_of_a_sum_no_honest_fleet_makes_are_refused() -> None:
    k = 4
    assert dual_means([k * 1000.0, k * 5.0], k, CONFIG).mean_lambda == 5.0
    assert dual_means([0.0, 0.0], k, CONFIG) == DualMeans(0.0, 0.0, k)
    for totals in ([0.0, k * 5.0 + 1e-3], [0.0, -1e-3], [k * 1000.0 + 1.0, 0.0]):
        with pytest.raises(ImplausibleSumError, match="honest reports sum to"):
            dual_means(totals, k, CONFIG)


def test_a_forged_lambda_slot_decrypts_to_a_refusal(keys) -> None:  # type: ignore[no-untyped-def]
    public, secret = keys
    state = init_dual_sum(public, max_parties=CONFIG.max_parties)
    honest = encrypt_dual_report(public, CONFIG, 0.5, 0.0)
    huge = encrypt_reals(public, CONFIG.codec(), CONFIG.max_parties, [0.5, 999.0])
    for i, report in enumerate((honest, huge)):  # 999 fits the codec, not lambda
        state, _ = add_report(state, f"d{i}", report.to_bytes(public))

    with pytest.raises(ImplausibleSumError, match="slot 1 sums to 999 over 2"):
        decrypt_dual_means(secret, CONFIG, finalize_encrypted_sum(state))
