"""CLIMB dual steps over the wire, coordinator side (SPEC §5, CLIMB Alg. 1).

One dual step per round that needs one (every ``dual_period`` rounds),
before the round's participants train, is a `ursa.coordinator.secure_mean`
with CLIMB's messages::

    coordinator -> DualStepRequest(round, key epoch, model version) -> all
    device      -> ClimbStats(Enc([f_i, lambda_i]))    (every registered device)
    [every registered online device reported, or the dual deadline]
    coordinator -> ClimbSum(Enc(sum), num_parties) -> all

The coordinator holds only the epoch's Paillier public key and never sees a
loss or a dual variable. Devices decrypt the means and update their own
lambda and weight (`ursa.edge_sdk.climb_steps`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.climb import (
    DUAL_REPORT_LENGTH,
    DualReportError,
    DualSumState,
    apply_dual_report,
    finalize_dual_sum,
    init_dual_sum,
)
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.secure_mean import MeanHead, MeanWire
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import PaillierPublicKey, encrypted_vector_from
from ursa.protocol.messages import COORDINATOR, ClimbStats, ClimbSum, DualStepRequest

__all__ = ["ClimbDualWire", "DualStep", "DualStepError", "dual_step_key"]

logger = logging.getLogger("ursa.coordinator.training")


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


# FedDisk's loss step still runs on this until it is ported to secure_mean.


class DualStepError(ValueError):
    """A dual report the coordinator refuses (the reason is the message)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass
class DualStep:
    """One round's dual step: who may report, the running encrypted sum."""

    round: int
    epoch: int
    model_version: int
    public_key: PaillierPublicKey
    registered: frozenset[str]
    state: DualSumState
    sent_sum: bool = False

    @classmethod
    def open(
        cls,
        round_index: int,
        epoch: int,
        model_version: int,
        public_key: PaillierPublicKey,
        registered: frozenset[str],
        *,
        max_parties: int,
        length: int = DUAL_REPORT_LENGTH,
    ) -> DualStep:
        """Start a dual step for the registered devices of key epoch ``epoch``.

        ``length`` is the values per report (FedDisk's loss step reuses this
        encrypted sum with its own reports, `ursa.coordinator.feddisk_steps`).
        """
        state = init_dual_sum(public_key, max_parties=max_parties, length=length)
        return cls(round_index, epoch, model_version, public_key, registered, state)

    @classmethod
    def resume_or_open(
        cls,
        round_index: int,
        epoch: EpochView,
        model_version: int,
        saved: dict[str, Any] | None,
        *,
        max_parties: int,
    ) -> DualStep:
        """The saved step of this round and epoch (a restart), else a new one."""
        assert epoch.public_key is not None
        if saved is not None and saved.get("epoch") == epoch.epoch:
            try:
                return cls.from_record(saved, epoch.public_key, max_parties=max_parties)
            except (CryptoError, KeyError, ValueError):
                logger.exception("round %d: saved dual step unusable", round_index)
        return cls.open(
            round_index,
            epoch.epoch,
            model_version,
            epoch.public_key,
            epoch.registered,
            max_parties=max_parties,
        )

    def request(self, federation: str) -> DualStepRequest:
        """The request every device answers."""
        return DualStepRequest(
            federation=federation,
            round=self.round,
            sender=COORDINATOR,
            epoch=self.epoch,
            model_version=self.model_version,
        )

    @property
    def reporters(self) -> frozenset[str]:
        """Devices whose report is in the sum."""
        return self.state.device_ids

    def add(self, device: str, message: ClimbStats) -> UpdateOutcome:
        """Multiply one device's report into the sum.

        Raises:
            DualStepError: wrong epoch or round, an unregistered device, or a
                report that is not one party's ``[f_i, lambda_i]`` ciphertext.
        """
        return self.add_payload(device, message.epoch, message.stats)

    def add_payload(self, device: str, epoch: int, payload: bytes) -> UpdateOutcome:
        """Multiply one device's report bytes, sent under key epoch ``epoch``.

        Raises:
            DualStepError: as `add` (the step is over, another epoch, an
                unregistered device, not one party's ``length``-value vector).
        """
        if self.sent_sum:
            raise DualStepError("late", f"the dual step of round {self.round} is over")
        if epoch != self.epoch:
            raise DualStepError(
                "wrong_epoch", f"key epoch {epoch}, current {self.epoch}"
            )
        if device not in self.registered:
            raise DualStepError(
                "unauthorised", f"not registered in key epoch {self.epoch}"
            )
        try:
            self.state, outcome = apply_dual_report(self.state, device, payload)
        except (DualReportError, CryptoError) as exc:
            raise DualStepError("bad_ciphertext", str(exc)) from None
        return outcome

    def is_complete(self, online: frozenset[str]) -> bool:
        """Whether every registered online device has reported."""
        return (self.registered & online) <= self.reporters

    def result(self, federation: str) -> ClimbSum | None:
        """The encrypted sum for the devices (None if nobody reported)."""
        if self.state.total is None:
            return None
        total = finalize_dual_sum(self.state)
        return ClimbSum(
            federation=federation,
            round=self.round,
            sender=COORDINATOR,
            epoch=self.epoch,
            stats_sum=total.to_bytes(self.public_key),
            num_parties=total.num_parties,
        )

    def to_record(self) -> dict[str, Any]:
        """JSON-able state (ciphertexts as hex) for a restart."""
        total = self.state.total
        return {
            "round": self.round,
            "epoch": self.epoch,
            "model_version": self.model_version,
            "registered": sorted(self.registered),
            "reporters": sorted(self.reporters),
            "total": None if total is None else total.to_bytes(self.public_key).hex(),
            "sent_sum": self.sent_sum,
            "length": self.state.length,
        }

    @classmethod
    def from_record(
        cls,
        record: dict[str, Any],
        public_key: PaillierPublicKey,
        *,
        max_parties: int,
    ) -> DualStep:
        """Rebuild a saved dual step (the key must be the record's epoch key).

        Raises:
            CryptoError: the saved sum is not under ``public_key``.
        """
        total = record["total"]
        vector = (
            None
            if total is None
            else encrypted_vector_from(bytes.fromhex(total), public_key)
        )
        length = int(record.get("length", DUAL_REPORT_LENGTH))
        if vector is not None and vector.length != length:
            raise ValueError(f"saved sum has {vector.length} values, not {length}")
        state = DualSumState(
            public_key, max_parties, vector, frozenset(record["reporters"]), length
        )
        return cls(
            int(record["round"]),
            int(record["epoch"]),
            int(record["model_version"]),
            public_key,
            frozenset(record["registered"]),
            state,
            bool(record["sent_sum"]),
        )
