"""CLIMB on the coordinator: sum the devices' encrypted dual reports, blind.

Each device of a dual step sends ``Enc([f_i, lambda_i])`` (one packed Paillier
fixed-point vector, `ursa.edge_sdk.climb.encrypt_dual_report`). The
coordinator holds only the public key: it parses each report (pinned to one
party, so a device cannot widen the bounds), multiplies it into one running
ciphertext, and returns the sum to the devices, which decrypt the means. It
never sees a loss or a dual variable. Same state-machine shape as
`ursa.coordinator.aggregation`::

    state = init_dual_sum(public_key, max_parties=...)
    state, outcome = apply_dual_report(state, device_id, payload)   # per device
    summed = finalize_dual_sum(state)                               # to devices
"""

from __future__ import annotations

from collections.abc import Iterable
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
    sum_encrypted,
)

DUAL_REPORT_LENGTH = 2
"""``[f_i, lambda_i]``; equal to `ursa.edge_sdk.climb.DUAL_REPORT_LENGTH` (tested)."""


class DualReportError(AggregationError):
    """A dual report that is not one party's ``[f_i, lambda_i]`` vector."""


@dataclass(frozen=True)
class DualSumState:
    """The running encrypted sum of one dual step and who has reported."""

    public_key: PaillierPublicKey
    max_parties: int
    total: EncryptedVector | None
    device_ids: frozenset[str]
    length: int = DUAL_REPORT_LENGTH
    """Values per report (FedDisk's loss reports reuse this sum, also 2)."""

    @property
    def num_reports(self) -> int:
        """How many reports were accepted."""
        return len(self.device_ids)


def init_dual_sum(
    public_key: PaillierPublicKey,
    *,
    max_parties: int,
    length: int = DUAL_REPORT_LENGTH,
) -> DualSumState:
    """Start a dual step; at most ``max_parties`` reports (the devices' codec bound)."""
    if max_parties < 1 or length < 1:
        raise DualReportError(
            f"max_parties and length must be >= 1, got {max_parties}, {length}"
        )
    return DualSumState(public_key, max_parties, None, frozenset(), length)


def parse_dual_report(
    public_key: PaillierPublicKey, payload: bytes, length: int = DUAL_REPORT_LENGTH
) -> EncryptedVector:
    """Parse one device's report bytes (one party, ``length`` values).

    Raises:
        DualReportError: wrong length.
        CiphertextError, KeyMismatchError: from `ursa.crypto` (garbled, wrong key,
            more than one party claimed).
    """
    vector = encrypted_vector_from(payload, public_key, num_parties=1)
    if vector.length != length:
        raise DualReportError(f"a report holds {length} values, got {vector.length}")
    return vector


def apply_dual_report(
    state: DualSumState, device_id: str, payload: bytes
) -> tuple[DualSumState, UpdateOutcome]:
    """Multiply one report into the sum; a device's second report is ignored.

    Raises:
        DualReportError: a bad report, or more than ``max_parties`` reports.
        CiphertextError, KeyMismatchError: see `parse_dual_report`.
    """
    if device_id in state.device_ids:
        return state, UpdateOutcome.DUPLICATE
    if state.num_reports >= state.max_parties:
        raise DualReportError(f"more than max_parties={state.max_parties} reports")
    vector = parse_dual_report(state.public_key, payload, state.length)
    total = (
        vector
        if state.total is None
        else add_encrypted(state.public_key, state.total, vector)
    )
    new_state = DualSumState(
        state.public_key,
        state.max_parties,
        total,
        state.device_ids | {device_id},
        state.length,
    )
    return new_state, UpdateOutcome.ACCEPTED


def finalize_dual_sum(state: DualSumState) -> EncryptedVector:
    """The sum to send back to the devices (its ``num_parties`` is the count).

    Raises:
        EmptyRoundError: no report was accepted.
    """
    if state.total is None:
        raise EmptyRoundError("no dual report was accepted")
    return state.total


def sum_dual_reports(
    public_key: PaillierPublicKey, reports: Iterable[EncryptedVector]
) -> EncryptedVector:
    """Sum already-parsed reports in one running product (simulation, tests).

    Raises:
        DualReportError: a report of the wrong length.
    """

    def checked() -> Iterable[EncryptedVector]:
        for report in reports:
            if report.length != DUAL_REPORT_LENGTH:
                raise DualReportError(f"a dual report has length {report.length}")
            yield report

    return sum_encrypted(public_key, checked())
