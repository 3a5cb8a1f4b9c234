"""Wire plumbing of the coordinator's FLICKER service: admit, queue, refuse, publish.

`FlickerWire` knows topics and envelopes, not the protocol: it decodes what
arrives on device up topics (refusing, with an `ErrorReply`, what does not
decode), admits a message (federation, sender = topic device, enrolled) and
drops QoS 1 redeliveries by message id. Replies are queued under the state
lock and published in order outside it. It publishes the CKKS public context
as a chunked transfer (`ContextTransfer`) and answers chunk requests for it.
`FlickerCoordinator` builds on it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ursa.coordinator.methods.flicker.outcome import (
    FlickerServiceConfig,
    RefusedError,
    Rejection,
)
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.signing_point import signed_for_devices
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.chunking import (
    RequestBudget,
    RequestLimitError,
    select_chunks,
    split,
)
from ursa.protocol.envelope import (
    decode,
    encode,
    message_kind,
)
from ursa.protocol.errors import OversizeError, ProtocolError, VersionError
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ChunkRequest,
    CkksContextAnnounce,
    ErrorCode,
    ErrorReply,
)
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import (
    CKKS_CONTEXT,
    CONTROL,
    RETAINED_GLOBAL_NAMES,
    coordinator_subscriptions,
    down_topic,
    global_topic,
    name_for,
    parse_topic,
    qos_for,
)
from ursa.protocol.transport import Transport
from ursa.protocol.untrusted_text import escape

__all__ = ["MAX_REJECTIONS_KEPT", "SEEN_IDS", "ContextTransfer", "FlickerWire"]

logger = logging.getLogger("ursa.coordinator.methods.flicker.algorithm")

MAX_REJECTIONS_KEPT = 1000
"""Refusals `FlickerWire.rejections` keeps (the oldest go first)."""
SEEN_IDS = 8192
"""Message ids remembered to drop redeliveries."""

_M = TypeVar("_M", bound=BaseMessage)


class ContextTransfer:
    """The CKKS public context as one chunked transfer (manifest + chunks)."""

    def __init__(self, data: bytes, federation: str, chunk_size: int) -> None:
        """Split ``data`` into chunks of ``chunk_size`` bytes.

        The transfer id is the context's hash: a restarted coordinator with the
        same key announces the same transfer, which devices keep.
        """
        self.manifest, self.chunks = split(
            data,
            purpose=CKKS_CONTEXT,
            federation=federation,
            round=0,
            sender=COORDINATOR,
            chunk_size=chunk_size,
            transfer_id=hashlib.sha256(data).hexdigest()[:32],
        )
        self.published = False
        self.requests = RequestBudget()
        """Re-requests answered per device (`select_chunks` can send it all)."""

    def is_for(self, request: ChunkRequest) -> bool:
        """Whether a chunk request asks for this transfer."""
        return request.transfer_id == self.manifest.transfer_id


Sign = Callable[[BaseMessage], BaseMessage]
"""The coordinator's signature over a message: stamps the run, then signs."""


class FlickerWire:
    """Decoding, admission, outbox and error replies; subclasses add `on_message`.

    Args:
        config: The service config (federation).
        devices: The enrolled devices' public identities (who may send); a
            service passes its live enrolment table.
        transport: Where messages go; None inside a `CoordinatorService`,
            whose outbox (``outbox``) the service flushes itself.
        outbox: The queue to publish through (default: its own).
        sign: The coordinator's signature; a service run signs every message
            but a chunk with it (`envelope.signed_by_coordinator`), as its own.
    """

    def __init__(
        self,
        config: FlickerServiceConfig,
        devices: Mapping[str, DevicePublicIdentity],
        transport: Transport | None,
        *,
        outbox: Outbox | None = None,
        sign: Sign | None = None,
    ) -> None:
        self.config = config
        self._sign = sign
        self.devices = devices
        self.rejections: list[Rejection] = []
        """The newest `MAX_REJECTIONS_KEPT` refusals (reasons escaped)."""
        self._refusals = RefusalLog(logger)
        self._transport = transport
        self._lock = threading.Lock()
        self._flush_lock = threading.RLock()
        self._outbox = outbox if outbox is not None else Outbox("coordinator (FLICKER)")
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._round = 0

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to device topics."""
        if self._transport is None:
            raise RuntimeError("attach() needs a transport (a service routes itself)")
        self._transport.set_handler(self.handle)
        for pattern in coordinator_subscriptions(self.config.federation):
            self._transport.subscribe(pattern)

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: decode one raw message, then `on_message`."""
        try:
            where = parse_topic(topic)
        except ProtocolError as exc:
            self._note(None, "?", ErrorCode.MALFORMED, f"bad topic: {exc}")
            return
        if where.federation != self.config.federation or where.direction != "up":
            return  # status and other federations: not FLICKER's business
        device = where.device
        try:
            message = decode(payload)
        except VersionError as exc:
            self._refuse(device, "?", ErrorCode.UNSUPPORTED_VERSION, str(exc), None)
            return
        except OversizeError as exc:
            self._refuse(device, "?", ErrorCode.OVERSIZE, str(exc), None)
            return
        except ProtocolError as exc:
            self._refuse(device, "?", ErrorCode.MALFORMED, str(exc), None)
            return
        self.on_message(device, message, payload)

    def on_message(
        self, device: str | None, message: BaseMessage, payload: bytes | None = None
    ) -> None:
        """Act on one decoded message from ``device`` (the topic's device id)."""
        raise NotImplementedError

    # --- admission --------------------------------------------------------------

    def _admit(self, device: str | None, message: BaseMessage) -> None:
        """Refuse a message of another federation, sender or an unknown device."""
        if message.federation != self.config.federation:
            raise RefusedError(ErrorCode.UNAUTHORISED, "another federation")
        if device is None or message.sender != device:
            raise RefusedError(ErrorCode.UNAUTHORISED, "sender differs from the topic")
        if device not in self.devices:
            raise RefusedError(ErrorCode.UNKNOWN_DEVICE, f"{device} is not enrolled")

    def _first_time(self, message_id: str) -> bool:
        """Whether a message id is new (a QoS 1 redelivery is not)."""
        if message_id in self._seen:
            logger.debug("duplicate %s ignored", message_id)
            return False
        self._seen[message_id] = None
        if len(self._seen) > SEEN_IDS:
            self._seen.popitem(last=False)
        return True

    # --- the CKKS public context ------------------------------------------------

    def _publish_context(self, transfer: ContextTransfer) -> None:
        """Announce the context (retained) and send every chunk to all."""
        tid = transfer.manifest.transfer_id
        self._send(self._message(CkksContextAnnounce, transfer_id=tid), None)
        for message in (transfer.manifest, *transfer.chunks):
            self._send(message, None)
        transfer.published = True

    def _answer_chunks(self, transfer: ContextTransfer, request: ChunkRequest) -> None:
        """Re-send the requested chunks to the requester (a few times each)."""
        try:
            transfer.requests.check(request.sender, request.transfer_id)
        except RequestLimitError as exc:
            raise RefusedError(ErrorCode.TRANSFER_FAILED, str(exc)) from None
        try:
            chunks = select_chunks(transfer.chunks, request)
        except ProtocolError as exc:
            raise RefusedError(ErrorCode.MALFORMED, str(exc)) from None
        transfer.requests.spend(request.sender, request.transfer_id)
        for message in (transfer.manifest, *chunks):
            self._send(message, request.sender)

    # --- sending ----------------------------------------------------------------

    def _message(self, cls: type[_M], **fields: Any) -> _M:
        """A coordinator message of the current run's round."""
        return cls(
            federation=self.config.federation,
            round=self._round,
            sender=COORDINATOR,
            **fields,
        )

    def _send(self, message: BaseMessage, device: str | None) -> None:
        """Queue a message for one device, or for all (retained where it should be)."""
        name = name_for(message_kind(message))
        fed = self.config.federation
        if device is None:
            topic, retain = global_topic(fed, name), name in RETAINED_GLOBAL_NAMES
        else:
            topic, retain = down_topic(fed, device, name), False
        run = self.config.run
        stamped = message
        if message.run != run:  # every message carries the service's run
            stamped = message.model_copy(update={"run": run})
        if self._sign is not None:
            stamped = signed_for_devices(message, stamped, self._sign)
        self._outbox.put(topic, encode(stamped), qos_for(name), retain)

    def _relay(self, payload: bytes, device: str) -> None:
        """Queue a device's message, as received, for another device."""
        topic = down_topic(self.config.federation, device, CONTROL)
        self._outbox.put(topic, payload, qos_for(CONTROL))

    def _refuse(
        self,
        device: str | None,
        kind: str,
        code: str,
        reason: str,
        in_reply_to: str | None,
    ) -> None:
        """Record a refusal and tell an enrolled sender why."""
        self._note(device, kind, code, reason)
        if device is None or device not in self.devices:
            return
        reply = self._message(
            ErrorReply, code=code, reason=reason[:256], in_reply_to=in_reply_to
        )
        with self._lock:
            self._send(reply, device)

    def _note(self, device: str | None, kind: str, code: str, why: str) -> None:
        """Log (within the device's refusal limits, escaped) and keep a refusal."""
        line = "FLICKER rejected %s from %s: %s: %s"
        now = time.monotonic()
        self._refusals.write(
            now, device, logging.WARNING, line, kind, device, code, why, kind=str(code)
        )
        self.rejections.append(Rejection(device, kind, str(code), escape(why)))
        if len(self.rejections) > MAX_REJECTIONS_KEPT:
            del self.rejections[0]

    def _flush(self) -> None:
        """Publish queued messages in order, outside the state lock."""
        if self._transport is not None:  # else the service flushes its outbox
            self._outbox.flush(self._transport)
