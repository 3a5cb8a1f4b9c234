"""CLIMB's dual step on the wire, coordinator side: its `secure_mean` messages.

`ClimbDualWire` says how a dual step is asked (`DualStepRequest`), read
(`ClimbStats`: ``Enc([f_i, lambda_i])``, one party's packed Paillier vector)
and answered (`ClimbSum`: the encrypted sum and ``num_parties``);
`ursa.coordinator.methods.climb.step` runs it before the rounds that need
one. The coordinator holds only the epoch's Paillier public key and never
sees a loss or a dual variable. Devices decrypt the means and update their
own lambda and weight (`ursa.edge_sdk.methods.climb`).
"""

from __future__ import annotations

from ursa.coordinator.methods.climb.dual_sum import DUAL_REPORT_LENGTH
from ursa.coordinator.secure_mean import MeanHead, MeanWire
from ursa.protocol.messages import COORDINATOR, ClimbStats, ClimbSum, DualStepRequest

__all__ = ["ClimbDualWire", "dual_step_key"]


def dual_step_key(model: str, round_index: int) -> str:
    """The phase key of a round's dual step (one per trained model and round)."""
    return f"climb.dual/{model}/{round_index}"


class ClimbDualWire(MeanWire[ClimbStats]):
    """CLIMB's dual step as an encrypted mean of ``[f_i, lambda_i]``."""

    purpose = "climb.dual"
    length = DUAL_REPORT_LENGTH

    def request(self, head: MeanHead) -> DualStepRequest:
        """Evaluate the loss at this model version and report."""
        return DualStepRequest(
            federation=head.federation,
            round=head.round,
            sender=COORDINATOR,
            epoch=head.epoch,
            model_version=head.version,
        )

    def payload(self, report: ClimbStats, head: MeanHead) -> tuple[int, bytes]:
        """The report's key epoch and ciphertext."""
        return report.epoch, report.stats

    def result(self, head: MeanHead, total: bytes, num_parties: int) -> ClimbSum:
        """The encrypted sum the devices turn into means."""
        return ClimbSum(
            federation=head.federation,
            round=head.round,
            sender=COORDINATOR,
            epoch=head.epoch,
            stats_sum=total,
            num_parties=num_parties,
        )
