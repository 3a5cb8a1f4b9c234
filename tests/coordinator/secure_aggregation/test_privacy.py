"""The privacy ledger: epsilon of the distributed discrete Gaussian over rounds."""

from __future__ import annotations

import json
import math
import sys

import dp_accounting
import pytest

from ursa.coordinator.secure_aggregation.privacy import (
    AccountantUnavailableError,
    PrivacyLedger,
    PrivacyLedgerError,
    PrivacySpent,
    discrete_gaussian_tau,
)
from ursa.crypto.discrete_gaussian import DEFAULT_BETA, device_sigma


def _ledger(
    noise_multiplier: float = 1.0,
    *,
    parties: int = 10,
    dimension: int = 10_000,
    scale_bits: int = 16,
    clip: float = 1.0,
    rounding_beta: float = 0.0,
) -> PrivacyLedger:
    sigma_int = device_sigma(noise_multiplier, clip, 2.0**scale_bits, parties)
    return PrivacyLedger(
        noise_multiplier=noise_multiplier,
        delta=1e-5,
        parties=parties,
        dimension=dimension,
        sigma_int=sigma_int,
        rounding_beta=rounding_beta,
    )


def _gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return float(accountant.get_epsilon(delta))


def test_epsilon_decreases_with_more_noise() -> None:
    epsilons = [_ledger(z).record_round(0).total_epsilon for z in (0.5, 1.0, 2.0, 4.0)]
    assert epsilons == sorted(epsilons, reverse=True)
    assert len(set(epsilons)) == 4


def test_epsilon_grows_with_rounds() -> None:
    ledger = _ledger(1.0)

    spent = [ledger.record_round(index) for index in range(5)]

    totals = [s.total_epsilon for s in spent]
    assert totals == sorted(totals) and len(set(totals)) == 5
    assert [s.rounds for s in spent] == [1, 2, 3, 4, 5]
    assert all(s.round_epsilon == spent[0].total_epsilon for s in spent)
    assert all(s.delta == 1e-5 for s in spent)
    # RDP composes sub-linearly in epsilon: 5 rounds cost less than 5 x 1 round.
    assert spent[0].total_epsilon < totals[-1] < 5 * spent[0].total_epsilon


@pytest.mark.parametrize("rounds", [1, 10, 200])
@pytest.mark.parametrize("noise_multiplier", [0.7, 1.0, 3.0])
def test_large_integer_noise_matches_the_continuous_gaussian(
    noise_multiplier: float, rounds: int
) -> None:
    # 2**24 units per real unit: rounding adds sqrt(d) ~ 1e-4 relative, tau ~ 0.
    ledger = _ledger(noise_multiplier, scale_bits=24)

    epsilon = ledger.epsilon_after(rounds)

    expected = _gaussian_epsilon(noise_multiplier, rounds, 1e-5)
    assert epsilon >= expected  # never below the continuous mechanism
    assert epsilon == pytest.approx(expected, rel=1e-3)


def test_small_integer_noise_costs_more_than_the_gaussian() -> None:
    # sigma_int = 1: tau ~ 5e-4, times d = 10^4, dominates the RDP.
    ledger = PrivacyLedger(
        noise_multiplier=1.0, delta=1e-5, parties=10, dimension=10_000, sigma_int=1.0
    )
    assert ledger.tau == pytest.approx(discrete_gaussian_tau(1.0, 10))
    assert ledger.tau > 1e-4
    assert ledger.epsilon_after(1) > 2 * _gaussian_epsilon(1.0, 1, 1e-5)


def test_tau_is_zero_for_one_party_and_vanishes_with_sigma() -> None:
    assert discrete_gaussian_tau(1.0, 1) == 0.0
    assert discrete_gaussian_tau(3.0, 100) < 1e-30
    assert discrete_gaussian_tau(1.0, 2) == pytest.approx(10 * math.exp(-(math.pi**2)))


def test_conditional_rounding_tightens_the_sensitivity() -> None:
    plain = _ledger(1.0, scale_bits=8)
    conditional = _ledger(1.0, scale_bits=8, rounding_beta=DEFAULT_BETA)
    clip_int = 2.0**8

    assert plain.sensitivity_l2 == pytest.approx(clip_int + 100.0)  # + sqrt(10^4)
    assert clip_int < conditional.sensitivity_l2 < plain.sensitivity_l2
    assert conditional.epsilon_after(1) < plain.epsilon_after(1)


def test_no_noise_means_infinite_epsilon() -> None:
    ledger = PrivacyLedger(
        noise_multiplier=0.0, delta=1e-5, parties=5, dimension=100, sigma_int=0.0
    )

    spent = ledger.record_round(3)

    assert not ledger.is_private
    assert spent == PrivacySpent(math.inf, math.inf, 1e-5, 1)


def test_nothing_is_spent_before_the_first_round() -> None:
    spent = _ledger(1.0).spent
    assert spent.rounds == 0 and spent.total_epsilon == 0.0
    assert spent.round_epsilon > 0.0


def test_a_round_is_recorded_once() -> None:
    ledger = _ledger(1.0)
    ledger.record_round(7)
    with pytest.raises(PrivacyLedgerError, match="already"):
        ledger.record_round(7)
    assert ledger.spent.rounds == 1


def test_state_survives_a_json_round_trip() -> None:
    ledger = _ledger(1.3, rounding_beta=DEFAULT_BETA)
    for index in (0, 1, 4):
        ledger.record_round(index)

    restored = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))

    assert restored.to_dict() == ledger.to_dict()
    assert restored.rounds_recorded == (0, 1, 4)
    assert restored.spent == ledger.spent
    assert restored.record_round(5) == ledger.record_round(5)


@pytest.mark.parametrize(
    "change",
    [{"version": 99}, {"parties": "10"}, {"rounds": [1, 1]}, {"rounds": "0"},
     {"delta": 2.0}, {"noise_multiplier": True}],
)  # fmt: skip
def test_malformed_state_is_refused(change: dict[str, object]) -> None:
    state = {**_ledger(1.0).to_dict(), **change}
    with pytest.raises(PrivacyLedgerError):
        PrivacyLedger.from_dict(state)


def test_a_missing_key_is_refused() -> None:
    state = _ledger(1.0).to_dict()
    del state["sigma_int"]
    with pytest.raises(PrivacyLedgerError, match="sigma_int"):
        PrivacyLedger.from_dict(state)


@pytest.mark.parametrize(
    ("field", "value"),
    [("noise_multiplier", -1.0), ("delta", 0.0), ("delta", 1.0), ("parties", 0),
     ("dimension", 0), ("sigma_int", 0.4), ("rounding_beta", 1.0)],
)  # fmt: skip
def test_bad_parameters_are_refused(field: str, value: float) -> None:
    arguments: dict[str, float] = {
        "noise_multiplier": 1.0, "delta": 1e-5, "parties": 4, "dimension": 10,
        "sigma_int": 50.0, field: value,
    }  # fmt: skip
    with pytest.raises(PrivacyLedgerError, match=field):
        PrivacyLedger(**arguments)  # type: ignore[arg-type]


def test_missing_dp_accounting_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting", None)
    monkeypatch.setitem(sys.modules, "dp_accounting.rdp", None)

    with pytest.raises(AccountantUnavailableError, match=r"ursa-fl\[dp\]"):
        _ledger(1.0)
    # Without noise there is nothing to account: no dp-accounting needed.
    assert _ledger(0.0).spent.round_epsilon == math.inf
