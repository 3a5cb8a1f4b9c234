"""FLICKER over the wire, coordinator side: CKKS context, ring relay, GI, correction.

The protocol (the FLICKER paper, §2), as `FlickerCoordinator` drives it::

    1  CkksContextAnnounce(transfer id) -> all (retained), then the public
       context (no Galois keys, ~465 KB) as manifest + chunks -> all;
       a device missing chunks sends ChunkRequest, answered on its down topic
    2  RingStart(ring id, order >= 3, hop deadline) -> each ring member
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

Silent devices: the coordinator times every hop (``hop_deadline_s``, an
injected clock, `tick`). When the device holding the running sum stays silent,
it is skipped: the coordinator sends the remaining order in a new `RingStart`
(same ring id) and the predecessor re-seals its own outgoing sum to its new
successor (or sends the result, if it is now last); a predecessor that stays
silent in turn is skipped the same way. A ring that would fall below
`MIN_RING_DEVICES` live devices fails instead (the sum would expose a
device). A candidate silent during localisation is not chosen this time; a
silent dominant device is treated as saturated (`CorrectionLoop`). A peer
silent in a redundancy test is skipped at ``redundancy_deadline_s`` (the
resample request waits that long more).

A run is named by its ring id: cosine and resample requests carry it as
``run_id`` with a ``step`` (1 for the first request, one more per request),
and a reply must repeat both, so a reply late from an earlier step or an
earlier run is recognised; ``round`` is the federation round the run belongs
to (`start`'s ``round_index``). Every incoming message is admitted (topic,
federation, sender, enrolment, size, decode, duplicate id: by
`CoordinatorService`'s runtime when FLICKER runs as its method
(`ursa.coordinator.methods.flicker.method`), else by `FlickerWire` in a
stand-alone run) and checked against the stage; anything else is rejected
with a logged reason (kept in `rejections`) and an `ErrorReply` to the
sender, never an exception.
Phase, config and outcome types live in `ursa.coordinator.methods.flicker.outcome`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.loop import CorrectionLoop, LoopError
from ursa.coordinator.methods.flicker.outcome import (
    DEFAULT_HOP_DEADLINE_S,
    DEFAULT_NABLA_CLIENT,
    DEFAULT_REPLY_DEADLINE_S,
    FlickerOutcome,
    FlickerServiceConfig,
    Phase,
    RefusedError,
    Rejection,
)
from ursa.coordinator.methods.flicker.redundancy import (
    Outgoing,
    RedundancyError,
    RedundancyRelay,
)
from ursa.coordinator.methods.flicker.ring import FlickerRing, RingError
from ursa.coordinator.methods.flicker.wire import ContextTransfer, FlickerWire, Sign
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.envelope import encode, message_kind
from ursa.protocol.messages import (
    BaseMessage,
    ChunkRequest,
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
from ursa.protocol.outbox import Outbox
from ursa.protocol.transport import Transport

__all__ = [
    "DEFAULT_HOP_DEADLINE_S",
    "DEFAULT_NABLA_CLIENT",
    "DEFAULT_REPLY_DEADLINE_S",
    "FlickerCoordinator",
    "FlickerOutcome",
    "FlickerServiceConfig",
    "Phase",
    "Rejection",
]

logger = logging.getLogger("ursa.coordinator.methods.flicker.algorithm")

Clock = Callable[[], float]

COSINE_SLACK = 1e-3
"""A decrypted cosine of two count vectors lies in [0, 1] up to CKKS error."""

_StepReply = CosineReply | CountUpdate | RedundancyOffer | RedundancyReply

_KINDS = (
    RingHop,
    RingResult,
    CosineReply,
    CountUpdate,
    ChunkRequest,
    RedundancyOffer,
    RedundancyReply,
)
"""Messages this module handles; anything else belongs to another protocol."""


class FlickerCoordinator(FlickerWire):
    """Runs FLICKER for one federation over a `Transport`.

    Args:
        config: Thresholds, deadlines and the number of classes.
        devices: The enrolled devices' public identities (who may take part).
        transport: Where messages go; `attach` makes it deliver to `handle`
            (a service that routes messages itself calls `on_message`).
        clock: Seconds, for deadlines (tests inject a fake one).
        rng: Ring order.
        key_owner: The CKKS key pair; a fresh one by default.
        certificates: The devices' operator certificates, relayed with their
            keys in a signed `RingStart` (a live table, like ``devices``).
    """

    def __init__(
        self,
        config: FlickerServiceConfig,
        devices: Mapping[str, DevicePublicIdentity],
        transport: Transport | None,
        *,
        clock: Clock = time.monotonic,
        rng: np.random.Generator | None = None,
        key_owner: CkksKeyOwner | None = None,
        outbox: Outbox | None = None,
        sign: Sign | None = None,
        certificates: Mapping[str, bytes] | None = None,
    ) -> None:
        super().__init__(config, devices, transport, outbox=outbox, sign=sign)
        self._certificates: Mapping[str, bytes] = (
            certificates if certificates is not None else {}
        )
        self.key_owner = key_owner if key_owner is not None else CkksKeyOwner()
        self._context = self.key_owner.public_context()
        self._clock = clock
        self._rng = rng if rng is not None else np.random.default_rng()
        self._transfer = ContextTransfer(
            self.key_owner.public_context_bytes(), config.federation, config.chunk_size
        )
        self._phase = Phase.IDLE
        self._ring: FlickerRing | None = None
        self._step = 0
        self._loop: CorrectionLoop | None = None
        self._enc_gd: bytes | None = None
        self._gd_before: tuple[int, ...] | None = None
        self._failure: str | None = None
        self._redundancy = RedundancyRelay(
            self.key_owner,
            self._context.slot_count,
            self._message,
            deadline_s=config.redundancy_deadline_s,
            max_product_ciphertexts=config.max_product_ciphertexts,
        )

    # --- public surface -----------------------------------------------------

    @property
    def phase(self) -> Phase:
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
        with self._lock:
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

    def start(self, order: Sequence[str] | None = None, *, round_index: int = 0) -> str:
        """Publish the CKKS context (once) and start a run; return its id.

        ``order`` (default: a random permutation of the enrolled devices) lists
        the ring members; at least
        `ursa.coordinator.methods.flicker.algorithm.MIN_RING_DEVICES`.
        The run's id is its ring id; ``round_index`` is the federation round
        its messages carry.

        Raises:
            FlickerError: a run is in progress, or a bad order.
        """
        with self._lock:
            if self._phase not in (Phase.IDLE, Phase.DONE, Phase.FAILED):
                raise fl.FlickerError(f"a FLICKER run is in phase {self._phase}")
            if order is None:
                ring_order = fl.choose_ring_order(sorted(self.devices), self._rng)
            else:
                ring_order = tuple(order)
                unknown = set(ring_order) - set(self.devices)
                if unknown:
                    raise fl.FlickerError(f"not enrolled: {sorted(unknown)}")
                fl.choose_ring_order(ring_order, self._rng)  # validates
            if not self._transfer.published:
                self._publish_context(self._transfer)
            ring = FlickerRing.start(
                uuid.uuid4().hex, ring_order, self._clock(), self.config.hop_deadline_s
            )
            self._ring, self._step, self._phase = ring, 0, Phase.RING
            self._round = round_index
            self._loop = self._enc_gd = self._gd_before = self._failure = None
            self._send_ring_start(ring)
            logger.info("FLICKER ring %s: %s", ring.ring_id, " > ".join(ring_order))
            ring_id = ring.ring_id
        self._flush()
        return ring_id

    # --- persistence (a service keeps the run in its store) --------------------

    @property
    def encrypted_counts(self) -> bytes | None:
        """``Enc(GD)`` of the run (stored apart: it changes far less often)."""
        return self._enc_gd

    def to_record(self) -> dict[str, Any]:
        """The run as a JSON-able record: phase, ring, correction loop."""
        with self._lock:
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
        now = self._clock()
        with self._lock:
            self._phase = Phase(record["phase"])
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
        with self._lock:
            ring, loop = self._ring, self._loop
            if self._phase is Phase.RING and ring is not None:
                ring.relay.restarted(self._clock(), lambda holder, contributors: None)
                self._send_ring_start(ring)
            elif self._phase in (Phase.LOCALISE, Phase.RESAMPLE) and loop is not None:
                self._send_requests(loop)
        self._flush()

    def on_message(
        self,
        device: str | None,
        message: BaseMessage,
        payload: bytes | None = None,
        *,
        admitted: bool = False,
    ) -> None:
        """Act on one decoded message from ``device`` (the topic's device id).

        ``payload`` is the message as received; ring hops are relayed as these
        exact bytes (re-encoded when it is None). ``admitted``: a runtime
        already checked federation, sender and enrolment and dropped a seen
        message id (`CoordinatorService`), so this engine does not again.
        """
        kind = message_kind(message)
        if not isinstance(message, _KINDS):
            return  # another protocol's message (Dubhe, models): not ours
        if isinstance(message, ChunkRequest) and not self._transfer.is_for(message):
            return  # a model transfer: not ours
        try:
            with self._lock:
                if not admitted:
                    self._admit(device, message)
                if admitted or self._first_time(message.message_id):
                    self._dispatch(message, payload)
        except RefusedError as exc:
            self._refuse(device, kind, exc.code, exc.reason, message.message_id)
        except Exception as exc:  # nothing a device sends may crash the run
            logger.exception("FLICKER: %s from %s failed", kind, device)
            self._refuse(device, kind, ErrorCode.INTERNAL, repr(exc), None)
        self._flush()

    def device_left(self, device: str) -> None:
        """A device went offline: skip it in the ring now, not at its deadline."""
        with self._lock:
            ring = self._ring
            if self._phase is not Phase.RING or ring is None:
                return
            try:
                skipped = ring.device_left(device, self._clock())
            except RingError as exc:
                self._fail(exc.reason)
                return
            if skipped:
                ring_id = ring.ring_id
                logger.warning("FLICKER ring %s: %s left, skipped", ring_id, device)
                self._send_ring_start(ring)
        self._flush()

    def tick(self) -> None:
        """Act on passed deadlines (call every few hundred milliseconds)."""
        with self._lock:
            now = self._clock()
            if self._phase is Phase.RING and self._ring is not None:
                self._skip_holder(self._ring, now)
            elif self._loop is not None and not self._loop.is_over:
                run_id = self._ring.ring_id if self._ring else ""
                self._emit(*self._redundancy.on_tick(now, run_id))
                missing = self._loop.request.missing if self._loop.request else ()
                if self._loop.on_deadline(now):
                    logger.warning(
                        "FLICKER step %d: no reply from %s", self._step, missing
                    )
                    self._send_requests(self._loop)
        self._flush()

    # --- dispatch ---------------------------------------------------------------

    def _dispatch(self, message: BaseMessage, payload: bytes | None) -> None:
        if isinstance(message, RingHop):
            self._on_ring_hop(message, payload or encode(message))
        elif isinstance(message, RingResult):
            self._on_ring_result(message)
        elif isinstance(message, CosineReply):
            self._on_cosine_reply(message)
        elif isinstance(message, CountUpdate):
            self._on_count_update(message)
        elif isinstance(message, ChunkRequest):
            self._answer_chunks(self._transfer, message)
        elif isinstance(message, RedundancyOffer):
            self._on_redundancy_offer(message)
        elif isinstance(message, RedundancyReply):
            self._on_redundancy_reply(message)

    # --- step 2: the ring ----------------------------------------------------

    def _current_ring(self) -> FlickerRing:
        if self._phase is not Phase.RING or self._ring is None:
            raise RefusedError(ErrorCode.LATE, "no ring is running")
        return self._ring

    def _on_ring_hop(self, message: RingHop, payload: bytes) -> None:
        ring = self._current_ring()
        try:
            ring.accept_hop(
                message.ring_id,
                message.sender,
                message.contributors,
                message.hop_index,
                message.recipient,
                self._clock(),
            )
        except RingError as exc:
            raise RefusedError(exc.code, exc.reason) from None
        self._relay(payload, message.recipient)

    def _on_ring_result(self, message: RingResult) -> None:
        ring = self._current_ring()
        try:
            ring.accept_result(
                message.ring_id, message.sender, message.contributors, self._clock()
            )
        except RingError as exc:
            raise RefusedError(exc.code, exc.reason) from None
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
            raise RefusedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        self._enc_gd, self._gd_before = message.total, state.global_counts
        logger.info("FLICKER GD %s, GI %.4f", list(state.global_counts), state.gi)
        self._loop = CorrectionLoop(state, self.config.reply_deadline_s, self._clock())
        self._send_requests(self._loop)

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
        """Tell every live member the order (signed, with their keys, in a service)."""
        start: BaseMessage = self._message(
            RingStart,
            ring_id=ring.ring_id,
            order=ring.live,
            hop_deadline_s=self.config.hop_deadline_s,
        )
        if self._sign is not None:
            members = tuple(
                device_keys_of(self.devices[d], self._certificates.get(d, b""))
                for d in ring.live
            )
            start = self._sign(start.model_copy(update={"members": members}))
        for device in ring.live:
            self._send(start, device)

    # --- steps 3-4: localisation and correction -------------------------------

    def _send_requests(self, loop: CorrectionLoop) -> None:
        """Send the loop's open request, or finish the run."""
        request, self._step, ring = loop.request, loop.step, self._ring
        self._redundancy.reset()
        if request is None or ring is None:  # ring: unreachable, set with the loop
            self._phase, state = Phase.DONE, loop.state
            logger.info("FLICKER done: %s, GI %.4f", state.stop_reason, state.gi)
            return
        if request.kind == "cosine":
            self._phase = Phase.LOCALISE
            counts = loop.state.global_counts
            unit = fl.encrypt_normalised_global(self._context, counts)
            cosine = self._message(
                CosineRequest, run_id=ring.ring_id, step=request.step, ciphertext=unit
            )
            for device in sorted(request.targets):
                self._send(cosine, device)
        else:
            self._phase = Phase.RESAMPLE
            (dominant,) = request.targets
            nabla_client = self.config.nabla_client
            resample = self._message(
                ResampleRequest,
                run_id=ring.ring_id,
                step=request.step,
                nabla_client=nabla_client,
            )
            self._send(resample, dominant)

    def _current_loop(self) -> CorrectionLoop:
        if self._loop is None or self._loop.is_over:
            raise RefusedError(ErrorCode.LATE, "no correction step is open")
        return self._loop

    def _current_step(self, message: _StepReply) -> CorrectionLoop:
        """The open loop a reply belongs to (its run and step are checked)."""
        loop, ring = self._current_loop(), self._ring
        if ring is None or message.run_id != ring.ring_id:  # ring: set with the loop
            reason = f"reply of run {message.run_id}, not of the current run"
            raise RefusedError(ErrorCode.LATE, reason)
        return loop

    def _on_cosine_reply(self, message: CosineReply) -> None:
        loop = self._current_step(message)
        try:
            loop.check_reply("cosine", message.sender, message.step)
            cosine = fl.decrypt_similarity(self.key_owner, message.masked_product)
        except LoopError as exc:
            raise RefusedError(exc.code, exc.reason) from None
        except CryptoError as exc:
            raise RefusedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        if not -COSINE_SLACK <= cosine <= 1.0 + COSINE_SLACK:
            reason = f"cosine {cosine} not in [0, 1]"
            raise RefusedError(ErrorCode.BAD_CIPHERTEXT, reason)
        if loop.on_cosine(message.sender, message.step, cosine, self._clock()):
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
            raise RefusedError(exc.code, exc.reason) from None
        except (CryptoError, fl.FlickerError) as exc:
            raise RefusedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        changed = tuple(int(c) for c in gd) != loop.state.global_counts
        if changed:
            self._enc_gd = updated
        new_gd, now = (gd if changed else None), self._clock()
        loop.on_update(message.sender, message.step, new_gd, message.saturated, now)
        self._send_requests(loop)

    # --- the global redundancy test (during a resampling step) ---------------

    def _on_redundancy_offer(self, message: RedundancyOffer) -> None:
        loop = self._current_step(message)
        try:
            loop.check_reply("resample", message.sender, message.step)
            out = self._redundancy.on_offer(
                message, loop.state.devices, loop.state.global_counts, self._clock()
            )
        except (LoopError, RedundancyError) as exc:
            raise RefusedError(exc.code, exc.reason) from None
        test = self._redundancy.test
        if test is not None:  # the dominant device's step waits for the test
            later = test.deadline_at + self.config.reply_deadline_s
            loop.extend_deadline(message.step, later)
        self._emit(out, None)

    def _on_redundancy_reply(self, message: RedundancyReply) -> None:
        self._current_step(message)
        try:
            self._emit(*self._redundancy.on_reply(message, self._clock()))
        except RedundancyError as exc:
            raise RefusedError(exc.code, exc.reason) from None
        except CryptoError as exc:
            raise RefusedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None

    def _emit(self, out: Outgoing, summary: dict[str, Any] | None) -> None:
        for message, device in out:
            self._send(message, device)
        if summary is not None and self._loop is not None:
            if summary["silent"]:
                logger.warning(
                    "FLICKER step %d: redundancy test skipped %s",
                    self._step,
                    summary["silent"],
                )
            self._loop.log.append(summary)

    # --- plumbing -------------------------------------------------------------

    def _fail(self, reason: str) -> None:
        logger.error("FLICKER failed: %s", reason)
        self._phase, self._failure = Phase.FAILED, reason
