"""The privacy ledger: epsilon spent by the distributed discrete Gaussian, per round.

What the figure covers. Each released round sum is the sum, over at least
``parties`` devices (the secure-aggregation threshold), of an integer vector
of L2 norm at most ``sensitivity_l2`` plus each device's N_Z(0, sigma_int^2)
noise on every one of ``dimension`` coordinates. The ledger's (epsilon, delta)
is device-level DP for the sequence of released sums (and everything computed
from them, e.g. the global models) under the zero-out relation: one device's
whole contribution replaced by zeros, in every round it took part in. No
amplification by sampling is claimed: the coordinator knows who took part.

What it does not cover: devices that skip their noise or collude with the
coordinator (each colluder's noise is known to it; lower ``parties`` by the
number of colluders you tolerate), a contribution longer than the bound (the
device must clip before encoding), anything sent outside the masked vector
(metrics, weights in plaintext, the participation itself), and side channels.

The bound (Kairouz, Liu, Steinke, ICML 2021, Theorem 1 and Proposition 14).
Write ``n = parties``, ``d = dimension``, ``s = sensitivity_l2 / (sqrt(n)
sigma_int)`` and ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_int^2 k/(k+1))``.
For every order ``alpha >= 1`` one round is (alpha, r(alpha))-RDP with

    r(alpha) = min(alpha s^2 / 2 + tau d,  alpha (s + tau sqrt(d))^2 / 2).

The continuous Gaussian with the same std has ``alpha s^2 / 2``: the terms in
``tau`` are the correction for a sum of discrete Gaussians not being a discrete
Gaussian (for a single party, tau = 0 and this is Canonne-Kamath-Steinke's
bound). It needs sigma_int >= 1/2. tau is ~5e-4 at sigma_int = 1, ~2e-9 at
1.5 and ~7e-17 at 2 (nearly independent of n), so it matters only for small
integer noise, but it is always added. A sum over more than
``n`` devices is the n-device sum plus independent noise, so by
post-processing the same bound holds. RDP adds up over rounds (per order), and
dp-accounting's `compute_epsilon` converts it to epsilon at ``delta``.

The sensitivity in integer units. With ``sigma_int = device_sigma(z, clip,
2**scale_bits, n)`` the device's vector has L2 norm ``clip 2**scale_bits =
sigma_int sqrt(n) / z`` before rounding; rounding lengthens it to
`inflated_l2` of that (plain stochastic rounding: ``+ sqrt(d)``; conditional
rounding with ``rounding_beta``: the paper's tighter bound). The ledger uses
the inflated norm, so s is slightly above 1/z.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ursa.crypto.discrete_gaussian import inflated_l2

LEDGER_VERSION = 1
"""Version of the `PrivacyLedger.to_dict` layout."""

RDP_ORDERS: tuple[float, ...] = (
    *(1 + x / 10.0 for x in range(1, 100)),
    *(float(x) for x in range(11, 64)),
    128.0,
    256.0,
    512.0,
    1024.0,
)
"""RDP orders: dp-accounting's `RdpAccountant` defaults (fine for the Gaussian)."""

MIN_SIGMA_INT = 0.5
"""Theorem 1 of Kairouz et al. holds for a per-device integer std >= 1/2."""

DP_UNAVAILABLE = (
    "privacy accounting needs dp-accounting: install ursa-fl[dp] "
    "(pip install 'ursa-fl[dp]')"
)


class PrivacyLedgerError(ValueError):
    """Invalid ledger parameters, a malformed saved state or a repeated round."""


class AccountantUnavailableError(RuntimeError):
    """dp-accounting (the optional extra ``dp``) is not installed."""


def _compute_epsilon() -> Any:
    """Import dp-accounting lazily: the coordinator runs without it when DP is off."""
    try:
        from dp_accounting.rdp import compute_epsilon
    except ImportError as exc:
        raise AccountantUnavailableError(DP_UNAVAILABLE) from exc
    return compute_epsilon


def require_accountant() -> None:
    """Check, at start-up, that epsilon can be computed (DP is configured).

    Raises:
        AccountantUnavailableError: dp-accounting is not installed.
    """
    _compute_epsilon()


@dataclass(frozen=True)
class PrivacySpent:
    """Epsilon at ``delta``: of one round alone, and of ``rounds`` rounds composed.

    Both are ``inf`` when the noise multiplier is 0 (no noise, no guarantee).
    """

    round_epsilon: float
    total_epsilon: float
    delta: float
    rounds: int


def discrete_gaussian_tau(sigma_int: float, parties: int) -> float:
    """Kairouz et al.'s tau: how far a sum of ``parties`` N_Z(0, sigma^2) is off."""
    k = np.arange(1, parties, dtype=np.float64)
    terms = np.exp(-2.0 * math.pi**2 * sigma_int**2 * k / (k + 1.0))
    return 10.0 * float(terms.sum())


class PrivacyLedger:
    """Counts the rounds that released a noised sum and the epsilon they spent.

    Pure state: the coordinator persists `to_dict` (JSON-able) with each round
    it records, and rebuilds the ledger with `from_dict`.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float,
        delta: float,
        parties: int,
        dimension: int,
        sigma_int: float,
        rounding_beta: float = 0.0,
        rounds_recorded: Sequence[int] = (),
    ) -> None:
        """Check the parameters and compute one round's RDP curve.

        Args:
            noise_multiplier: Central std over the L2 clip norm (0: no noise,
                epsilon is inf).
            delta: The target delta, in (0, 1).
            parties: The fewest devices in any released sum (the threshold).
            dimension: Coordinates that carry noise (the vector's length).
            sigma_int: Each device's integer std, as from `device_sigma`.
            rounding_beta: 0 when devices round stochastically (the fixed-point
                encoding); the ``beta`` of `round_conditionally` when they use it.
            rounds_recorded: Round indices already recorded (from a saved state).

        Raises:
            PrivacyLedgerError: a parameter out of range or a repeated round.
            AccountantUnavailableError: noise is on and dp-accounting is missing.
        """
        _check(math.isfinite(noise_multiplier) and noise_multiplier >= 0.0,
               f"noise_multiplier must be >= 0, got {noise_multiplier}")  # fmt: skip
        _check(0.0 < delta < 1.0, f"delta must be in (0, 1), got {delta}")
        _check(parties >= 1, f"parties must be >= 1, got {parties}")
        _check(dimension >= 1, f"dimension must be >= 1, got {dimension}")
        _check(0.0 <= rounding_beta < 1.0,
               f"rounding_beta must be in [0, 1), got {rounding_beta}")  # fmt: skip
        _check(math.isfinite(sigma_int) and sigma_int >= 0.0,
               f"sigma_int must be >= 0, got {sigma_int}")  # fmt: skip
        if noise_multiplier > 0.0:
            _check(sigma_int >= MIN_SIGMA_INT,
                   f"sigma_int must be >= {MIN_SIGMA_INT} for the bound to hold, "
                   f"got {sigma_int}: use more scale bits")  # fmt: skip
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.parties = int(parties)
        self.dimension = int(dimension)
        self.sigma_int = float(sigma_int)
        self.rounding_beta = float(rounding_beta)
        self._rounds: set[int] = set()
        for index in rounds_recorded:
            self._add(index)
        self._round_rdp = self._rdp_of_one_round()
        self._compute_epsilon = (
            _compute_epsilon() if self.noise_multiplier > 0.0 else None
        )
        self._round_epsilon = self._epsilon(1)

    @property
    def is_private(self) -> bool:
        """Whether any noise is added (noise multiplier > 0)."""
        return self.noise_multiplier > 0.0

    @property
    def sensitivity_l2(self) -> float:
        """One device's integer vector's L2 bound after rounding (inf if no noise)."""
        if not self.is_private:
            return math.inf
        clip = self.sigma_int * math.sqrt(self.parties) / self.noise_multiplier
        return inflated_l2(clip, self.dimension, self.rounding_beta)

    @property
    def tau(self) -> float:
        """The distributed discrete Gaussian's correction parameter (Theorem 1)."""
        return discrete_gaussian_tau(self.sigma_int, self.parties)

    @property
    def rounds_recorded(self) -> tuple[int, ...]:
        """The recorded round indices, ascending."""
        return tuple(sorted(self._rounds))

    @property
    def spent(self) -> PrivacySpent:
        """The privacy spent so far (total 0 before any round)."""
        rounds = len(self._rounds)
        total = self._epsilon(rounds) if rounds else 0.0
        return PrivacySpent(self._round_epsilon, total, self.delta, rounds)

    def record_round(self, round_index: int) -> PrivacySpent:
        """Record that round ``round_index`` released a noised sum.

        Call it once per released sum, when the sum is released (after
        unmasking), and persist `to_dict` with the round. A round that was
        abandoned before unmasking released nothing and is not recorded.

        Raises:
            PrivacyLedgerError: the round was recorded already; a sum released
                twice (e.g. a re-run with fresh noise) needs a new index, since
                both releases count.
        """
        self._add(round_index)
        return self.spent

    def epsilon_after(self, rounds: int) -> float:
        """Total epsilon at ``delta`` after ``rounds`` rounds (for planning)."""
        _check(rounds >= 0, f"rounds must be >= 0, got {rounds}")
        return self._epsilon(rounds) if rounds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (parameters and recorded rounds; epsilon is derived)."""
        return {
            "version": LEDGER_VERSION,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "parties": self.parties,
            "dimension": self.dimension,
            "sigma_int": self.sigma_int,
            "rounding_beta": self.rounding_beta,
            "rounds": list(self.rounds_recorded),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from `to_dict`'s output.

        Raises:
            PrivacyLedgerError: another version, a missing key or a wrong type.
        """
        if state.get("version") != LEDGER_VERSION:
            raise PrivacyLedgerError(f"unknown ledger version {state.get('version')}")
        try:
            rounds = state["rounds"]
            if not isinstance(rounds, list):
                raise TypeError("rounds is not a list")
            return cls(
                noise_multiplier=_real(state["noise_multiplier"]),
                delta=_real(state["delta"]),
                parties=_integer(state["parties"]),
                dimension=_integer(state["dimension"]),
                sigma_int=_real(state["sigma_int"]),
                rounding_beta=_real(state["rounding_beta"]),
                rounds_recorded=[_integer(index) for index in rounds],
            )
        except (KeyError, TypeError) as exc:
            raise PrivacyLedgerError(f"malformed ledger state: {exc}") from exc

    def _add(self, round_index: int) -> None:
        if isinstance(round_index, bool) or not isinstance(round_index, int):
            raise PrivacyLedgerError(f"round index must be an int, got {round_index!r}")
        if round_index in self._rounds:
            raise PrivacyLedgerError(f"round {round_index} is recorded already")
        self._rounds.add(round_index)

    def _rdp_of_one_round(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Proposition 14's r(alpha) at every order in `RDP_ORDERS`."""
        orders = np.asarray(RDP_ORDERS)
        if not self.is_private:
            return np.full(orders.shape, np.inf)
        scale = self.sensitivity_l2 / (math.sqrt(self.parties) * self.sigma_int)
        tau = self.tau
        additive = orders * scale**2 / 2.0 + tau * self.dimension
        squared = orders * (scale + tau * math.sqrt(self.dimension)) ** 2 / 2.0
        return np.minimum(additive, squared)

    def _epsilon(self, rounds: int) -> float:
        if self._compute_epsilon is None:
            return math.inf
        epsilon, _order = self._compute_epsilon(
            list(RDP_ORDERS), list(rounds * self._round_rdp), self.delta
        )
        return float(epsilon)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise PrivacyLedgerError(message)


def _real(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return value
