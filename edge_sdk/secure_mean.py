"""The device's half of the encrypted mean: one owner of its kinds, methods by purpose.

A method that needs a mean over the fleet (CLIMB's dual step, FedDisk's MADE
loss) is a `MeanParticipant`: it names its ``purpose``, gives its codec,
computes its plaintext values for a request and receives the decrypted
totals. `SecureMeans` does the rest, the same for every purpose::

    MeanRequest(purpose, round, epoch, model, version)
        -> participant.mean_values(request)       (None: not yet; asked again
                                                   when a model version arrives)
        -> MeanReport(Enc(values))                (epoch key, pooled obfuscators,
                                                   id derived from device,
                                                   purpose, epoch, round)
    MeanSum(purpose, ..., Enc(sum), num_parties)
        -> decrypt with the epoch's secret key
        -> participant.on_mean(sum, totals)       (once per report)

A repeated request re-sends the same report (same message id); a sum that
does not answer this device's open report goes to `MeanParticipant.on_sum_again`
(e.g. a re-published sum after the participant applied it); an `ErrorReply`
to a report (``late``, ``wrong_epoch``, ...) goes to `MeanParticipant.on_refused`.
No value leaves the device unencrypted; the coordinator never holds a secret key.

A decrypted sum is checked before any participant sees it
(`ursa.edge_sdk.mean_bounds`): its party count must be one that could have
reported (at most the codec's and the signed key epoch's), and each
slot must lie in what that many honest reports can sum to (the participant's
`MeanCodec.honest`), then the participant's own cross-slot checks
(`MeanParticipant.check_mean`). A sum that fails is refused: an ERROR log
line, an `ErrorReply` ``mean_refused`` to the coordinator naming the reason,
and `MeanParticipant.on_refused`, so the participant keeps its previous state
instead of applying a value no honest fleet could produce. A packed vector
that does not decrypt (a slot beyond the packing, a wrong key or count) is
refused the same way.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from ursa.crypto.encoding import FixedPoint
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_real_sum,
    encrypt_reals,
    encrypted_vector_from,
)
from ursa.edge_sdk.mean_bounds import HonestRange, ImplausibleSumError, check_parties
from ursa.edge_sdk.method import DeviceContext, DeviceMethod
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import ErrorReply, MeanReport, MeanRequest, MeanSum
from ursa.protocol.messages.secure_mean import MEAN_REFUSED
from ursa.protocol.router import NotReadyError, Router

__all__ = [
    "MeanAbandonedError",
    "MeanCodec",
    "MeanParticipant",
    "SecureMeans",
    "with_secure_means",
]

logger = logging.getLogger("ursa.edge_sdk")

FloatVector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class MeanCodec:
    """How one purpose's values are encoded: fixed point, party bound, length.

    ``honest``: what one honest report holds slot by slot (the participant
    clamps its values into it before encryption); None: only the codec's
    ``[-bound, bound]``.
    """

    fixed_point: FixedPoint
    max_parties: int
    """Largest number of reports in one sum (the packing's headroom)."""
    length: int
    """Values per report."""
    honest: HonestRange | None = None

    def __post_init__(self) -> None:
        if self.honest is not None and self.honest.length != self.length:
            raise ValueError(
                f"an honest range of {self.honest.length} slots for {self.length}"
            )

    def honest_range(self) -> HonestRange:
        """``honest``, or every value the codec encodes."""
        if self.honest is not None:
            return self.honest
        bound = self.fixed_point.bound
        return HonestRange.of(
            (-bound,) * self.length, (bound,) * self.length, self.fixed_point
        )


class MeanAbandonedError(Exception):
    """A participant gives up on a request (e.g. the version it asks is gone)."""


class MeanParticipant(ABC):
    """A method's side of an encrypted mean, dispatched by its ``purpose``."""

    purpose: ClassVar[str]
    """The ``purpose`` of its requests, reports and sums (``climb.dual``)."""

    @abstractmethod
    def mean_codec(self) -> MeanCodec:
        """The codec of this purpose's values."""

    @abstractmethod
    def takes_part(self, request: MeanRequest) -> bool:
        """Whether this device answers ``request`` at all."""

    @abstractmethod
    def mean_values(self, request: MeanRequest) -> FloatVector | None:
        """The plaintext values to report; None while the model is not here.

        Raises:
            MeanAbandonedError: this request will never be answered.
        """

    @abstractmethod
    def on_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """The decrypted sum of the reports (divide by ``result.num_parties``)."""

    def check_mean(self, result: MeanSum, totals: FloatVector) -> None:  # noqa: B027
        """Refuse a sum honest reports could not make (beyond the slot ranges).

        Optional: e.g. a per-class correct count above its total. The slots'
        ranges are checked before (`MeanCodec.honest`).

        Raises:
            ImplausibleSumError: why no honest fleet makes ``totals``.
        """

    def on_sum_again(self, result: MeanSum) -> None:  # noqa: B027 - optional hook
        """A sum that answers no open report of this device (re-published, late)."""

    def on_refused(self, request: MeanRequest) -> None:  # noqa: B027 - optional hook
        """No sum will be applied for ``request``: keep the previous state.

        The coordinator refused this device's report, or this device refused
        the sum (one no honest fleet could produce).
        """


@dataclass
class _Report:
    request: MeanRequest
    message: MeanReport
    done: bool = False


class SecureMeans(DeviceMethod):
    """The runtime's encrypted mean: owns the three kinds, serves its participants.

    Args:
        ctx: The device (keys, epoch, outbox).
        participants: The methods taking part, at most one per purpose.

    Raises:
        ValueError: two participants name the same purpose.
    """

    name: ClassVar[str] = "secure_mean"

    def __init__(
        self, ctx: DeviceContext, participants: Sequence[MeanParticipant]
    ) -> None:
        self.ctx = ctx
        """The device this method runs on."""
        self._participants: dict[str, MeanParticipant] = {}
        for participant in participants:
            purpose = participant.purpose
            if purpose in self._participants:
                raise ValueError(f"two methods take part in mean {purpose!r}")
            self._participants[purpose] = participant
        self._pending: dict[str, MeanRequest] = {}
        self._reports: dict[str, _Report] = {}

    @property
    def purposes(self) -> tuple[str, ...]:
        """The purposes this device answers."""
        return tuple(self._participants)

    def register(self, router: Router) -> None:
        """Own the mean's three kinds."""
        router.register(MeanRequest, self._on_request, owner=self.name)
        router.register(MeanReport, self._on_report, owner=self.name)
        router.register(MeanSum, self._on_sum, owner=self.name)

    # --- hooks ----------------------------------------------------------------

    def on_model_ready(self) -> None:
        """A requested version may have arrived: report on it."""
        for purpose in tuple(self._pending):
            self._continue(purpose)

    def on_error_reply(self, message: ErrorReply) -> None:
        """A refused report: its participant stops waiting for the sum."""
        for purpose, report in self._reports.items():
            if report.done or report.message.message_id != message.in_reply_to:
                continue
            report.done = True
            self._participants[purpose].on_refused(report.request)

    # --- handlers -------------------------------------------------------------

    def _on_request(self, message: MeanRequest) -> None:
        participant = self._participants.get(message.purpose)
        if participant is None or not participant.takes_part(message):
            return
        keys = self.ctx.keys(message.epoch)
        if keys.secret_key is None:
            raise NotReadyError  # it could not decrypt the sum
        report = self._reports.get(message.purpose)
        if report is not None and (report.request.epoch, report.request.round) == (
            message.epoch,
            message.round,
        ):
            self.ctx.send(report.message)  # a re-published request
            return
        self._pending[message.purpose] = message
        self._continue(message.purpose)

    def _on_report(self, message: MeanReport) -> None:
        raise ValueError("a device does not sum reports")

    def _continue(self, purpose: str) -> None:
        """Report ``Enc(values)`` once the participant has them."""
        ctx, request = self.ctx, self._pending.get(purpose)
        keys = ctx.current_keys()
        if request is None or keys is None:
            return
        participant = self._participants[purpose]
        try:
            values = participant.mean_values(request)
        except MeanAbandonedError as exc:
            del self._pending[purpose]
            logger.warning("%s: %s not reported: %s", ctx.device_id, purpose, exc)
            return
        if values is None:
            return  # downloading; `on_model_ready` calls back
        del self._pending[purpose]
        codec = participant.mean_codec()
        if len(values) != codec.length:
            raise ValueError(f"{purpose}: {len(values)} values, codec {codec.length}")
        honest = codec.honest_range()
        values = np.clip(values, honest.low, honest.high)  # what the sum check assumes
        started = time.perf_counter()
        vector = encrypt_reals(
            keys.public_key,
            codec.fixed_point,
            codec.max_parties,
            values,
            obfuscators=keys.pool,
        )
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        message = MeanReport(
            federation=ctx.federation,
            round=request.round,
            sender=me,
            message_id=derived_id(me, purpose, request.epoch, request.round),
            purpose=purpose,
            epoch=request.epoch,
            model=request.model,
            model_version=request.model_version,
            ciphertext=vector.to_bytes(keys.public_key),
        )
        self._reports[purpose] = _Report(request, message)
        ctx.send(message)

    def _on_sum(self, message: MeanSum) -> None:
        participant = self._participants.get(message.purpose)
        if participant is None:
            return
        report = self._reports.get(message.purpose)
        head = (message.epoch, message.round, message.model_version)
        if (
            report is None
            or report.done
            or head
            != (
                report.request.epoch,
                report.request.round,
                report.request.model_version,
            )
        ):
            participant.on_sum_again(message)
            return
        keys = self.ctx.keys(message.epoch)
        secret_key = keys.secret_key
        if secret_key is None:
            raise NotReadyError
        codec = participant.mean_codec()
        try:
            totals = self._decrypted(message, keys.public_key, secret_key, codec)
            codec.honest_range().check(totals, message.num_parties)
            participant.check_mean(message, totals)
        except ImplausibleSumError as exc:
            self._refuse(report, message, str(exc))
            return
        report.done = True
        participant.on_mean(message, totals)

    def _decrypted(
        self,
        message: MeanSum,
        public_key: PaillierPublicKey,
        secret_key: PaillierSecretKey,
        codec: MeanCodec,
    ) -> FloatVector:
        """The sum's totals, once its party count and packing are plausible.

        Raises:
            ImplausibleSumError: more parties than could report, a header that
                disagrees, or a vector that does not decrypt under the codec.
        """
        check_parties(message.num_parties, self._most_parties(message, codec))
        started = time.perf_counter()
        try:
            vector = encrypted_vector_from(message.ciphertext, public_key)
            if vector.num_parties != message.num_parties:
                raise ImplausibleSumError(
                    f"the vector sums {vector.num_parties} parties, the header "
                    f"{message.num_parties}"
                )
            if vector.length != codec.length:
                raise ImplausibleSumError(
                    f"a sum of {vector.length} values; reports hold {codec.length}"
                )
            totals = decrypt_real_sum(
                secret_key, codec.fixed_point, codec.max_parties, vector
            )
        except CryptoError as exc:
            raise ImplausibleSumError(f"the sum does not decrypt: {exc}") from None
        finally:
            self.ctx.stats.crypto_s += time.perf_counter() - started
        return totals

    def _most_parties(self, message: MeanSum, codec: MeanCodec) -> int:
        """The most reports a sum of this epoch can hold: the codec's, the epoch's.

        (Not the registry's registrants: the coordinator may ask a device the
        registry left out, so that count is no bound.)
        """
        most = codec.max_parties
        notice = self.ctx.epoch
        if notice is not None and notice.epoch == message.epoch:
            most = min(most, notice.max_parties)
        return most

    def _refuse(self, report: _Report, message: MeanSum, reason: str) -> None:
        """Apply nothing; log and tell the coordinator why; the participant keeps."""
        ctx = self.ctx
        me = ctx.device_id
        logger.error(
            "%s: refused the %s sum of round %d (key epoch %d, %d parties): %s; "
            "keeping the previous state",
            me,
            message.purpose,
            message.round,
            message.epoch,
            message.num_parties,
            reason,
        )
        report.done = True
        ctx.send(
            ErrorReply(
                federation=ctx.federation,
                round=message.round,
                sender=me,
                message_id=derived_id(
                    me, "mean-refused", message.purpose, message.epoch, message.round
                ),
                code=MEAN_REFUSED,
                reason=f"{message.purpose} sum refused: {reason}"[:256],
                in_reply_to=message.message_id,
            )
        )
        self._participants[message.purpose].on_refused(report.request)


def with_secure_means(
    ctx: DeviceContext, methods: Sequence[DeviceMethod]
) -> list[DeviceMethod]:
    """``methods`` and, if any takes part in a mean, the `SecureMeans` serving them."""
    participants = [m for m in methods if isinstance(m, MeanParticipant)]
    if not participants:
        return list(methods)
    return [*methods, SecureMeans(ctx, participants)]
