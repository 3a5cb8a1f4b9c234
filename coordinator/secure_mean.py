"""One encrypted mean over a key epoch's registered devices, blind to the coordinator.

CLIMB's dual step and FedDisk's MADE loss step are the same protocol, one
message family told apart by ``purpose`` (`ursa.protocol.messages.secure_mean`)::

    coordinator -> MeanRequest(purpose, round, key epoch, model, version) -> all
    device      -> MeanReport(Enc([v_1 .. v_length]))   (every registered device)
    [every registered online device reported, or the deadline]
    coordinator -> MeanSum(Enc(sum), num_parties) -> all  (nobody: no sum)

`secure_mean` builds it as a `ursa.coordinator.gather.Gather` whose fold is
the running ciphertext product of `ursa.coordinator.encrypted_sum` under the epoch's
Paillier public key: the coordinator never sees a plaintext, devices decrypt
the sum and divide by ``num_parties``. A `MeanWire` (purpose, length, model)
writes and reads one purpose's messages. Refusals: another key epoch
(``wrong_epoch``), a device outside the registry (``unauthorised``), not one
party's ``length``-value ciphertext (``bad_ciphertext``), after the sum
(``late``), another purpose (``malformed``), another model or version
(``wrong_version``), a ciphertext count other than the wire's
(``bad_ciphertext``); a device's second report is ignored. What a report
holds the coordinator cannot see: devices check the decrypted sum
(`ursa.edge_sdk.mean_bounds`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Any

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.encrypted_sum import (
    EncryptedSum,
    ReportError,
    add_report,
    finalize_encrypted_sum,
    init_encrypted_sum,
    parse_report,
)
from ursa.coordinator.gather import Fold, Gather
from ursa.coordinator.phase import Record
from ursa.coordinator.plugin import Send
from ursa.coordinator.training_round import WRONG_VERSION
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import PaillierPublicKey, encrypted_vector_from
from ursa.protocol.messages import (
    COORDINATOR,
    ErrorCode,
    MeanReport,
    MeanRequest,
    MeanSum,
)
from ursa.protocol.router import RejectedError

__all__ = ["MeanHead", "MeanWire", "SecureMeanFold", "offer_report", "secure_mean"]

logger = logging.getLogger("ursa.coordinator.secure_mean")


@dataclass(frozen=True)
class MeanHead:
    """What one mean is about: federation, round, key epoch, model version."""

    federation: str
    round: int
    epoch: int
    version: int


@dataclass(frozen=True)
class MeanWire:
    """One purpose's messages: how the mean is asked, read and answered."""

    purpose: str
    """Names the mean on the wire and in its record (``climb.dual``)."""
    length: int
    """Values per report (the devices' codec fixes it)."""
    model: str
    """The model whose version the devices evaluate."""
    ciphertexts: int | None = None
    """Ciphertexts in one report (None: not pinned). Pinned, a report of another
    count is refused before it reaches the sum: one device cannot make the
    honest reports unsummable by sending a different count first."""

    def request(self, head: MeanHead) -> MeanRequest:
        """The request every registered device answers."""
        return MeanRequest(
            federation=head.federation,
            round=head.round,
            sender=COORDINATOR,
            purpose=self.purpose,
            epoch=head.epoch,
            model=self.model,
            model_version=head.version,
        )

    def check_count(self, count: int) -> None:
        """Refuse a report of another ciphertext count than the pinned one.

        Raises:
            RejectedError: ``bad_ciphertext``.
        """
        if self.ciphertexts is not None and count != self.ciphertexts:
            raise RejectedError(
                ErrorCode.BAD_CIPHERTEXT,
                f"{count} ciphertexts; a {self.purpose} report holds "
                f"{self.ciphertexts}",
            )

    def payload(self, report: MeanReport, head: MeanHead) -> tuple[int, bytes]:
        """A report's key epoch and ciphertext bytes.

        Raises:
            RejectedError: another purpose (``malformed``), model or version
                (``wrong_version``).
        """
        if report.purpose != self.purpose:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"a {report.purpose} report; round {head.round} gathers {self.purpose}",
            )
        if (report.model, report.model_version) != (self.model, head.version):
            raise RejectedError(
                WRONG_VERSION,
                f"{report.model} version {report.model_version}; round {head.round} "
                f"evaluates {self.model} version {head.version}",
            )
        return report.epoch, report.ciphertext

    def result(self, head: MeanHead, total: bytes, num_parties: int) -> MeanSum:
        """The encrypted sum for the devices."""
        return MeanSum(
            federation=head.federation,
            round=head.round,
            sender=COORDINATOR,
            purpose=self.purpose,
            epoch=head.epoch,
            model=self.model,
            model_version=head.version,
            ciphertext=total,
            num_parties=num_parties,
        )


class SecureMeanFold(Fold[MeanReport, EncryptedSum]):
    """The running encrypted sum of one mean (a `Fold` of `Gather`)."""

    def __init__(
        self,
        wire: MeanWire,
        head: MeanHead,
        public_key: PaillierPublicKey,
        *,
        max_parties: int,
    ) -> None:
        """A fold for the reports of ``head`` under the epoch's ``public_key``."""
        self.wire = wire
        self.head = head
        self.public_key = public_key
        self.max_parties = max_parties

    def request(self) -> MeanRequest:
        """The purpose's request for this head."""
        return self.wire.request(self.head)

    def initial(self) -> EncryptedSum:
        """No report yet."""
        return init_encrypted_sum(
            self.public_key, max_parties=self.max_parties, length=self.wire.length
        )

    def check(self, reply: MeanReport) -> None:
        """Refuse a report for another version (the wire) or key epoch."""
        epoch, _ = self.wire.payload(reply, self.head)
        if epoch != self.head.epoch:
            raise RejectedError(
                ErrorCode.WRONG_EPOCH, f"key epoch {epoch}, current {self.head.epoch}"
            )

    def apply(
        self, state: EncryptedSum, device: str, reply: MeanReport
    ) -> EncryptedSum:
        """Multiply the report into the sum (``bad_ciphertext`` if unusable)."""
        _, payload = self.wire.payload(reply, self.head)
        try:
            report = parse_report(self.public_key, payload, self.wire.length)
            self.wire.check_count(len(report.ciphertexts))
            state, _ = add_report(state, device, payload)
        except (ReportError, CryptoError, ValueError) as exc:  # ValueError: a count
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        return state

    def result(self, state: EncryptedSum) -> MeanSum | None:
        """The purpose's sum message; None if nobody reported."""
        if state.total is None:
            return None
        total = finalize_encrypted_sum(state)
        return self.wire.result(
            self.head, total.to_bytes(self.public_key), total.num_parties
        )

    def dump(self, state: EncryptedSum) -> dict[str, Any]:
        """The head and the sum as hex (the reporters are the gather's)."""
        total = state.total
        return {
            "purpose": self.wire.purpose,
            "round": self.head.round,
            "epoch": self.head.epoch,
            "version": self.head.version,
            "length": state.length,
            "total": None if total is None else total.to_bytes(self.public_key).hex(),
        }

    def load(self, data: Any, answered: frozenset[str]) -> EncryptedSum:
        """The saved sum, if it is this head's.

        Raises:
            ValueError: another purpose, round, epoch, version or length.
            CryptoError: the sum is not under this epoch's key.
        """
        head = self.head
        saved = (data["purpose"], data["round"], data["epoch"], data["version"])
        wanted = (self.wire.purpose, head.round, head.epoch, head.version)
        if saved != wanted or data["length"] != self.wire.length:
            raise ValueError(f"the saved mean is {saved}, not {wanted}")
        total = data["total"]
        vector = (
            None
            if total is None
            else encrypted_vector_from(bytes.fromhex(total), self.public_key)
        )
        if vector is not None and vector.length != self.wire.length:
            raise ValueError(f"the saved sum has {vector.length} values")
        return EncryptedSum(
            self.public_key, self.max_parties, vector, answered, self.wire.length
        )


def secure_mean(
    wire: MeanWire,
    head: MeanHead,
    *,
    key: str,
    public_key: PaillierPublicKey,
    registered: Iterable[str],
    online: Set[str],
    max_parties: int,
    now: float,
    timeout_s: float,
    send: Send,
    saved: Record | None = None,
) -> Gather[MeanReport, EncryptedSum]:
    """Resume the ``saved`` mean of ``head`` (a restart), else ask for a new one.

    A resumed mean gets a fresh deadline and re-sends its request (or its sum,
    if it was sent); a new one sends its request and waits for the
    ``registered`` devices that are ``online``.
    """
    fold = SecureMeanFold(wire, head, public_key, max_parties=max_parties)
    if saved is not None:
        try:
            gather = Gather.from_record(saved, fold)
        except (CryptoError, KeyError, TypeError, ValueError) as exc:
            logger.warning("%s: saved mean unusable (%s); asking again", key, exc)
        else:
            gather.restarted(now, send)
            return gather
    return Gather.open(
        key,
        fold,
        expected=registered,
        online=online,
        now=now,
        timeout_s=timeout_s,
        send=send,
    )


def offer_report(
    mean: Gather[MeanReport, EncryptedSum], report: MeanReport, send: Send
) -> UpdateOutcome:
    """Offer a device's report; one the sum cannot take is not waited for again.

    A report refused as ``bad_ciphertext`` (garbled, another key, another
    count) would come back the same (its id is derived), so the mean stops
    waiting for its device instead of holding every honest device until the
    deadline; a later usable report is still taken. The caller saves the
    mean either way (it may have closed).

    Raises:
        RejectedError: as `Gather.offer`.
    """
    try:
        return mean.offer(report.sender, report, send)
    except RejectedError as exc:
        if exc.code == ErrorCode.BAD_CIPHERTEXT:
            logger.warning(
                "%s: the report of %s is unusable (%s); not waited for",
                mean.key,
                report.sender,
                exc.reason,
            )
            mean.device_left(report.sender, send)
        raise
