"""The blind running sum of an encrypted mean: one-party Paillier reports, multiplied.

Each device of an encrypted mean (`ursa.coordinator.secure_mean`: CLIMB's
dual step, FedDisk's MADE loss) sends ``Enc([v_1 .. v_length])``, one packed
Paillier fixed-point vector under the key epoch's public key. The
coordinator holds only the public key: it parses each report (pinned to one
party, so a device cannot widen the bounds), multiplies it into one running
ciphertext, and returns the sum to the devices, which decrypt the means. It
never sees a plaintext. Same state-machine shape as
`ursa.coordinator.aggregation`::

    state = init_encrypted_sum(public_key, max_parties=..., length=...)
    state, outcome = add_report(state, device_id, payload)   # per device
    summed = finalize_encrypted_sum(state)                   # to devices
"""

from __future__ import annotations

from dataclasses import dataclass

from ursa.coordinator.aggregation import (
    AggregationError,
    EmptyRoundError,
    UpdateOutcome,
)
from ursa.crypto.paillier import (
    EncryptedVector,
    PaillierPublicKey,
    add_encrypted,
    encrypted_vector_from,
)

__all__ = [
    "EncryptedSum",
    "ReportError",
    "add_report",
    "finalize_encrypted_sum",
    "init_encrypted_sum",
    "parse_report",
]


class ReportError(AggregationError):
    """A report that is not one party's ``length``-value vector, or one too many."""


@dataclass(frozen=True)
class EncryptedSum:
    """The running encrypted sum of one mean and who has reported."""

    public_key: PaillierPublicKey
    max_parties: int
    total: EncryptedVector | None
    device_ids: frozenset[str]
    length: int
    """Values per report (CLIMB's ``[f_i, lambda_i]`` and FedDisk's loss: 2)."""

    @property
    def num_reports(self) -> int:
        """How many reports were accepted."""
        return len(self.device_ids)


def init_encrypted_sum(
    public_key: PaillierPublicKey, *, max_parties: int, length: int
) -> EncryptedSum:
    """Start a sum; at most ``max_parties`` reports (the devices' codec bound)."""
    if max_parties < 1 or length < 1:
        raise ReportError(
            f"max_parties and length must be >= 1, got {max_parties}, {length}"
        )
    return EncryptedSum(public_key, max_parties, None, frozenset(), length)


def parse_report(
    public_key: PaillierPublicKey, payload: bytes, length: int
) -> EncryptedVector:
    """Parse one device's report bytes (one party, ``length`` values).

    Raises:
        ReportError: wrong length.
        CiphertextError, KeyMismatchError: from `ursa.crypto` (garbled, wrong key,
            more than one party claimed).
    """
    vector = encrypted_vector_from(payload, public_key, num_parties=1)
    if vector.length != length:
        raise ReportError(f"a report holds {length} values, got {vector.length}")
    return vector


def add_report(
    state: EncryptedSum, device_id: str, payload: bytes
) -> tuple[EncryptedSum, UpdateOutcome]:
    """Multiply one report into the sum; a device's second report is ignored.

    Raises:
        ReportError: a bad report, or more than ``max_parties`` reports.
        CiphertextError, KeyMismatchError: see `parse_report`.
    """
    if device_id in state.device_ids:
        return state, UpdateOutcome.DUPLICATE
    if state.num_reports >= state.max_parties:
        raise ReportError(f"more than max_parties={state.max_parties} reports")
    vector = parse_report(state.public_key, payload, state.length)
    total = (
        vector
        if state.total is None
        else add_encrypted(state.public_key, state.total, vector)
    )
    new_state = EncryptedSum(
        state.public_key,
        state.max_parties,
        total,
        state.device_ids | {device_id},
        state.length,
    )
    return new_state, UpdateOutcome.ACCEPTED


def finalize_encrypted_sum(state: EncryptedSum) -> EncryptedVector:
    """The sum to send back to the devices (its ``num_parties`` is the count).

    Raises:
        EmptyRoundError: no report was accepted.
    """
    if state.total is None:
        raise EmptyRoundError("no report was accepted")
    return state.total
