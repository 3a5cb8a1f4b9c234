"""CLIMB on the device: the dual variable lambda_i, its encrypted report, w_i.

CLIMB (Shen et al., ICLR 2022, Alg. 1) solves ``min mean_i f_i`` subject to
``f_i - mean f <= eps`` with one dual variable per device. Here each device
keeps its own ``lambda_i >= 0`` (initially 0) and one dual step is:

1. evaluate ``f_i`` at the current global model (`evaluate_loss`);
2. send ``Enc([f_i, lambda_i])``: one packed Paillier fixed-point vector
   (`encrypt_dual_report`); the coordinator only sums (`ursa.coordinator.climb`);
3. decrypt the sum to ``mean f`` and ``mean lambda`` over the reporting devices
   (`decrypt_dual_means`);
4. `apply_dual_means`: the weight of this round's primal update is
   ``w_i = clip(1 + lambda_i - mean lambda, 0, 1 + lambda_max)`` (the lambda
   just reported, so unclipped the reporters' weights sum exactly to their
   number), then
   ``lambda_i <- clip(lambda_i + eta_D * (f_i - mean f - eps), 0, lambda_max)``
   for the next dual step. The device trains and scales its delta by ``w_i``.

This is the order of the authors' code (``core/imbalance_fl.py``: losses at the
current model, weights from the current lambda, primal steps, then the dual
update with those losses), i.e. Alg. 1 with the dual step one primal phase
behind. It needs one encrypted sum per dual step; ``w_i`` from the updated
lambda would need a second sum (its mean is not computable from the first).
Unclipped, ``w_i`` could be negative (lambda_i far below the mean: the
Lagrangian would push that device's loss *up*); ursa clips it to
``[0, 1 + lambda_max]``, the range honest means give a device whose lambda is
at least the mean's, so no mean, honest or forged, turns a device's update
against its own loss or scales it beyond ``1 + lambda_max``.

**Checked means.** Honest reports hold ``f_i`` in ``[0, loss_bound]`` and
``lambda_i`` in ``[0, lambda_max]`` (`report_values` clamps and refuses), so a
sum over ``K`` parties lies in ``[0, K loss_bound]`` and ``[0, K lambda_max]``
(`dual_means`, plus the codec's rounding); a sum outside is refused
(`ursa.edge_sdk.mean_bounds.ImplausibleSumError`) and the device keeps its
weight and lambda. Inside, one party can still place each mean anywhere in
its range (packed Paillier has no per-party range proofs):
docs/bounded_influence.md gives the worst case.

Units and defaults, and how they compare with the reference code:

* **Loss** ``f_i``: mean cross-entropy per sample in nats over the device's
  training data at the global model. The reference sums the *per-batch mean*
  losses over its data loader (5 batches per epoch, so ``f_ref ~ 5 f``) and
  divides the dual step by ``N``: ``lambda += lr_ref (f_ref - mean f_ref -
  eps_ref) / N`` with ``lr_ref = 2``, ``eps_ref = 0.01`` (MNIST runs, N = 100),
  one dual step per 5 primal rounds. In per-sample units that is
  ``eta_D = 2 * 5 / 100 = 0.1`` and ``eps = 0.01 / 5 = 0.002``.
* ursa uses per-sample mean losses (independent of batch size) and no ``1/N``:
  a device does not know ``N`` and the step should not shrink as the fleet
  grows. ``DEFAULT_ETA_D = 0.1`` and ``DEFAULT_EPSILON = 0.002`` are the
  reference values converted. How often a dual step runs is the round
  machinery's choice (``--dual-period`` in `ursa simulate train`, default 1:
  every round, i.e. five times the reference's rate per primal round, which
  the reference reaches with ``--dual-period 5``); both settings are reported
  in the simulation results.
* **Cap**: ``lambda_max = 100`` as in the reference (an earlier version used 5).
  The cap bounds the weights, and bounds the fixed-point codec.
* **Codec**: ``FixedPoint(bound=max(loss_bound, lambda_max))`` with the
  protocol's 24 fraction bits: the decrypted means are within ``2**-25`` of the
  plaintext means. A loss above ``loss_bound`` (1000 nats: a diverged model)
  is clipped to it before encryption rather than aborting the protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from ursa.crypto.encoding import FixedPoint
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import (
    EncryptedVector,
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_real_sum,
    encrypt_reals,
)
from ursa.edge_sdk.mean_bounds import HonestRange
from ursa.protocol.messages import CLIMB_DUAL_LENGTH
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES

DEFAULT_ETA_D = 0.1
"""Dual step per unit of loss (nats) per dual step; the reference's 2 * 5 / 100."""
DEFAULT_EPSILON = 0.002
"""Constraint slack in nats; the reference's 0.01 over 5 per-batch means."""
DEFAULT_LAMBDA_MAX = 100.0
DEFAULT_LOSS_BOUND = 1000.0

FloatVector = npt.NDArray[np.float64]


class ClimbError(ValueError):
    """Bad CLIMB input: a negative or non-finite loss or dual variable, a bad sum."""


class ClimbConfig(BaseModel):
    """CLIMB's dual hyper-parameters and the fixed-point codec bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eta_d: float = Field(default=DEFAULT_ETA_D, gt=0.0)
    """Dual step size: lambda grows by ``eta_d`` times the constraint's excess."""
    epsilon: float = Field(default=DEFAULT_EPSILON, ge=0.0)
    """Constraint slack (nats): a device's loss may exceed the mean by this."""
    lambda_max: float = Field(default=DEFAULT_LAMBDA_MAX, gt=0.0)
    """Largest dual variable (a client weight is at most ``1 + lambda_max``)."""
    loss_bound: float = Field(default=DEFAULT_LOSS_BOUND, gt=0.0)
    """Largest loss a report may carry (the codec's bound; beyond it clipped)."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Most reports in one encrypted sum (the coordinator's bound too)."""

    def codec(self) -> FixedPoint:
        """The fixed-point codec both values of a report use."""
        return FixedPoint(bound=max(self.loss_bound, self.lambda_max))

    def honest_range(self) -> HonestRange:
        """One honest report: ``f`` in [0, loss_bound], lambda in [0, lambda_max]."""
        return HonestRange.of(
            (0.0, 0.0), (self.loss_bound, self.lambda_max), self.codec()
        )

    @property
    def max_weight(self) -> float:
        """The largest weight ``w_i``: ``1 + lambda_max``."""
        return 1.0 + self.lambda_max


@dataclass(frozen=True)
class DualMeans:
    """What a device learns from a dual step: the reporters' means."""

    mean_loss: float
    mean_lambda: float
    num_parties: int


@dataclass(frozen=True)
class DualStep:
    """A device's result of one dual step."""

    weight: float
    """``w_i`` for this round's delta (from the lambda just reported)."""
    next_lambda: float
    """``lambda_i`` for the next dual step."""


def report_values(loss: float, lambda_: float, config: ClimbConfig) -> FloatVector:
    """The plaintext report ``[f_i, lambda_i]``, the loss clipped to the codec bound.

    Raises:
        ClimbError: a negative or non-finite loss, or lambda outside
            ``[0, lambda_max]``.
    """
    if not math.isfinite(loss) or loss < 0:
        raise ClimbError(f"the loss must be finite and >= 0, got {loss}")
    if not (math.isfinite(lambda_) and 0.0 <= lambda_ <= config.lambda_max):
        raise ClimbError(f"lambda must lie in [0, {config.lambda_max}], got {lambda_}")
    return np.array([min(loss, config.loss_bound), lambda_], dtype=np.float64)


def encrypt_dual_report(
    public_key: PaillierPublicKey,
    config: ClimbConfig,
    loss: float,
    lambda_: float,
    *,
    obfuscators: ObfuscatorPool | None = None,
) -> EncryptedVector:
    """Encrypt ``[f_i, lambda_i]`` as one packed fixed-point vector (sum-ready)."""
    values = report_values(loss, lambda_, config)
    return encrypt_reals(
        public_key, config.codec(), config.max_parties, values, obfuscators=obfuscators
    )


def decrypt_dual_means(
    secret_key: PaillierSecretKey, config: ClimbConfig, summed: EncryptedVector
) -> DualMeans:
    """Decrypt the coordinator's sum of reports into the reporters' means.

    Raises:
        ClimbError: the sum is not a sum of dual reports.
        ImplausibleSumError: no honest reports sum to it (`dual_means`).
        KeyMismatchError, SlotOverflowError: from `ursa.crypto` (wrong key, bad sum).
    """
    if summed.length != CLIMB_DUAL_LENGTH:
        raise ClimbError(
            f"a dual sum has {CLIMB_DUAL_LENGTH} values, got {summed.length}"
        )
    total = decrypt_real_sum(secret_key, config.codec(), config.max_parties, summed)
    return dual_means(total, summed.num_parties, config)


def dual_means(
    totals: npt.ArrayLike, num_parties: int, config: ClimbConfig
) -> DualMeans:
    """The reporters' means from the decrypted sum, if honest reports can make it.

    The means are clipped into ``[0, loss_bound]`` and ``[0, lambda_max]``
    (the rounding slack of the check).

    Raises:
        ImplausibleSumError: a sum outside ``[0, K loss_bound]`` x
            ``[0, K lambda_max]`` (beyond rounding) for ``K = num_parties``.
    """
    total = np.asarray(totals, dtype=np.float64)
    config.honest_range().check(total, num_parties)
    mean_loss = min(max(float(total[0]) / num_parties, 0.0), config.loss_bound)
    mean_lambda = min(max(float(total[1]) / num_parties, 0.0), config.lambda_max)
    return DualMeans(mean_loss, mean_lambda, num_parties)


def plain_dual_means(
    losses: npt.ArrayLike, lambdas: npt.ArrayLike, config: ClimbConfig
) -> DualMeans:
    """The same means in plaintext (simulation; the oracle of the encrypted path)."""
    f = np.asarray(losses, dtype=np.float64)
    lam = np.asarray(lambdas, dtype=np.float64)
    if f.ndim != 1 or f.shape != lam.shape or f.size == 0:
        raise ClimbError(f"need equal non-empty vectors, got {f.shape} and {lam.shape}")
    _check_vectors(f, lam, config)
    clipped = np.minimum(f, config.loss_bound)
    return DualMeans(float(clipped.mean()), float(lam.mean()), int(f.size))


def apply_dual_means(
    lambda_: float, loss: float, means: DualMeans, config: ClimbConfig
) -> DualStep:
    """One device's dual step: ``w_i`` now, ``lambda_i`` for the next step."""
    values = report_values(loss, lambda_, config)
    weights, lambdas = apply_dual_means_all(values[:1], values[1:], means, config)
    return DualStep(float(weights[0]), float(lambdas[0]))


def apply_dual_means_all(
    losses: npt.ArrayLike,
    lambdas: npt.ArrayLike,
    means: DualMeans,
    config: ClimbConfig,
) -> tuple[FloatVector, FloatVector]:
    """`apply_dual_means` for many devices at once: (weights, next lambdas).

    Weights are clipped to ``[0, 1 + lambda_max]`` (the module doc: why).
    """
    f = np.asarray(losses, dtype=np.float64)
    lam = np.asarray(lambdas, dtype=np.float64)
    if f.shape != lam.shape or f.ndim != 1:
        raise ClimbError(f"need equal 1-D vectors, got {f.shape} and {lam.shape}")
    _check_vectors(f, lam, config)
    weights = np.clip(1.0 + lam - means.mean_lambda, 0.0, config.max_weight)
    step = config.eta_d * (
        np.minimum(f, config.loss_bound) - means.mean_loss - config.epsilon
    )
    return weights, np.clip(lam + step, 0.0, config.lambda_max)


def _check_vectors(f: FloatVector, lam: FloatVector, config: ClimbConfig) -> None:
    if not np.all(np.isfinite(f)) or np.any(f < 0):
        raise ClimbError("losses must be finite and >= 0")
    if (
        not np.all(np.isfinite(lam))
        or np.any(lam < 0)
        or np.any(lam > config.lambda_max)
    ):
        raise ClimbError(f"lambdas must lie in [0, {config.lambda_max}]")
