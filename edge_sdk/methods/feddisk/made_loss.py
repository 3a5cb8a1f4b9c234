"""FedDisk's fleet validation loss under Paillier: a device's report and the sum.

After each MADE round every device reports ``Enc([nll_i * n_i, n_i])``: the
global MADE's negative log-likelihood summed over its validation split and
the split's size, one packed fixed-point vector under the key epoch's public
key. The coordinator only multiplies reports together
(`ursa.coordinator.methods.feddisk.made_loss`); a device decrypts the sum to the fleet's
sample-weighted mean NLL, ``sum nll_i n_i / sum n_i``, the loss FedDisk's
stop rule watches (`ursa.edge_sdk.methods.feddisk.made_stopper`). No device's loss or
split size leaves it unencrypted.

Units and bounds: NLL in nats per sample; MADE on continuous inputs has a
density, so the NLL may be negative (the codec is signed). A per-sample NLL
beyond ``loss_bound`` (a diverged model) is clipped to it rather than
aborting the step; ``max_examples`` bounds ``n_i``. With 24 fraction bits
the decrypted mean is exact to about ``2**-24 / sum n_i`` nats.

Checked sums (`fleet_loss`): honest reports hold ``n_i`` in ``[1,
max_examples]`` and ``|nll_i n_i| <= loss_bound n_i``, so a sum over ``K``
parties has ``sum n`` in ``[K, K max_examples]`` and ``|sum nll n| <=
loss_bound sum n`` (plus rounding); a device refuses any other sum
(`ursa.edge_sdk.mean_bounds.ImplausibleSumError`) and its stopper stays as it
was. Inside that range one party can still put the fleet's mean anywhere in
``[-loss_bound, loss_bound]`` (docs/bounded_influence.md).
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
from ursa.edge_sdk.mean_bounds import HonestRange, ImplausibleSumError, rounding_of
from ursa.protocol.messages import MADE_LOSS_LENGTH
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES

__all__ = [
    "FleetLoss",
    "MadeLossCodec",
    "MadeLossError",
    "decrypt_fleet_loss",
    "encrypt_made_loss",
    "fleet_loss",
    "loss_report_values",
]


class MadeLossError(ValueError):
    """A loss or split size that cannot be reported, or a sum that is not one."""


class MadeLossCodec(BaseModel):
    """Bounds of the fixed-point codec of a loss report (frozen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    loss_bound: float = Field(default=1000.0, gt=0.0)
    """Largest per-sample NLL magnitude (nats); beyond it the NLL is clipped."""
    max_examples: int = Field(default=1_000_000, ge=1)
    """Largest validation split a device may report."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Largest number of reports in one sum."""

    def codec(self) -> FixedPoint:
        """The codec both values use (bound: ``loss_bound * max_examples``)."""
        return FixedPoint(bound=self.loss_bound * self.max_examples)

    def honest_range(self) -> HonestRange:
        """One honest report: ``|nll n| <= loss_bound max_examples``, ``n >= 1``."""
        bound = self.loss_bound * self.max_examples
        return HonestRange.of(
            (-bound, 1.0), (bound, float(self.max_examples)), self.codec()
        )


@dataclass(frozen=True)
class FleetLoss:
    """What a device learns from a sum: the fleet's mean NLL and its size."""

    mean_nll: float
    num_examples: float
    num_parties: int


def loss_report_values(
    mean_nll: float, num_examples: int, codec: MadeLossCodec
) -> npt.NDArray[np.float64]:
    """The plaintext report ``[nll * n, n]``, the NLL clipped to the bound.

    Raises:
        MadeLossError: a non-finite NLL, or ``n`` outside ``[1, max_examples]``.
    """
    if not math.isfinite(mean_nll):
        raise MadeLossError(f"the validation NLL must be finite, got {mean_nll}")
    if not 1 <= num_examples <= codec.max_examples:
        raise MadeLossError(
            f"the validation split must hold 1..{codec.max_examples} samples, "
            f"got {num_examples}"
        )
    clipped = min(max(mean_nll, -codec.loss_bound), codec.loss_bound)
    return np.array([clipped * num_examples, float(num_examples)], dtype=np.float64)


def encrypt_made_loss(
    public_key: PaillierPublicKey,
    codec: MadeLossCodec,
    mean_nll: float,
    num_examples: int,
    *,
    obfuscators: ObfuscatorPool | None = None,
) -> EncryptedVector:
    """Encrypt one device's report (sum-ready, one party)."""
    values = loss_report_values(mean_nll, num_examples, codec)
    return encrypt_reals(
        public_key, codec.codec(), codec.max_parties, values, obfuscators=obfuscators
    )


def decrypt_fleet_loss(
    secret_key: PaillierSecretKey, codec: MadeLossCodec, summed: EncryptedVector
) -> FleetLoss:
    """Decrypt the coordinator's sum into the fleet's sample-weighted mean NLL.

    Raises:
        MadeLossError: not a two-value sum.
        ImplausibleSumError: no honest reports sum to it (`fleet_loss`).
        KeyMismatchError, SlotOverflowError: from `ursa.crypto`.
    """
    if summed.length != MADE_LOSS_LENGTH:
        raise MadeLossError(
            f"a loss sum has {MADE_LOSS_LENGTH} values, got {summed.length}"
        )
    total = decrypt_real_sum(secret_key, codec.codec(), codec.max_parties, summed)
    return fleet_loss(total, summed.num_parties, codec)


def fleet_loss(
    totals: npt.ArrayLike, num_parties: int, codec: MadeLossCodec
) -> FleetLoss:
    """The fleet's mean NLL from a decrypted sum, if honest reports can make it.

    Raises:
        ImplausibleSumError: a slot outside what ``num_parties`` honest reports
            sum to, or ``|sum nll n| > loss_bound sum n`` (beyond rounding).
    """
    total = np.asarray(totals, dtype=np.float64)
    codec.honest_range().check(total, num_parties)
    examples = float(round(total[1]))
    slack = num_parties * rounding_of(codec.codec())
    if abs(float(total[0])) > codec.loss_bound * examples + slack:
        raise ImplausibleSumError(
            f"a loss total of {float(total[0]):.6g} over {examples:.0f} samples: "
            f"a mean beyond the bound {codec.loss_bound}"
        )
    mean = min(max(float(total[0]) / examples, -codec.loss_bound), codec.loss_bound)
    return FleetLoss(mean, examples, num_parties)
