"""FLICKER's global redundancy test between devices, relayed by the coordinator.

The design and what each party learns:
`ursa.edge_sdk.methods.flicker.global_redundancy`.
On the wire (the coordinator's side: `ursa.coordinator.methods.flicker.redundancy`)::

    dominant: RedundancyOffer(recipient, box = seal(label, eta, Enc(candidates)))
    peer:     RedundancyAsk -> RedundancyReply parts (products; part 0 also
              box = seal(count, seed) to the dominant device)
    dominant: RedundancyResult per answering peer -> flags -> the step resumes

`WireGlobalTest` is the ``global_test`` of a device's
`ursa.edge_sdk.methods.flicker.resampling.DataResampler`. A resampling step runs twice:
the
first pass stops at the global test (`GlobalTestPending`, before anything
changes) and the offers go out; when the results are in, the step runs again
from the same state, the local test picks the same candidates, and the test
answers with the flags. `RedundancyExchange` holds both roles for a
`ursa.edge_sdk.methods.flicker.participant.FlickerParticipant`, sealing and
opening through its `PeerChannel`. Anything malformed, misaddressed or of
another step raises `RefusedError` (logged by the host); a peer whose result
does not open is left out of the decision.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import CkksPublicContext
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.edge_sdk.method import PeerChannel
from ursa.edge_sdk.methods.flicker import global_redundancy as gr
from ursa.edge_sdk.methods.flicker.algorithm import ResamplingError
from ursa.edge_sdk.methods.flicker.errors import RefusedError
from ursa.protocol.messages import (
    RedundancyAsk,
    RedundancyOffer,
    RedundancyReply,
    RedundancyResult,
    ResampleRequest,
)

__all__ = ["GlobalTestPending", "RedundancyExchange", "WireGlobalTest"]

OFFER_LABEL = "ursa-flicker-redundancy-offer-v1"
BACK_LABEL = "ursa-flicker-redundancy-back-v1"
MAX_LABEL = 4096

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Features = Callable[[int], FloatArray]


def seal_context(label: str, federation: str, run_id: str, step: int) -> bytes:
    """The sealing context of a redundancy box (sender and receiver are bound too)."""
    return "|".join((label, federation, run_id, str(step))).encode("ascii")


class GlobalTestPending(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside a resampling step: the global test must run on the wire first."""

    def __init__(self, label: int, candidates: FloatArray) -> None:
        super().__init__(f"global test of {len(candidates)} candidates of {label}")
        self.label = label
        self.candidates = candidates


class WireGlobalTest:
    """A `DataResampler` ``global_test`` answered by the wire exchange.

    Args:
        eta: Cosine threshold.
        chi: Share of the other devices' vectors that must exceed ``eta``.
    """

    def __init__(self, eta: float, chi: float) -> None:
        self.eta = eta
        self.chi = chi
        self._ready: tuple[int, FloatArray, BoolArray] | None = None

    def __call__(self, label: int, candidates: FloatArray) -> BoolArray:
        """The flags once `answer` gave them; otherwise raise `GlobalTestPending`."""
        if not len(candidates):
            return np.zeros(0, dtype=bool)
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == label and _same(ready[1], candidates):
            return ready[2]
        raise GlobalTestPending(label, candidates)

    def answer(self, label: int, candidates: FloatArray, flags: BoolArray) -> None:
        """Arm the next call with the same ``label`` and ``candidates``."""
        self._ready = (label, candidates, flags)


@dataclass
class _Pending:
    """The dominant device's open test."""

    request: ResampleRequest
    test: WireGlobalTest
    label: int
    candidates: FloatArray
    layout: gr.Layout
    asked: tuple[str, ...]
    peers: tuple[str, ...] | None = None
    vector_slots: int = 0
    counts: dict[str, tuple[int, npt.NDArray[np.int64]]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)


class RedundancyExchange:
    """Both roles of the global redundancy test for one device.

    Args:
        channel: The device (its id, outbox, sealing and opening of boxes).
        peers: The other devices' public identities.
        make: Builds a message of this device (``cls, round, **fields``).
        rng: Vector order, scales and masks (unseeded in production).
        test: The installed global test (None: this device never asks).
        features: This device's unit class vectors (None: it has none).
    """

    def __init__(
        self,
        *,
        channel: PeerChannel,
        peers: dict[str, DevicePublicIdentity],
        make: Callable[..., Any],
        rng: np.random.Generator,
        test: WireGlobalTest | None,
        features: Features | None,
    ) -> None:
        self.test = test
        self._channel = channel
        self._peers = peers
        self._make = make
        self._rng = rng
        self._features = features
        self._pending: _Pending | None = None

    # --- the dominant device ------------------------------------------------

    def start(
        self,
        request: ResampleRequest,
        pending: GlobalTestPending,
        live: Sequence[str],
        context: CkksPublicContext,
    ) -> bool:
        """Seal the encrypted candidates to every other live device of the run.

        Returns False, with the test answered (nothing is globally redundant),
        when there is no peer to ask: the step can run again at once.
        """
        me = self._channel.device_id
        test = self.test
        if test is None:  # unreachable: only the installed test raises pending
            raise RefusedError("no global test installed")
        asked = tuple(d for d in live if d != me and d in self._peers)
        candidates = pending.candidates
        if not asked:
            test.answer(pending.label, candidates, np.zeros(len(candidates), bool))
            return False
        layout = gr.plan_layout(
            len(candidates), candidates.shape[1], context.slot_count
        )
        ciphertexts = gr.encrypt_candidates(context, candidates, layout)
        payload = msgpack.packb(
            {"label": pending.label, "eta": test.eta, "ciphertexts": ciphertexts}
        )
        where = seal_context(
            OFFER_LABEL, self._channel.federation, request.run_id, request.step
        )
        for peer in asked:
            box = self._channel.seal_for(self._peers[peer], where, payload)
            offer = self._make(
                RedundancyOffer,
                request.round,
                run_id=request.run_id,
                step=request.step,
                block_slots=layout.block,
                per_ciphertext=layout.per_ciphertext,
                ciphertexts=layout.ciphertexts,
                recipient=peer,
                recipients=asked,
                box=box,
            )
            self._channel.send(offer)
        self._pending = _Pending(
            request, test, pending.label, candidates, layout, asked
        )
        return True

    def on_result(
        self, result: RedundancyResult
    ) -> tuple[ResampleRequest | None, str | None]:
        """Take one peer's result.

        Returns the request to run again once every peer's result is in (or
        None), and why a peer's result was left out (or None).

        Raises:
            RefusedError: a result of no open test, or unlike the test's first.
        """
        pending = self._pending
        if pending is None or (result.run_id, result.step) != (
            pending.request.run_id,
            pending.request.step,
        ):
            raise RefusedError(f"result of step {result.step}: no test open")
        if pending.peers is None:
            if not set(result.peers) <= set(pending.asked):
                raise RefusedError(f"result names peers not asked: {result.peers}")
            pending.peers, pending.vector_slots = result.peers, result.vector_slots
        elif (result.peers, result.vector_slots) != (
            pending.peers,
            pending.vector_slots,
        ):
            raise RefusedError("result unlike the first of this test")
        problem = self._take(pending, result)
        done = pending.dropped | set(pending.counts)
        if not set(pending.peers) <= done:
            return None, problem
        return self._finish(pending), problem

    def _take(self, pending: _Pending, result: RedundancyResult) -> str | None:
        peer = result.peer
        if peer is None or result.box is None or result.signs is None:
            return None  # no peer answered (the message validates them together)
        if peer in pending.counts or peer in pending.dropped:
            raise RefusedError(f"a second result of {peer}")
        req = pending.request
        where = seal_context(BACK_LABEL, self._channel.federation, req.run_id, req.step)
        try:
            opened = self._channel.open_from(self._peers[peer], where, result.box)
            count, seed = _back_payload(opened)
            above = gr.count_above(
                result.signs, seed, pending.layout, pending.vector_slots, count
            )
        except (CryptoError, ResamplingError, ValueError, KeyError) as exc:
            pending.dropped.add(peer)
            return f"result of {peer} left out: {exc}"
        pending.counts[peer] = (count, above)
        return None

    def _finish(self, pending: _Pending) -> ResampleRequest:
        self._pending = None
        counts = list(pending.counts.values())
        vectors = sum(c for c, _ in counts)
        above = np.sum([a for _, a in counts], axis=0) if counts else np.zeros(0)
        test = pending.test
        flags = gr.decide(
            np.asarray(above, dtype=np.int64),
            vectors,
            len(pending.candidates),
            test.chi,
        )
        test.answer(pending.label, pending.candidates, flags)
        return pending.request

    # --- a peer -------------------------------------------------------------

    def on_ask(self, ask: RedundancyAsk, context: CkksPublicContext) -> None:
        """Compute and send the signed products for another device's candidates."""
        origin = self._peers.get(ask.origin)
        if origin is None:
            raise RefusedError(f"ask from unknown {ask.origin}")
        where = seal_context(
            OFFER_LABEL, self._channel.federation, ask.run_id, ask.step
        )
        try:
            layout = gr.Layout.of(
                ask.block_slots, ask.per_ciphertext, ask.ciphertexts, context.slot_count
            )
            parts = layout.parts(ask.vector_slots)
            opened = self._channel.open_from(origin, where, ask.box)
            label, eta, ciphertexts = _offer_payload(opened, layout)
            vectors = self._features(label) if self._features else np.zeros((0, 0))
            pool, order, real = gr.arrange_vectors(
                vectors, ask.vector_slots, layout.candidates, self._rng
            )
            seed = os.urandom(gr.SEED_BYTES)
            products = list(
                gr.signed_products(
                    context, ciphertexts, layout, pool, order, eta, seed, self._rng
                )
            )
        except (CryptoError, ResamplingError, ValueError) as exc:
            raise RefusedError(f"redundancy ask: {exc}") from None
        back = msgpack.packb({"count": real, "seed": seed})
        where = seal_context(BACK_LABEL, self._channel.federation, ask.run_id, ask.step)
        box = self._channel.seal_for(origin, where, back)
        for part, product in enumerate(products):
            reply = self._make(
                RedundancyReply,
                ask.round,
                run_id=ask.run_id,
                step=ask.step,
                part=part,
                parts=parts,
                products=product,
                box=box if part == 0 else None,
            )
            self._channel.send(reply)


def _same(a: FloatArray, b: FloatArray) -> bool:
    return bool(np.array_equal(a, b))


def _offer_payload(data: bytes, layout: gr.Layout) -> tuple[int, float, list[bytes]]:
    """``(label, eta, candidate ciphertexts)`` from an opened offer, checked."""
    value = msgpack.unpackb(data, raw=False)
    if not isinstance(value, dict) or set(value) != {"label", "eta", "ciphertexts"}:
        raise ValueError("offer payload is not {label, eta, ciphertexts}")
    label, eta, ciphertexts = value["label"], value["eta"], value["ciphertexts"]
    if type(label) is not int or not 0 <= label < MAX_LABEL:
        raise ValueError(f"bad label {label!r}")
    if not isinstance(eta, float) or not -1.0 <= eta <= 1.0:
        raise ValueError(f"bad eta {eta!r}")
    if not isinstance(ciphertexts, list) or len(ciphertexts) != layout.ciphertexts:
        raise ValueError("offer does not hold the layout's ciphertexts")
    if not all(isinstance(c, bytes) for c in ciphertexts):
        raise ValueError("a candidate ciphertext is not bytes")
    return label, eta, ciphertexts


def _back_payload(data: bytes) -> tuple[int, bytes]:
    """``(count, seed)`` from an opened peer box, checked."""
    value = msgpack.unpackb(data, raw=False)
    if not isinstance(value, dict) or set(value) != {"count", "seed"}:
        raise ValueError("peer payload is not {count, seed}")
    count, seed = value["count"], value["seed"]
    if type(count) is not int or count < 0:
        raise ValueError(f"bad count {count!r}")
    if not isinstance(seed, bytes) or len(seed) != gr.SEED_BYTES:
        raise ValueError("bad seed")
    return count, seed
