"""FLICKER's protocol for one device: context download, ring hops, cosine, resampling.

A `FlickerParticipant` answers the coordinator's FLICKER messages (see
`ursa.coordinator.methods.flicker` for the whole protocol) for one device. It
has no connection of its own: its host admits messages (topic, federation,
sender) and calls its typed handlers through a `Router` (`register`), and it
reaches the device through a `PeerChannel` (the outbox, sealing and opening
boxes device to device, the coordinator's signature). In an `EdgeClient` the
host is the `Flicker` method and the channel its `DeviceContext`.

* **context**: the announced CKKS public context arrives as a chunked
  transfer (capped at ``max_context_bytes``; missing chunks are re-requested
  when work needs the context); work that arrives first raises
  `NotReadyError`, so the host parks it until the context is complete;
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
resamples twice (an older step is refused as stale). Anything malformed,
late or misaddressed raises `RefusedError` (the host logs it).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import CkksPublicContext, require_tenseal
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.edge_sdk.method import PeerChannel
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker.context import (
    DEFAULT_MAX_CONTEXT_BYTES,
    ContextDownload,
    ContextError,
)
from ursa.edge_sdk.methods.flicker.errors import RefusedError
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
from ursa.protocol.messages import (
    BaseMessage,
    Chunk,
    CkksContextAnnounce,
    CosineReply,
    CosineRequest,
    CountUpdate,
    RedundancyAsk,
    RedundancyResult,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
    TransferManifest,
)
from ursa.protocol.router import NotReadyError, Router

__all__ = [
    "DEFAULT_MAX_CONTEXT_BYTES",
    "MIN_RING_DEVICES",
    "FlickerParticipant",
    "ring_seal_context",
]

logger = logging.getLogger("ursa.edge_sdk.methods.flicker")

MIN_RING_DEVICES = 3
"""A device never sends a ring result with fewer contributors: the key owner
would learn a sum of one or two devices' counts."""
MAX_WAITING = 64
"""Messages that may wait for the context at once."""
RING_SEAL_LABEL = "ursa-flicker-ring-v1"
CACHED_REPLIES = 16

_M = TypeVar("_M", bound=BaseMessage)
_Step = CosineRequest | ResampleRequest


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
    replies: OrderedDict[int, BaseMessage] = field(default_factory=OrderedDict)


class FlickerParticipant:
    """One device's side of FLICKER, driven by its host's router.

    Args:
        channel: The device: its id, outbox, sealing and the coordinator's key.
        peers: The other devices' public identities when known beforehand
            (an in-process simulation); empty when each `RingStart` brings
            the members' keys, signed by the coordinator.
        counts: This device's class counts (for `DataResampler`, its view's).
        signed_members: Require a signed member list on every `RingStart`
            (an `EdgeClient` run); False: ``peers`` are known beforehand.
        resampler: The data work of a resampling step (count level by default).
        rng: Masks, scales and orders of the replies (unseeded by default:
            never fix it in production).
        max_steps: Safety cap on resampling steps.
        max_context_bytes: Largest CKKS public context accepted.
        global_test: Run the global redundancy test on the wire when the
            resampler is a `DataResampler` without a ``global_test`` (False:
            the local test only, the local under-sampling baseline).

    Raises:
        BackendUnavailableError: TenSEAL is not installed (the ``ckks`` extra).
    """

    def __init__(
        self,
        channel: PeerChannel,
        *,
        peers: Mapping[str, DevicePublicIdentity],
        counts: npt.ArrayLike,
        signed_members: bool = False,
        resampler: dev.Resampler | None = None,
        rng: np.random.Generator | None = None,
        max_steps: int = dev.DEFAULT_MAX_STEPS,
        max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
        global_test: bool = True,
    ) -> None:
        require_tenseal()  # at configuration time, not when a ciphertext arrives
        self._channel = channel
        self._signed_members = signed_members
        self.peers = dict(peers)
        self.state = dev.init_device(counts)
        self.resampler: dev.Resampler = resampler or dev.CountResampler()
        self.steps: list[dev.StepReport] = []
        self._rng = rng if rng is not None else np.random.default_rng()
        self._max_steps = max_steps
        self._download = ContextDownload(max_context_bytes)
        self._fetching = False
        self._waiting: set[str] = set()
        """Ids of work that waits for the context (asked for it already)."""
        self._ring: _Ring | None = None
        data = self.resampler if isinstance(self.resampler, DataResampler) else None
        test = None
        if data is not None and global_test and data.global_test is None:
            test = data.global_test = WireGlobalTest(DEFAULT_ETA, DEFAULT_CHI)
        self.redundancy = RedundancyExchange(
            channel=channel,
            peers=self.peers,
            make=self._message,
            rng=self._rng,
            test=test,
            features=data.class_features if data is not None else None,
        )

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._channel.device_id

    def register(self, router: Router, owner: str) -> None:
        """Route FLICKER's kinds to this device's handlers (the CKKS transfer aside)."""
        router.register(CkksContextAnnounce, self.on_announce, owner=owner)
        router.register(RingStart, self.on_ring_start, owner=owner)
        router.register(RingHop, self.on_ring_hop, owner=owner)
        router.register(CosineRequest, self.on_cosine_request, owner=owner)
        router.register(ResampleRequest, self.on_resample_request, owner=owner)
        router.register(RedundancyAsk, self.on_redundancy_ask, owner=owner)
        router.register(RedundancyResult, self.on_redundancy_result, owner=owner)

    # --- the CKKS public context --------------------------------------------

    def on_announce(self, message: CkksContextAnnounce) -> None:
        """Expect the announced context transfer (a new key: a new run follows)."""
        if self._download.on_announce(message):
            self._ring = None

    def claims(self, message: TransferManifest | Chunk) -> bool:
        """Whether a transfer message carries the CKKS context (else a model)."""
        return self._download.claims(message)

    def on_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Take a manifest or chunk of the context; True when it has just completed.

        Raises:
            RefusedError: oversize, inconsistent or corrupt transfer.
        """
        try:
            completed = self._download.on_transfer(message)
        except ContextError as exc:
            raise RefusedError(str(exc)) from None
        if completed:
            self._fetching = False
        elif self._fetching:  # this device asked: ask for the rest once answered
            self._request_context()
        return completed

    def _request_context(self) -> None:
        request = self._download.chunk_request(
            federation=self._channel.federation, sender=self.device_id
        )
        if request is not None:
            self._fetching = True
            self._channel.send(request)

    def _wait_for_context(self, work: BaseMessage) -> CkksPublicContext:
        """The context; `NotReadyError` until it is here (asked once per message)."""
        ckks = self._download.context
        if ckks is not None:
            self._waiting.clear()
            return ckks
        if work.message_id not in self._waiting:  # not a retry by the host
            if len(self._waiting) >= MAX_WAITING:
                raise RefusedError("too much work waiting for the context")
            self._waiting.add(work.message_id)
            self._request_context()
        raise NotReadyError

    # --- the ring -------------------------------------------------------------

    def _adopt_members(self, message: RingStart) -> None:
        """Learn the ring's keys from a signed `RingStart` (a service run)."""
        try:
            self._channel.verify_coordinator(message)
        except (CryptoError, ValueError) as exc:
            raise RefusedError(f"ring start: {exc}") from None
        try:  # operator-certified (`peer_identity`): an untrusted one is refused
            members = {
                k.device_id: self._channel.peer_identity(k) for k in message.members
            }
        except UntrustedIdentityError:
            raise
        except (CryptoError, ValueError) as exc:
            raise RefusedError(f"ring start: {exc}") from None
        if set(members) != set(message.order):
            raise RefusedError("ring members are not the ring order")
        members.pop(self.device_id, None)
        self.peers.update(members)

    def on_ring_start(self, message: RingStart) -> None:
        """Join the ring (or its shorter order, a silent device skipped)."""
        ckks = self._wait_for_context(message)
        if message.members or self._signed_members:
            self._adopt_members(message)
        me = self.device_id
        if me not in message.order:
            raise RefusedError("ring order without this device")
        ring = self._ring
        if ring is None or ring.ring_id != message.ring_id:
            self._ring = _Ring(
                message.ring_id, message.round, message.order, message.order
            )
            if message.order[0] == me:
                self._start_ring(self._ring, ckks)
            return
        if not _is_subsequence(message.order, ring.live):
            raise RefusedError("new ring order is not the old one minus devices")
        ring.live = message.order
        sent = ring.sent
        if sent is not None:
            if _successor(ring.live, me) != sent.recipient:
                self._forward(ring, sent.ciphertext, sent.contributors[:-1])
        elif not ring.received and ring.live[0] == me:
            self._start_ring(ring, ckks)

    def _start_ring(self, ring: _Ring, ckks: CkksPublicContext) -> None:
        self._forward(ring, dev.encrypt_counts(ckks, self.counts), ())

    def on_ring_hop(self, message: RingHop) -> None:
        """Add this device's counts to its predecessor's sum and pass it on."""
        if message.sender not in self.peers:
            raise RefusedError(f"ring hop from unknown {message.sender}")
        ckks = self._wait_for_context(message)
        ring, me = self._ring, self.device_id
        if ring is None or ring.ring_id != message.ring_id:
            raise RefusedError(f"hop of unknown ring {message.ring_id}")
        if message.recipient != me or ring.received or ring.sent is not None:
            raise RefusedError("hop not addressed to this device now")
        expected = ring.live[: ring.live.index(me)]
        if not expected or message.contributors != expected:
            raise RefusedError(f"contributors {message.contributors} != {expected}")
        if message.hop_index != len(expected) - 1:
            raise RefusedError("hop_index does not match the contributors")
        context = ring_seal_context(
            self._channel.federation,
            ring.ring_id,
            message.hop_index,
            message.contributors,
        )
        try:
            running = self._channel.open_from(
                self.peers[message.sender], context, message.box
            )
            total = dev.add_counts(ckks, running, self.counts)
        except CryptoError as exc:
            raise RefusedError(f"ring hop: {exc}") from None
        ring.received = True
        self._forward(ring, total, message.contributors)

    def _forward(self, ring: _Ring, total: bytes, before: tuple[str, ...]) -> None:
        """Send the running sum (``before`` + this device) on to the successor."""
        contributors = (*before, self.device_id)
        successor = _successor(ring.live, self.device_id)
        ring.sent = _Sent(total, contributors, successor)
        if successor is None:
            if len(contributors) < MIN_RING_DEVICES:
                raise RefusedError(f"refusing a ring result of {len(contributors)}")
            result = self._message(
                RingResult,
                ring.round,
                ring_id=ring.ring_id,
                contributors=contributors,
                total=total,
            )
            self._channel.send(result)
            return
        hop_index = len(contributors) - 1
        context = ring_seal_context(
            self._channel.federation, ring.ring_id, hop_index, contributors
        )
        box = self._channel.seal_for(self.peers[successor], context, total)
        hop = self._message(
            RingHop,
            ring.round,
            ring_id=ring.ring_id,
            hop_index=hop_index,
            recipient=successor,
            contributors=contributors,
            box=box,
        )
        self._channel.send(hop)

    # --- localisation and resampling -------------------------------------------

    def _run_ring(self, run_id: str) -> _Ring:
        """The completed ring of run ``run_id``."""
        ring = self._ring
        if ring is None or ring.sent is None:
            raise RefusedError("not part of a completed ring")
        if run_id != ring.ring_id:
            raise RefusedError(f"request of run {run_id}, not of this ring")
        return ring

    def _step_ring(self, message: _Step) -> _Ring | None:
        """The ring a request belongs to, or None when a cached reply was re-sent."""
        ring = self._run_ring(message.run_id)
        cached = ring.replies.get(message.step)
        if cached is not None:
            self._channel.send(cached)
            return None
        if ring.replies and message.step < max(ring.replies):
            raise RefusedError(f"stale step {message.step}")
        return ring

    def on_cosine_request(self, message: CosineRequest) -> None:
        """Answer the masked product of ``Enc(GD/||GD||)`` with this device's counts."""
        ckks = self._wait_for_context(message)
        ring = self._step_ring(message)
        if ring is None:
            return
        try:
            product = dev.similarity_reply(
                ckks, message.ciphertext, self.counts, self._rng
            )
        except (CryptoError, dev.ResamplingError, ValueError) as exc:
            raise RefusedError(f"cosine request: {exc}") from None
        self._answer(ring, message, CosineReply, masked_product=product)

    def on_resample_request(self, message: ResampleRequest) -> None:
        """Make one resampling step and send the encrypted change of counts."""
        ckks = self._wait_for_context(message)
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
            if not self.redundancy.start(message, pending, ring.live, ckks):
                self.on_resample_request(message)  # no peer: answered at once
            return
        except dev.ResamplingError as exc:  # say "saturated" so the run moves on
            logger.error("FLICKER: resampling failed: %s", exc)
            self.state = old
            report = dev.StepReport(None, None, (0,) * len(old.counts), 0.0, 0.0, True)
        self.steps.append(report)
        delta = np.asarray(self.state.counts) - np.asarray(old.counts)
        encrypted = ckks.encrypt(delta.astype(np.float64))
        saturated = report.saturated
        self._answer(ring, message, CountUpdate, delta=encrypted, saturated=saturated)

    def on_redundancy_ask(self, message: RedundancyAsk) -> None:
        """Answer another device's global redundancy test."""
        ckks = self._wait_for_context(message)
        ring = self._run_ring(message.run_id)
        if message.origin not in ring.live or message.origin == self.device_id:
            raise RefusedError(f"ask of {message.origin}, not a peer of this run")
        self.redundancy.on_ask(message, ckks)

    def on_redundancy_result(self, message: RedundancyResult) -> None:
        """Take a peer's result; when all are in, the waiting step runs again."""
        self._run_ring(message.run_id)
        request, problem = self.redundancy.on_result(message)
        if problem is not None:
            logger.warning("FLICKER %s: %s", self.device_id, problem)
        if request is not None:  # every result is in: the step runs again
            self.on_resample_request(request)

    def _answer(self, ring: _Ring, asked: _Step, cls: type[_M], **fields: Any) -> None:
        """Send (and cache) the reply to a request: same round, run and step."""
        fields.update(run_id=asked.run_id, step=asked.step)
        reply = self._message(cls, asked.round, **fields)
        self._channel.send(reply)
        ring.replies[asked.step] = reply
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

    def _message(self, cls: type[_M], round_index: int, **fields: Any) -> _M:
        """A message from this device."""
        fields.update(federation=self._channel.federation, sender=self.device_id)
        return cls(round=round_index, **fields)


def _successor(live: Sequence[str], device_id: str) -> str | None:
    """The next device after ``device_id`` in the live order; None: the coordinator."""
    index = list(live).index(device_id)
    return live[index + 1] if index + 1 < len(live) else None


def _is_subsequence(short: Sequence[str], long: Sequence[str]) -> bool:
    remaining = iter(long)
    return all(item in remaining for item in short)
