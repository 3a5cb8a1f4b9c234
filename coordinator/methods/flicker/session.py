"""One FLICKER run, coordinator side: CKKS context, ring relay, GI, correction.

The protocol (the FLICKER paper, §2), as `FlickerSession` drives it::

    1  CkksContextAnnounce(transfer id) -> all (retained), then the public
       context (no Galois keys, ~465 KB) as manifest + chunks -> all;
       a device missing chunks sends ChunkRequest, answered on its down topic
    2  RingStart(ring id, order >= 3, hop deadline, signed members) -> each
       ring member
       device i -> RingHop(recipient i+1, contributors, box) -> coordinator
       coordinator -> the same bytes -> device i+1   (box = Enc(running sum)
       sealed device-to-device: the coordinator, which holds the CKKS key,
       never sees a partial sum)
       last device -> RingResult(contributors, Enc(GD)) -> coordinator
    3  GI = min(GD)/max(GD); while GI < nabla and a device is not saturated:
       CosineRequest(Enc(GD/||GD||)) -> each candidate
       candidate -> CosineReply(masked product) -> coordinator (cosine only)
       ResampleRequest(nabla_client) -> the dominant device
       [under-sampling: the global redundancy test, relayed and answered by
        `RedundancyRelay` (ursa.coordinator.methods.flicker.redundancy)]
       dominant -> CountUpdate(Enc(new - old counts), saturated)
       coordinator: Enc(GD) + Enc(delta) -> decrypt -> new GD

Silent devices: every hop is timed (``hop_deadline_s``, the context's clock,
`tick`). When the device holding the running sum stays silent, it is
skipped: the remaining order goes out in a new `RingStart` (same ring id)
and the predecessor re-seals its own outgoing sum to its new successor (or
sends the result, if it is now last); a predecessor that stays silent in turn
is skipped the same way. A ring that would fall below `MIN_RING_DEVICES` live
devices fails instead (the sum would expose a device). A candidate silent
during localisation is not chosen this time; a silent dominant device is
treated as saturated (`CorrectionLoop`). A peer silent in a redundancy test
is skipped at ``redundancy_deadline_s`` (the resample request waits that
long more). A broker outage gives every open deadline its time back
(`extend_deadlines`).

A run is named by its ring id: cosine and resample requests carry it as
``run_id`` with a ``step`` (1 for the first request, one more per request),
and a reply must repeat both, so a reply late from an earlier step or an
earlier run is recognised; ``round`` is the federation round the run belongs
to (`start`'s ``round_index``). The session admits nothing: the runtime that
hosts it (`CoordinatorService`, through `FlickerMethod`) checked topic,
federation, sender, enrolment, size and decoding and dropped seen ids. It
checks each message against the run and raises `RejectedError` for anything
else; the runtime answers with an `ErrorReply`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.context_transfer import ContextTransfer
from ursa.coordinator.methods.flicker.correction_loop import CorrectionLoop, LoopError
from ursa.coordinator.methods.flicker.outcome import (
    FlickerOutcome,
    FlickerPhase,
    FlickerServiceConfig,
)
from ursa.coordinator.methods.flicker.redundancy import (
    Outgoing,
    RedundancyError,
    RedundancyRelay,
)
from ursa.coordinator.methods.flicker.ring import FlickerRing, RingError
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.errors import CryptoError
from ursa.protocol.chunking import RequestLimitError, select_chunks
from ursa.protocol.envelope import encode, message_kind
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ChunkRequest,
    CkksContextAnnounce,
    CosineReply,
    CosineRequest,
    CountUpdate,
    ErrorCode,
    RedundancyOffer,
    RedundancyReply,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
)
from ursa.protocol.router import RejectedError

__all__ = ["COSINE_SLACK", "FlickerSession"]

logger = logging.getLogger("ursa.coordinator.flicker")

COSINE_SLACK = 1e-3
"""A decrypted cosine of two count vectors lies in [0, 1] up to CKKS error."""

_StepReply = CosineReply | CountUpdate | RedundancyOffer | RedundancyReply
_M = TypeVar("_M", bound=BaseMessage)


class FlickerSession:
    """The coordinator's state of one FLICKER run (module docstring).

    Args:
        config: Thresholds, deadlines and the number of classes.
        key_owner: The CKKS key pair (decrypts GD, cosines, products).
        context: The runtime's surface: send, relay, sign, the clock, the
            enrolled devices' keys and certificates (relayed in `RingStart`).
        rng: Ring orders.
    """

    def __init__(
        self,
        config: FlickerServiceConfig,
        key_owner: CkksKeyOwner,
        context: MethodContext,
        *,
        rng: np.random.Generator,
    ) -> None:
        self.config = config
        self.key_owner = key_owner
        self._ctx = context
        self._rng = rng
        self._context = key_owner.public_context()
        self._transfer = ContextTransfer(
            key_owner.public_context_bytes(), config.federation, config.chunk_size
        )
        self._phase = FlickerPhase.IDLE
        self._round = 0
        self._ring: FlickerRing | None = None
        self._step = 0
        self._loop: CorrectionLoop | None = None
        self._enc_gd: bytes | None = None
        self._gd_before: tuple[int, ...] | None = None
        self._failure: str | None = None
        self._redundancy = RedundancyRelay(
            key_owner,
            self._context.slot_count,
            self._message,
            deadline_s=config.redundancy_deadline_s,
            max_product_ciphertexts=config.max_product_ciphertexts,
        )

    # --- public surface -----------------------------------------------------

    @property
    def phase(self) -> FlickerPhase:
        """The current phase."""
        return self._phase

    @property
    def rng(self) -> np.random.Generator:
        """The generator of ring orders."""
        return self._rng

    def is_context_request(self, request: ChunkRequest) -> bool:
        """Whether a chunk request asks for the CKKS context (else: a model's)."""
        return self._transfer.is_for(request)

    @property
    def public_context_bytes(self) -> int:
        """Size of the public context every device downloads."""
        return self._transfer.manifest.total_size

    def outcome(self) -> FlickerOutcome:
        """The run so far (final once `phase` is DONE or FAILED)."""
        ring, loop = self._ring, self._loop
        return FlickerOutcome(
            phase=self._phase,
            ring_order=ring.order if ring else (),
            contributors=loop.state.devices if loop else (),
            skipped=ring.silent if ring else (),
            gd_before=self._gd_before,
            state=loop.state if loop else None,
            failure=self._failure,
            log=tuple(loop.log) if loop else (),
            run_id=ring.ring_id if ring else "",
        )

    def start(self, order: Sequence[str], *, round_index: int = 0) -> str:
        """Publish the CKKS context (once) and start a run; return its id.

        ``order`` lists the ring members (enrolled devices, at least
        `ursa.coordinator.methods.flicker.algorithm.MIN_RING_DEVICES`). The
        run's id is its ring id; ``round_index`` is the federation round its
        messages carry.

        Raises:
            FlickerError: a run is in progress, or a bad order.
        """
        if self._phase not in (
            FlickerPhase.IDLE,
            FlickerPhase.DONE,
            FlickerPhase.FAILED,
        ):
            raise fl.FlickerError(f"a FLICKER run is in phase {self._phase}")
        ring_order = tuple(order)
        unknown = [d for d in ring_order if self._ctx.device_identity(d) is None]
        if unknown:
            raise fl.FlickerError(f"not enrolled: {sorted(unknown)}")
        fl.choose_ring_order(ring_order, self._rng)  # validates
        if not self._transfer.published:
            self._publish_context()
        ring = FlickerRing.start(
            uuid.uuid4().hex, ring_order, self._ctx.now(), self.config.hop_deadline_s
        )
        self._ring, self._step, self._phase = ring, 0, FlickerPhase.RING
        self._round = round_index
        self._loop = self._enc_gd = self._gd_before = self._failure = None
        self._send_ring_start(ring)
        logger.info("FLICKER ring %s: %s", ring.ring_id, " > ".join(ring_order))
        return ring.ring_id

    # --- persistence (`FlickerMethod` keeps the run in the store) -------------

    @property
    def encrypted_counts(self) -> bytes | None:
        """``Enc(GD)`` of the run (stored apart: it changes far less often)."""
        return self._enc_gd

    def to_record(self) -> dict[str, Any]:
        """The run as a JSON-able record: phase, ring, correction loop."""
        ring, loop = self._ring, self._loop
        return {
            "phase": str(self._phase),
            "round": self._round,
            "step": self._step,
            "failure": self._failure,
            "published": self._transfer.published,
            "gd_before": None if self._gd_before is None else list(self._gd_before),
            "ring": None if ring is None else ring.to_record(),
            "loop": None if loop is None else loop.to_record(),
        }

    def restore(self, record: dict[str, Any], encrypted_counts: bytes | None) -> None:
        """Adopt a run saved by `to_record` (deadlines restart now); then `resume`.

        Raises:
            KeyError, TypeError, ValueError: a damaged record.
        """
        now = self._ctx.now()
        self._phase = FlickerPhase(record["phase"])
        self._round = int(record["round"])
        self._step = int(record["step"])
        self._failure = record["failure"]
        self._transfer.published = bool(record["published"])
        before = record["gd_before"]
        self._gd_before = None if before is None else tuple(int(c) for c in before)
        ring, loop = record["ring"], record["loop"]
        self._ring = None if ring is None else FlickerRing.from_record(ring)
        self._loop = None if loop is None else CorrectionLoop.from_record(loop, now)
        self._enc_gd = encrypted_counts

    def resume(self) -> None:
        """Re-send what the restored phase waits on (devices answer idempotently)."""
        ring, loop = self._ring, self._loop
        if self._phase is FlickerPhase.RING and ring is not None:
            ring.relay.restarted(self._ctx.now(), lambda holder, contributors: None)
            self._send_ring_start(ring)
        elif (
            self._phase in (FlickerPhase.LOCALISE, FlickerPhase.RESAMPLE)
            and loop is not None
        ):
            self._send_requests(loop)

    # --- what the runtime hands over ------------------------------------------

    def on_message(self, message: BaseMessage) -> None:
        """Act on one admitted message of the run's kinds.

        Raises:
            RejectedError: not what the run waits for (late, not asked,
                a bad ciphertext, ...).
        """
        if isinstance(message, RingHop):
            self._on_ring_hop(message)
        elif isinstance(message, RingResult):
            self._on_ring_result(message)
        elif isinstance(message, CosineReply):
            self._on_cosine_reply(message)
        elif isinstance(message, CountUpdate):
            self._on_count_update(message)
        elif isinstance(message, ChunkRequest):
            self._answer_chunks(message)
        elif isinstance(message, RedundancyOffer):
            self._on_redundancy_offer(message)
        elif isinstance(message, RedundancyReply):
            self._on_redundancy_reply(message)
        else:  # unreachable: the router hands over only these kinds
            kind = message_kind(message)
            raise RejectedError(ErrorCode.UNAUTHORISED, f"{kind} is not FLICKER's")

    def device_left(self, device: str) -> None:
        """A device went offline: skip it in the ring now, not at its deadline."""
        ring = self._ring
        if self._phase is not FlickerPhase.RING or ring is None:
            return
        try:
            skipped = ring.device_left(device, self._ctx.now())
        except RingError as exc:
            self._fail(exc.reason)
            return
        if skipped:
            logger.warning("FLICKER ring %s: %s left, skipped", ring.ring_id, device)
            self._send_ring_start(ring)

    def tick(self) -> None:
        """Act on passed deadlines (call every few hundred milliseconds)."""
        now = self._ctx.now()
        loop = self._loop
        if self._phase is FlickerPhase.RING and self._ring is not None:
            self._skip_holder(self._ring, now)
        elif loop is not None and not loop.is_over:
            run_id = self._ring.ring_id if self._ring else ""
            self._emit(*self._redundancy.on_tick(now, run_id))
            missing = loop.request.missing if loop.request else ()
            if loop.on_deadline(now):
                logger.warning("FLICKER step %d: no reply from %s", self._step, missing)
                self._send_requests(loop)

    def extend_deadlines(self, seconds: float) -> None:
        """Move every open deadline ``seconds`` later (a broker outage's time)."""
        if self._phase is FlickerPhase.RING and self._ring is not None:
            self._ring.postpone(seconds)
        elif self._loop is not None and not self._loop.is_over:
            self._loop.postpone(seconds)
            self._redundancy.postpone(seconds)

    # --- step 1: the CKKS public context ---------------------------------------

    def _publish_context(self) -> None:
        """Announce the context (retained) and send every chunk to all."""
        transfer = self._transfer
        tid = transfer.manifest.transfer_id
        self._ctx.send(self._message(CkksContextAnnounce, transfer_id=tid), None)
        for message in (transfer.manifest, *transfer.chunks):
            self._ctx.send(message, None)
        transfer.published = True

    def _answer_chunks(self, request: ChunkRequest) -> None:
        """Re-send the requested chunks to the requester (a few times each)."""
        transfer = self._transfer
        try:
            transfer.requests.check(request.sender, request.transfer_id)
        except RequestLimitError as exc:
            raise RejectedError(ErrorCode.TRANSFER_FAILED, str(exc)) from None
        try:
            chunks = select_chunks(transfer.chunks, request)
        except ProtocolError as exc:
            raise RejectedError(ErrorCode.MALFORMED, str(exc)) from None
        transfer.requests.spend(request.sender, request.transfer_id)
        for message in (transfer.manifest, *chunks):
            self._ctx.send(message, request.sender)

    # --- step 2: the ring ----------------------------------------------------

    def _current_ring(self) -> FlickerRing:
        if self._phase is not FlickerPhase.RING or self._ring is None:
            raise RejectedError(ErrorCode.LATE, "no ring is running")
        return self._ring

    def _on_ring_hop(self, message: RingHop) -> None:
        ring = self._current_ring()
        try:
            ring.accept_hop(
                message.ring_id,
                message.sender,
                message.contributors,
                message.hop_index,
                message.recipient,
                self._ctx.now(),
            )
        except RingError as exc:
            raise RejectedError(exc.code, exc.reason) from None
        # the device's message as it sent it (its box is sealed to the recipient)
        self._ctx.send_raw(encode(message), message_kind(message), message.recipient)

    def _on_ring_result(self, message: RingResult) -> None:
        ring = self._current_ring()
        try:
            ring.accept_result(
                message.ring_id, message.sender, message.contributors, self._ctx.now()
            )
        except RingError as exc:
            raise RejectedError(exc.code, exc.reason) from None
        try:
            gd = fl.decrypt_global_counts(
                self.key_owner, message.total, self.config.num_classes
            )
            state = fl.start(
                list(message.contributors),
                gd,
                nabla=self.config.nabla,
                max_updates=self.config.max_updates,
            )
        except (CryptoError, fl.FlickerError) as exc:
            self._fail(f"bad ring result from {message.sender}: {exc}")
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        self._enc_gd, self._gd_before = message.total, state.global_counts
        logger.info("FLICKER GD %s, GI %.4f", list(state.global_counts), state.gi)
        loop = CorrectionLoop(state, self.config.reply_deadline_s, self._ctx.now())
        self._loop = loop
        self._send_requests(loop)

    def _skip_holder(self, ring: FlickerRing, now: float) -> None:
        try:
            silent = ring.skip_overdue(now)
        except RingError as exc:
            self._fail(exc.reason)
            return
        if silent is None:
            return
        logger.warning("FLICKER ring %s: %s silent, skipped", ring.ring_id, silent)
        self._send_ring_start(ring)

    def _send_ring_start(self, ring: FlickerRing) -> None:
        """Tell every live member the order, signed, with the members' keys."""
        ctx = self._ctx
        members = []
        for device in ring.live:
            identity = ctx.device_identity(device)
            if identity is None:  # revoked since the ring started: skipped later
                continue
            members.append(device_keys_of(identity, ctx.device_certificate(device)))
        start = self._message(
            RingStart,
            ring_id=ring.ring_id,
            order=ring.live,
            hop_deadline_s=self.config.hop_deadline_s,
            members=tuple(members),
        )
        signed = ctx.sign(start)
        for device in ring.live:
            ctx.send(signed, device)

    # --- steps 3-4: localisation and correction -------------------------------

    def _send_requests(self, loop: CorrectionLoop) -> None:
        """Send the loop's open request, or finish the run."""
        request, self._step, ring = loop.request, loop.step, self._ring
        self._redundancy.reset()
        if request is None or ring is None:  # ring: unreachable, set with the loop
            self._phase, state = FlickerPhase.DONE, loop.state
            logger.info("FLICKER done: %s, GI %.4f", state.stop_reason, state.gi)
            return
        if request.kind == "cosine":
            self._phase = FlickerPhase.LOCALISE
            unit = fl.encrypt_normalised_global(self._context, loop.state.global_counts)
            cosine = self._message(
                CosineRequest, run_id=ring.ring_id, step=request.step, ciphertext=unit
            )
            for device in sorted(request.targets):
                self._ctx.send(cosine, device)
            return
        self._phase = FlickerPhase.RESAMPLE
        (dominant,) = request.targets
        resample = self._message(
            ResampleRequest,
            run_id=ring.ring_id,
            step=request.step,
            nabla_client=self.config.nabla_client,
        )
        self._ctx.send(resample, dominant)

    def _current_step(self, message: _StepReply) -> CorrectionLoop:
        """The open loop a reply belongs to (its run and step are checked)."""
        loop, ring = self._loop, self._ring
        if loop is None or loop.is_over:
            raise RejectedError(ErrorCode.LATE, "no correction step is open")
        if ring is None or message.run_id != ring.ring_id:  # ring: set with the loop
            reason = f"reply of run {message.run_id}, not of the current run"
            raise RejectedError(ErrorCode.LATE, reason)
        return loop

    def _on_cosine_reply(self, message: CosineReply) -> None:
        loop = self._current_step(message)
        try:
            loop.check_reply("cosine", message.sender, message.step)
            cosine = fl.decrypt_similarity(self.key_owner, message.masked_product)
        except LoopError as exc:
            raise RejectedError(exc.code, exc.reason) from None
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        if not -COSINE_SLACK <= cosine <= 1.0 + COSINE_SLACK:
            reason = f"cosine {cosine} not in [0, 1]"
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, reason)
        if loop.on_cosine(message.sender, message.step, cosine, self._ctx.now()):
            self._send_requests(loop)

    def _on_count_update(self, message: CountUpdate) -> None:
        loop, enc_gd = self._current_step(message), self._enc_gd
        try:
            loop.check_reply("resample", message.sender, message.step)
            if enc_gd is None:  # unreachable: set with the loop
                raise LoopError(ErrorCode.LATE, "no global counts yet")
            updated = self._context.add(enc_gd, message.delta)
            gd = fl.decrypt_global_counts(
                self.key_owner, updated, self.config.num_classes
            )
        except LoopError as exc:
            raise RejectedError(exc.code, exc.reason) from None
        except (CryptoError, fl.FlickerError) as exc:
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        changed = tuple(int(c) for c in gd) != loop.state.global_counts
        if changed:
            self._enc_gd = updated
        new_gd, now = (gd if changed else None), self._ctx.now()
        loop.on_update(message.sender, message.step, new_gd, message.saturated, now)
        self._send_requests(loop)

    # --- the global redundancy test (during a resampling step) ---------------

    def _on_redundancy_offer(self, message: RedundancyOffer) -> None:
        loop = self._current_step(message)
        try:
            loop.check_reply("resample", message.sender, message.step)
            out = self._redundancy.on_offer(
                message, loop.state.devices, loop.state.global_counts, self._ctx.now()
            )
        except (LoopError, RedundancyError) as exc:
            raise RejectedError(exc.code, exc.reason) from None
        test = self._redundancy.test
        if test is not None:  # the dominant device's step waits for the test
            later = test.deadline_at + self.config.reply_deadline_s
            loop.extend_deadline(message.step, later)
        self._emit(out, None)

    def _on_redundancy_reply(self, message: RedundancyReply) -> None:
        self._current_step(message)
        try:
            self._emit(*self._redundancy.on_reply(message, self._ctx.now()))
        except RedundancyError as exc:
            raise RejectedError(exc.code, exc.reason) from None
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None

    def _emit(self, out: Outgoing, summary: dict[str, Any] | None) -> None:
        for message, device in out:
            self._ctx.send(message, device)
        if summary is not None and self._loop is not None:
            if summary["silent"]:
                logger.warning(
                    "FLICKER step %d: redundancy test skipped %s",
                    self._step,
                    summary["silent"],
                )
            self._loop.log.append(summary)

    # --- plumbing -------------------------------------------------------------

    def _message(self, cls: type[_M], **fields: Any) -> _M:
        """A coordinator message of the current run's round (the runtime stamps it)."""
        return cls(
            federation=self.config.federation,
            round=self._round,
            sender=COORDINATOR,
            **fields,
        )

    def _fail(self, reason: str) -> None:
        logger.error("FLICKER failed: %s", reason)
        self._phase, self._failure = FlickerPhase.FAILED, reason
