"""FedDisk phase 1 over the wire, coordinator side: the MADE loss step.

After a MADE round produced global version v, one loss step (SPEC §5
FedDisk, paper §IV-B)::

    coordinator -> MadeLossRequest(round, key epoch, model, v) -> all
    device      -> MadeLoss(Enc([nll_i * n_i, n_i]))   (every registered device)
    [every registered online device reported, or the loss deadline]
    coordinator -> MadeLossSum(Enc(sum), num_parties) -> all

The running sum is CLIMB's (`ursa.coordinator.climb_steps.DualStep` over
`ursa.coordinator.climb`), composed here with the MADE model name and its
own messages: the coordinator multiplies ciphertexts under the epoch's
Paillier public key and never sees a loss or a split size. Devices decrypt
the fleet's mean NLL (`ursa.edge_sdk.made_loss`). A report for another
version or key epoch, from a device outside the epoch's registry, or that is
not one party's two-value vector is refused (`DualStepError` with the
`ErrorReply` code); a device's second report is ignored. The step
round-trips through JSON (`to_record`/`from_record`) for restarts; the
plugin keeps it in its saved state (`ursa.coordinator.feddisk_state`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.climb import finalize_dual_sum
from ursa.coordinator.climb_steps import DualStep, DualStepError
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.training_round import WRONG_VERSION
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import PaillierPublicKey
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import (
    COORDINATOR,
    ErrorCode,
    MadeLoss,
    MadeLossRequest,
    MadeLossSum,
    MadeVerdict,
)

__all__ = ["MADE_LOSS_LENGTH", "DualStepError", "MadeLossStep"]

logger = logging.getLogger("ursa.coordinator.feddisk")

MADE_LOSS_LENGTH = 2
"""``[nll_i * n_i, n_i]``; `ursa.edge_sdk.made_loss.MADE_LOSS_LENGTH` (tested)."""


@dataclass
class MadeLossStep:
    """One round's loss step: the MADE version judged and its encrypted sum."""

    model: str
    running: DualStep

    @classmethod
    def open(
        cls,
        round_index: int,
        epoch: EpochView,
        model: str,
        model_version: int,
        *,
        max_parties: int,
    ) -> MadeLossStep:
        """Start a loss step for the registered devices of the epoch.

        Raises:
            ValueError: the epoch has no public key yet.
        """
        if epoch.public_key is None:
            raise ValueError(f"key epoch {epoch.epoch} has no public key")
        running = DualStep.open(
            round_index,
            epoch.epoch,
            model_version,
            epoch.public_key,
            epoch.registered,
            max_parties=max_parties,
            length=MADE_LOSS_LENGTH,
        )
        return cls(model, running)

    @classmethod
    def resume_or_open(
        cls,
        round_index: int,
        epoch: EpochView,
        model: str,
        model_version: int,
        saved: dict[str, Any] | None,
        *,
        max_parties: int,
    ) -> MadeLossStep:
        """The saved step of this round, version and epoch (a restart), else a new one.

        Raises:
            ValueError: the epoch has no public key yet.
        """
        if epoch.public_key is None:
            raise ValueError(f"key epoch {epoch.epoch} has no public key")
        wanted = (round_index, epoch.epoch, model, model_version)
        if saved is not None and _identity(saved) == wanted:
            try:
                return cls.from_record(saved, epoch.public_key, max_parties=max_parties)
            except (CryptoError, KeyError, TypeError, ValueError):
                logger.exception("round %d: saved loss step unusable", round_index)
        return cls.open(
            round_index, epoch, model, model_version, max_parties=max_parties
        )

    # --- view ----------------------------------------------------------------

    @property
    def round(self) -> int:
        """The round the step belongs to."""
        return self.running.round

    @property
    def epoch(self) -> int:
        """The key epoch the reports are encrypted under."""
        return self.running.epoch

    @property
    def model_version(self) -> int:
        """The MADE version whose validation loss is summed."""
        return self.running.model_version

    @property
    def reporters(self) -> frozenset[str]:
        """Devices whose report is in the sum."""
        return self.running.reporters

    @property
    def sent_sum(self) -> bool:
        """Whether the sum went out (no more reports are taken)."""
        return self.running.sent_sum

    def mark_sent(self) -> None:
        """Close the step to reports (its sum is out, or nobody reported)."""
        self.running.sent_sum = True

    # --- messages --------------------------------------------------------------

    def request(self, federation: str) -> MadeLossRequest:
        """The request every registered device answers."""
        return MadeLossRequest(
            federation=federation,
            round=self.round,
            sender=COORDINATOR,
            epoch=self.epoch,
            model=self.model,
            model_version=self.model_version,
        )

    def add(self, device: str, message: MadeLoss) -> UpdateOutcome:
        """Multiply one device's report into the sum.

        Raises:
            DualStepError: another MADE version (``wrong_version``), the step
                is over (``late``), another key epoch (``wrong_epoch``), an
                unregistered device (``unauthorised``) or not one party's
                two-value ciphertext (``bad_ciphertext``).
        """
        if message.model_version != self.model_version:
            raise DualStepError(
                WRONG_VERSION,
                f"loss of {self.model} version {message.model_version}; round "
                f"{self.round} judges version {self.model_version}",
            )
        return self.running.add_payload(device, message.epoch, message.loss)

    def is_complete(self, online: frozenset[str]) -> bool:
        """Whether every registered online device has reported."""
        return self.running.is_complete(online)

    def check_verdict(self, message: MadeVerdict, epoch: EpochView | None) -> None:
        """Accept the agent's verdict on this step, or raise why not.

        Raises:
            DualStepError: the sum is not out yet (``late``), the sender is not
                the epoch's agent (``unauthorised``), its signature does not
                verify (``bad_signature``), another epoch or version, or a best
                version newer than the one judged (``malformed``).
        """
        if not self.sent_sum:
            raise DualStepError(ErrorCode.LATE, "the loss sum has not been sent")
        if epoch is None or message.sender != epoch.agent:
            raise DualStepError(ErrorCode.UNAUTHORISED, "only the epoch's agent judges")
        if epoch.agent_identity is None:
            raise DualStepError(ErrorCode.UNAUTHORISED, "the agent's keys are unknown")
        try:
            verify_signature(
                epoch.agent_identity, signing_bytes(message), message.signature
            )
        except CryptoError as exc:
            raise DualStepError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
        if message.epoch != self.epoch:
            raise DualStepError(
                ErrorCode.WRONG_EPOCH, f"key epoch {message.epoch}, step {self.epoch}"
            )
        if message.model_version != self.model_version:
            raise DualStepError(
                WRONG_VERSION,
                f"verdict on version {message.model_version}, judging "
                f"{self.model_version}",
            )
        if message.best_version > self.model_version:
            raise DualStepError(
                ErrorCode.MALFORMED,
                f"best version {message.best_version} is newer than "
                f"{self.model_version}",
            )

    def result(self, federation: str) -> MadeLossSum | None:
        """The encrypted sum for the devices (None if nobody reported)."""
        if self.running.state.total is None:
            return None
        total = finalize_dual_sum(self.running.state)
        return MadeLossSum(
            federation=federation,
            round=self.round,
            sender=COORDINATOR,
            epoch=self.epoch,
            model_version=self.model_version,
            loss_sum=total.to_bytes(self.running.public_key),
            num_parties=total.num_parties,
        )

    # --- restarts --------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """JSON-able state (the sum as hex) for a restart."""
        return {"model": self.model, **self.running.to_record()}

    @classmethod
    def from_record(
        cls,
        record: dict[str, Any],
        public_key: PaillierPublicKey,
        *,
        max_parties: int,
    ) -> MadeLossStep:
        """Rebuild a saved step (the key must be the record's epoch key).

        Raises:
            CryptoError: the saved sum is not under ``public_key``.
            KeyError, ValueError: not a loss step record.
        """
        running = DualStep.from_record(record, public_key, max_parties=max_parties)
        if running.state.length != MADE_LOSS_LENGTH:
            raise ValueError(f"a loss step sums {MADE_LOSS_LENGTH} values per report")
        return cls(str(record["model"]), running)


def _identity(record: dict[str, Any]) -> tuple[Any, ...]:
    return (
        record.get("round"),
        record.get("epoch"),
        record.get("model"),
        record.get("model_version"),
    )
