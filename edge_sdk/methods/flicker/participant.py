"""FLICKER over the wire, device side: context download, ring hops, cosine, resampling.

A `FlickerParticipant` answers the coordinator's FLICKER messages (see
`ursa.coordinator.methods.flicker.engine` for the whole protocol) for one device:

* **context**: the announced CKKS public context arrives as a chunked
  transfer (capped at ``max_context_bytes``; missing chunks are re-requested
  when work needs the context); work that arrives first waits for it;
* **ring**: the first device of the order encrypts its counts; every other
  one opens the box from its predecessor, adds its counts and seals the sum
  to its successor (`ring_seal_context` binds federation, ring, hop and
  contributors); the last one sends ``Enc(GD)`` to the coordinator, never
  with fewer than `MIN_RING_DEVICES` contributors. When the coordinator
  announces a shorter order (a silent device skipped), a device that already
  sent re-seals its own outgoing sum to its new successor;
* **localisation**: a masked product of ``Enc(GD/||GD||)`` with its unit count
  vector (`ursa.edge_sdk.methods.flicker.algorithm.similarity_reply`);
* **resampling**: one `resample_step` per request with its `Resampler`
  (`CountResampler` for count-level runs,
  `ursa.edge_sdk.methods.flicker.resampling.DataResampler`
  on images), then ``Enc(new - old counts)`` and the saturation flag;
* **global redundancy test** (`ursa.edge_sdk.methods.flicker.redundancy`): a
  `DataResampler` without a ``global_test`` gets a `WireGlobalTest`, so its
  under-sampling asks the other live devices of the run (its step waits for
  the coordinator's results); every device answers other devices' asks with
  its class feature vectors (none without a `DataResampler`).

Cosine and resample requests name their run (``run_id``, the ring id) and
``step``; a request of another run is refused, and replies are cached per
step, so a repeated request is answered with the same message and never
resamples twice (an older step is refused as stale). Every message is
validated; anything malformed, late, misaddressed or from the wrong sender is
logged (and kept in `rejections`), never raised.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import CkksPublicContext, require_tenseal
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker.context import (
    DEFAULT_MAX_CONTEXT_BYTES,
    ContextDownload,
    ContextError,
)
from ursa.edge_sdk.methods.flicker.redundancy import (
    GlobalTestPending,
    RedundancyExchange,
    WireGlobalTest,
)
from ursa.edge_sdk.methods.flicker.resampling import (
    DEFAULT_CHI,
    DEFAULT_ETA,
    DataResampler,
)
from ursa.edge_sdk.methods.flicker.wire import DeviceWire
from ursa.edge_sdk.methods.flicker.wire import RejectedError as _RejectedError
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    Chunk,
    CkksContextAnnounce,
    CosineReply,
    CosineRequest,
    CountUpdate,
    ErrorReply,
    RedundancyAsk,
    RedundancyResult,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
    TransferManifest,
)
from ursa.protocol.outbox import Outbox, Outgoing
from ursa.protocol.transport import Transport

__all__ = [
    "DEFAULT_MAX_CONTEXT_BYTES",
    "MIN_RING_DEVICES",
    "WORK_KINDS",
    "FlickerParticipant",
    "ring_seal_context",
]

logger = logging.getLogger("ursa.edge_sdk.methods.flicker.algorithm")

MIN_RING_DEVICES = 3
"""A device never sends a ring result with fewer contributors: the key owner
would learn a sum of one or two devices' counts."""
MAX_WAITING = 64
"""Requests kept while the context downloads."""
RING_SEAL_LABEL = "ursa-flicker-ring-v1"
CACHED_REPLIES = 16

_M = TypeVar("_M", bound=BaseMessage)
_Step = CosineRequest | ResampleRequest
WORK_KINDS: tuple[type[BaseMessage], ...] = (
    RingStart,
    RingHop,
    CosineRequest,
    ResampleRequest,
    RedundancyAsk,
    RedundancyResult,
)
_RELAYED = (RingHop, RedundancyAsk, RedundancyResult)


def ring_seal_context(
    federation: str, ring_id: str, hop_index: int, contributors: Sequence[str]
) -> bytes:
    """The sealing context of one ring hop (ids hold no ``|`` or ``,``)."""
    parts = (federation, ring_id, str(hop_index), ",".join(contributors))
    return "|".join((RING_SEAL_LABEL, *parts)).encode("ascii")


@dataclass
class _Sent:
    ciphertext: bytes
    contributors: tuple[str, ...]
    recipient: str | None


@dataclass
class _Ring:
    ring_id: str
    round: int
    order: tuple[str, ...]
    live: tuple[str, ...]
    received: bool = False
    sent: _Sent | None = None
    replies: OrderedDict[int, Outgoing] = field(
        default_factory=OrderedDict
    )


class FlickerParticipant(DeviceWire):
    """One device's side of FLICKER.

    Args:
        identity: This device's identity (opens and seals ring hops).
        federation: The federation id.
        peers: The other devices' public identities (ring predecessors and
            successors); the coordinator's enrolment list.
        counts: This device's class counts (for `DataResampler`, its view's).
        transport: Where messages go; `attach` makes it deliver to `handle`
            (None inside an `EdgeClient`, which routes messages itself to
            `on_message` and flushes ``outbox``).
        outbox: The queue replies go to (default: its own).
        verify: Checks the coordinator's signature on a `RingStart` that
            carries the members' keys (an `EdgeClient` run); None: ``peers``
            are known beforehand (a stand-alone run).
        resampler: The data work of a resampling step (count level by default).
        rng: Masks, scales and orders of the replies (unseeded by default:
            never fix it in production).
        max_steps: Safety cap on resampling steps.
        max_context_bytes: Largest CKKS public context accepted.
        global_test: Run the global redundancy test on the wire when the
            resampler is a `DataResampler` without a ``global_test`` (False:
            the local test only, the local under-sampling baseline).
    """

    def __init__(
        self,
        *,
        identity: DeviceIdentity,
        federation: str,
        peers: Mapping[str, DevicePublicIdentity],
        counts: npt.ArrayLike,
        transport: Transport | None,
        outbox: Outbox | None = None,
        verify: Callable[[BaseMessage], None] | None = None,
        resampler: dev.Resampler | None = None,
        rng: np.random.Generator | None = None,
        max_steps: int = dev.DEFAULT_MAX_STEPS,
        max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
        global_test: bool = True,
    ) -> None:
        require_tenseal()  # at configuration time, not when a ciphertext arrives
        super().__init__(identity, federation, transport, outbox=outbox)
        self._verify = verify
        self.peers = dict(peers)
        self.state = dev.init_device(counts)
        self.resampler: dev.Resampler = resampler or dev.CountResampler()
        self.steps: list[dev.StepReport] = []
        self._rng = rng if rng is not None else np.random.default_rng()
        self._max_steps = max_steps
        self._download = ContextDownload(max_context_bytes)
        self._waiting: list[BaseMessage] = []
        self._ring: _Ring | None = None
        data = self.resampler if isinstance(self.resampler, DataResampler) else None
        test = None
        if data is not None and global_test and data.global_test is None:
            test = data.global_test = WireGlobalTest(DEFAULT_ETA, DEFAULT_CHI)
        self.redundancy = RedundancyExchange(
            identity=identity,
            federation=federation,
            peers=self.peers,
            send=self._send,
            make=self._message,
            rng=self._rng,
            test=test,
            features=data.class_features if data is not None else None,
        )

    def on_message(self, message: BaseMessage, *, relayed: bool) -> None:
        """Act on one decoded message.

        ``relayed`` says it came on this device's own down topic (ring hops
        must; answers to chunk requests do), not on the global one.
        """
        kind = message_kind(message)
        try:
            with self._lock:
                self._admit(message, relayed)
                self._dispatch(message, relayed)
        except _RejectedError as exc:
            self._note(kind, str(exc))
        except Exception as exc:  # nothing received may crash the device
            logger.exception("FLICKER: %s failed on %s", kind, self.device_id)
            self._note(kind, f"internal error: {exc!r}")
        self._flush()

    # --- admission ----------------------------------------------------------

    def _admit(self, message: BaseMessage, relayed: bool) -> None:
        if message.federation != self.federation:
            raise _RejectedError("another federation")
        if isinstance(message, _RELAYED) and not relayed:
            kind = message_kind(message).replace("_", " ")
            raise _RejectedError(f"{kind} not on this device's down topic")
        if isinstance(message, RingHop):
            if message.sender not in self.peers:
                raise _RejectedError(f"ring hop from unknown {message.sender}")
        elif message.sender != COORDINATOR:
            raise _RejectedError(f"{message_kind(message)} not from the coordinator")

    def _dispatch(self, message: BaseMessage, relayed: bool) -> None:
        if not self._first_time(message.message_id):
            return  # a QoS 1 redelivery
        if isinstance(message, CkksContextAnnounce):
            if self._download.on_announce(message):
                self._ring = None  # a new key: a new run follows
        elif isinstance(message, TransferManifest | Chunk):
            self._on_transfer(message, relayed)
        elif isinstance(message, WORK_KINDS):
            if self.context is None:
                if len(self._waiting) >= MAX_WAITING:
                    raise _RejectedError("too much work waiting for the context")
                self._waiting.append(message)
                self._request_context()
            else:
                self._work(message)
        elif isinstance(message, ErrorReply):
            logger.warning("FLICKER: coordinator refused: %s", message.reason)

    def _work(self, message: BaseMessage) -> None:
        if isinstance(message, RingStart):
            self._on_ring_start(message)
        elif isinstance(message, RingHop):
            self._on_ring_hop(message)
        elif isinstance(message, CosineRequest):
            self._on_cosine_request(message)
        elif isinstance(message, ResampleRequest):
            self._on_resample_request(message)
        elif isinstance(message, RedundancyAsk):
            self._on_redundancy_ask(message)
        elif isinstance(message, RedundancyResult):
            self._on_redundancy_result(message)

    # --- the CKKS public context --------------------------------------------

    def _on_transfer(self, message: TransferManifest | Chunk, relayed: bool) -> None:
        try:
            completed = self._download.on_transfer(message)
        except ContextError as exc:
            raise _RejectedError(str(exc)) from None
        if not completed:
            if relayed and self._waiting:  # an answer to a request: ask the rest
                self._request_context()
            return
        waiting, self._waiting = self._waiting, []
        for work in waiting:
            try:
                self._work(work)
            except _RejectedError as exc:
                self._note(message_kind(work), str(exc))

    def _request_context(self) -> None:
        request = self._download.chunk_request(
            federation=self.federation, sender=self.device_id
        )
        if request is not None:
            self._send(request)

    # --- the ring -------------------------------------------------------------

    def claims_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Whether a transfer message carries the CKKS context (else a model)."""
        return self._download.claims(message)

    def _adopt_members(self, message: RingStart) -> None:
        """Learn the ring's keys from a signed `RingStart` (a service run)."""
        if self._verify is None:
            raise _RejectedError("ring members, but no coordinator key to check them")
        try:
            self._verify(message)
            members = {
                k.device_id: DevicePublicIdentity(
                    k.device_id, k.x25519_public, k.ed25519_public
                )
                for k in message.members
            }
        except (CryptoError, ValueError) as exc:
            raise _RejectedError(f"ring start: {exc}") from None
        if set(members) != set(message.order):
            raise _RejectedError("ring members are not the ring order")
        members.pop(self.device_id, None)
        self.peers.update(members)

    def _on_ring_start(self, message: RingStart) -> None:
        if message.members or self._verify is not None:
            self._adopt_members(message)
        me = self.device_id
        if me not in message.order:
            raise _RejectedError("ring order without this device")
        ring = self._ring
        if ring is None or ring.ring_id != message.ring_id:
            self._ring = _Ring(
                message.ring_id, message.round, message.order, message.order
            )
            if message.order[0] == me:
                self._start_ring(self._ring)
            return
        if not _is_subsequence(message.order, ring.live):
            raise _RejectedError("new ring order is not the old one minus devices")
        ring.live = message.order
        sent = ring.sent
        if sent is not None:
            if _successor(ring.live, me) != sent.recipient:
                self._forward(ring, sent.ciphertext, sent.contributors[:-1])
        elif not ring.received and ring.live[0] == me:
            self._start_ring(ring)

    def _start_ring(self, ring: _Ring) -> None:
        self._forward(ring, dev.encrypt_counts(self._ctx(), self.counts), ())

    def _on_ring_hop(self, message: RingHop) -> None:
        ring, me = self._ring, self.device_id
        if ring is None or ring.ring_id != message.ring_id:
            raise _RejectedError(f"hop of unknown ring {message.ring_id}")
        if message.recipient != me or ring.received or ring.sent is not None:
            raise _RejectedError("hop not addressed to this device now")
        expected = ring.live[: ring.live.index(me)]
        if not expected or message.contributors != expected:
            raise _RejectedError(f"contributors {message.contributors} != {expected}")
        if message.hop_index != len(expected) - 1:
            raise _RejectedError("hop_index does not match the contributors")
        context = ring_seal_context(
            self.federation, ring.ring_id, message.hop_index, message.contributors
        )
        try:
            running = open_sealed(
                self.identity, self.peers[message.sender], context, message.box
            )
            total = dev.add_counts(self._ctx(), running, self.counts)
        except CryptoError as exc:
            raise _RejectedError(f"ring hop: {exc}") from None
        ring.received = True
        self._forward(ring, total, message.contributors)

    def _forward(self, ring: _Ring, total: bytes, before: tuple[str, ...]) -> None:
        """Send the running sum (``before`` + this device) on to the successor."""
        contributors = (*before, self.device_id)
        successor = _successor(ring.live, self.device_id)
        ring.sent = _Sent(total, contributors, successor)
        if successor is None:
            if len(contributors) < MIN_RING_DEVICES:
                raise _RejectedError(f"refusing a ring result of {len(contributors)}")
            result = self._message(
                RingResult,
                ring.round,
                ring_id=ring.ring_id,
                contributors=contributors,
                total=total,
            )
            self._send(result)
            return
        hop_index = len(contributors) - 1
        context = ring_seal_context(
            self.federation, ring.ring_id, hop_index, contributors
        )
        box = seal(self.identity, self.peers[successor], context, total)
        hop = self._message(
            RingHop,
            ring.round,
            ring_id=ring.ring_id,
            hop_index=hop_index,
            recipient=successor,
            contributors=contributors,
            box=box,
        )
        self._send(hop)

    # --- localisation and resampling -------------------------------------------

    def _run_ring(self, run_id: str) -> _Ring:
        """The completed ring of run ``run_id``."""
        ring = self._ring
        if ring is None or ring.sent is None:
            raise _RejectedError("not part of a completed ring")
        if run_id != ring.ring_id:
            raise _RejectedError(f"request of run {run_id}, not of this ring")
        return ring

    def _step_ring(self, message: _Step) -> _Ring | None:
        """The ring a request belongs to, or None when a cached reply was re-sent."""
        ring = self._run_ring(message.run_id)
        cached = ring.replies.get(message.step)
        if cached is not None:
            self._outbox.put_item(cached)
            return None
        if ring.replies and message.step < max(ring.replies):
            raise _RejectedError(f"stale step {message.step}")
        return ring

    def _on_cosine_request(self, message: CosineRequest) -> None:
        ring = self._step_ring(message)
        if ring is None:
            return
        try:
            product = dev.similarity_reply(
                self._ctx(), message.ciphertext, self.counts, self._rng
            )
        except (CryptoError, dev.ResamplingError, ValueError) as exc:
            raise _RejectedError(f"cosine request: {exc}") from None
        self._answer(ring, message, CosineReply, masked_product=product)

    def _on_resample_request(self, message: ResampleRequest) -> None:
        ring = self._step_ring(message)
        if ring is None:
            return
        old = self.state
        try:
            self.state, report = dev.resample_step(
                old,
                self.resampler,
                nabla_client=message.nabla_client,
                max_steps=self._max_steps,
            )
        except GlobalTestPending as pending:  # nothing changed yet: ask the peers
            if not self.redundancy.start(message, pending, ring.live, self._ctx()):
                self._on_resample_request(message)  # no peer: answered at once
            return
        except dev.ResamplingError as exc:  # say "saturated" so the run moves on
            logger.error("FLICKER: resampling failed: %s", exc)
            self.state = old
            report = dev.StepReport(None, None, (0,) * len(old.counts), 0.0, 0.0, True)
        self.steps.append(report)
        delta = np.asarray(self.state.counts) - np.asarray(old.counts)
        encrypted = self._ctx().encrypt(delta.astype(np.float64))
        saturated = report.saturated
        self._answer(ring, message, CountUpdate, delta=encrypted, saturated=saturated)

    def _on_redundancy_ask(self, message: RedundancyAsk) -> None:
        ring = self._run_ring(message.run_id)
        if message.origin not in ring.live or message.origin == self.device_id:
            raise _RejectedError(f"ask of {message.origin}, not a peer of this run")
        self.redundancy.on_ask(message, self._ctx())

    def _on_redundancy_result(self, message: RedundancyResult) -> None:
        self._run_ring(message.run_id)
        request, problem = self.redundancy.on_result(message)
        if problem is not None:
            self._note(message_kind(message), problem)
        if request is not None:  # every result is in: the step runs again
            self._on_resample_request(request)

    def _answer(self, ring: _Ring, asked: _Step, cls: type[_M], **fields: Any) -> None:
        """Send (and cache) the reply to a request: same round, run and step."""
        fields.update(run_id=asked.run_id, step=asked.step)
        reply = self._message(cls, asked.round, **fields)
        ring.replies[asked.step] = self._send(reply)
        while len(ring.replies) > CACHED_REPLIES:
            ring.replies.popitem(last=False)

    # --- plumbing -------------------------------------------------------------

    @property
    def counts(self) -> tuple[int, ...]:
        """The current class counts (after any resampling)."""
        return self.state.counts

    @property
    def context(self) -> CkksPublicContext | None:
        """The coordinator's CKKS public context, once downloaded."""
        return self._download.context

    @property
    def context_bytes(self) -> int:
        """Size of the downloaded public context (0 before)."""
        return self._download.size

    def _ctx(self) -> CkksPublicContext:
        context = self._download.context
        if context is None:  # callers wait for it; unreachable
            raise _RejectedError("no CKKS context yet")
        return context


def _successor(live: Sequence[str], device_id: str) -> str | None:
    """The next device after ``device_id`` in the live order; None: the coordinator."""
    index = list(live).index(device_id)
    return live[index + 1] if index + 1 < len(live) else None


def _is_subsequence(short: Sequence[str], long: Sequence[str]) -> bool:
    remaining = iter(long)
    return all(item in remaining for item in short)
