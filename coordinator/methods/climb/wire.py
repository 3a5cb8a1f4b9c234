"""CLIMB's dual step on the wire, coordinator side: a `secure_mean` of ``climb.dual``.

`dual_wire` is the generic `MeanWire` for CLIMB's purpose: every registered
device reports ``Enc([f_i, lambda_i])`` (one party's packed Paillier
vector) in a `MeanReport`, and the coordinator answers the encrypted sum and
``num_parties`` in a `MeanSum`; `ursa.coordinator.methods.climb.dual_step` runs it
before the rounds that need one. The coordinator holds only the epoch's
Paillier public key and never sees a loss or a dual variable. Devices decrypt
the means and update their own lambda and weight (`ursa.edge_sdk.methods.climb`).
"""

from __future__ import annotations

from ursa.coordinator.secure_mean import MeanWire
from ursa.protocol.messages import CLIMB_DUAL, CLIMB_DUAL_LENGTH
from ursa.protocol.messages.climb import CLIMB_DUAL_CIPHERTEXTS

__all__ = ["dual_wire"]


def dual_wire(model: str) -> MeanWire:
    """CLIMB's dual step over ``model`` as an encrypted mean of ``[f_i, lambda_i]``."""
    return MeanWire(CLIMB_DUAL, CLIMB_DUAL_LENGTH, model, CLIMB_DUAL_CIPHERTEXTS)
