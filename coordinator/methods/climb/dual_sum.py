"""CLIMB's dual reports on the coordinator: ``Enc([f_i, lambda_i])``, summed blind.

Each device of a dual step sends ``Enc([f_i, lambda_i])`` (one packed Paillier
fixed-point vector, `ursa.edge_sdk.methods.climb.dual.encrypt_dual_report`); the
coordinator multiplies the reports into one running ciphertext
(`ursa.coordinator.encrypted_sum`, the fold of every encrypted mean) and
returns the sum to the devices, which decrypt the means. It never sees a loss
or a dual variable::

    state = init_dual_sum(public_key, max_parties=...)
    state, outcome = add_report(state, device_id, payload)   # per device
    summed = finalize_encrypted_sum(state)                   # to devices
"""

from __future__ import annotations

from collections.abc import Iterable

from ursa.coordinator.encrypted_sum import EncryptedSum, ReportError, init_encrypted_sum
from ursa.crypto.paillier import EncryptedVector, PaillierPublicKey, sum_encrypted
from ursa.protocol.messages import CLIMB_DUAL_LENGTH

__all__ = ["init_dual_sum", "sum_dual_reports"]


def init_dual_sum(public_key: PaillierPublicKey, *, max_parties: int) -> EncryptedSum:
    """Start a dual step's sum; at most ``max_parties`` reports (the codec bound)."""
    return init_encrypted_sum(
        public_key, max_parties=max_parties, length=CLIMB_DUAL_LENGTH
    )


def sum_dual_reports(
    public_key: PaillierPublicKey, reports: Iterable[EncryptedVector]
) -> EncryptedVector:
    """Sum already-parsed reports in one running product (simulation, tests).

    Raises:
        ReportError: a report of the wrong length.
    """

    def checked() -> Iterable[EncryptedVector]:
        for report in reports:
            if report.length != CLIMB_DUAL_LENGTH:
                raise ReportError(f"a dual report has length {report.length}")
            yield report

    return sum_encrypted(public_key, checked())
