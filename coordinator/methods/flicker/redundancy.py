"""The coordinator's part of FLICKER's global redundancy test (pure: no I/O, no clock).

During a resampling step the dominant device may run the global test of
the FLICKER paper, §3.2.2 (the design, and what each party learns, is in
`ursa.edge_sdk.methods.flicker.global_redundancy`)::

    dominant -> RedundancyOffer(recipient, recipients, layout, box) -> coordinator
    coordinator -> RedundancyAsk(origin, layout, vector_slots, box) -> recipient
    peer -> RedundancyReply(part i of n, products[, box]) -> coordinator
    coordinator -> RedundancyResult(peers, peer, box, sign bits) -> dominant

The boxes are sealed device to device; the coordinator relays them unopened
and decrypts only the products, keeping one bit per block (`decrypt_signs`:
the sign of ``s * sigma * (cos - eta)``, with ``sigma`` a coin flip it does
not know). `RedundancyTest` tracks one test: the peers asked, the parts
each returned (every part exactly once, each reply the same size), and its
deadline; a peer that has not returned every part by then is skipped, and a
reply after the result is refused as late.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import pad_length
from ursa.protocol.messages import (
    MAX_REDUNDANCY_CIPHERTEXTS,
    REDUNDANCY_SCALE_BITS,
    BaseMessage,
    ErrorCode,
    RedundancyAsk,
    RedundancyOffer,
    RedundancyReply,
    RedundancyResult,
)

if TYPE_CHECKING:
    from ursa.crypto.ckks import CkksKeyOwner

__all__ = [
    "DEFAULT_MAX_PRODUCT_CIPHERTEXTS",
    "MAX_MAGNITUDE",
    "PeerSigns",
    "RedundancyError",
    "RedundancyRelay",
    "RedundancyTest",
    "decrypt_signs",
    "vector_slots_for",
]

DEFAULT_MAX_PRODUCT_CIPHERTEXTS = 64
"""Product ciphertexts (~235 KB each) one peer returns per test, at most."""
MAX_MAGNITUDE = 2.0 ** (REDUNDANCY_SCALE_BITS + 1) * 1.01
"""Largest plausible block sum: ``s < 2^20`` times ``|cos - eta| <= 2``, + noise."""

BoolArray = npt.NDArray[np.bool_]
Outgoing = list[tuple[BaseMessage, str]]
"""Messages to send, each with its device."""
_M = TypeVar("_M", bound=BaseMessage)


class MessageFactory(Protocol):
    """Builds a coordinator message (federation, round and sender filled in)."""

    def __call__(self, cls: type[_M], **fields: Any) -> _M:
        """Return a ``cls`` message with ``fields``."""
        ...


class RedundancyError(ValueError):
    """A redundancy message refused; ``code`` is an `ErrorCode` value."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def vector_slots_for(
    global_counts: tuple[int, ...],
    block: int,
    per_ciphertext: int,
    ciphertexts: int,
    slot_count: int,
    max_product_ciphertexts: int = DEFAULT_MAX_PRODUCT_CIPHERTEXTS,
) -> int:
    """How many vectors every peer's reply covers: ``pad_length(max(GD))``, capped.

    It depends on the global counts only, never on a peer's own, so every
    reply has the same size. Capped so that a reply holds at most
    ``max_product_ciphertexts`` ciphertexts; never below one ciphertext's worth.
    """
    repeats = slot_count // block // per_ciphertext
    needed = pad_length(max(1, max(global_counts)))
    cap_parts = max(1, max_product_ciphertexts // ciphertexts)
    cap = repeats * (1 << (cap_parts.bit_length() - 1))
    return max(repeats, min(needed, cap))


def decrypt_signs(
    key_owner: CkksKeyOwner, ciphertext: bytes, block: int, copies: int
) -> BoolArray:
    """One bit per block: whether the block's sum is positive.

    Raises:
        RedundancyError: not ``copies`` blocks, or a sum too large to come
            from the protocol (a malformed or forged reply).
        CryptoError: the ciphertext does not decrypt under this key.
    """
    values = key_owner.decrypt(ciphertext)
    if len(values) != block * copies:
        reason = f"{len(values)} slots, expected {block * copies}"
        raise RedundancyError(ErrorCode.BAD_CIPHERTEXT, reason)
    sums = values.reshape(copies, block).sum(axis=1)
    if float(np.max(np.abs(sums))) > MAX_MAGNITUDE:
        raise RedundancyError(ErrorCode.BAD_CIPHERTEXT, "block sums out of range")
    signs: BoolArray = sums > 0.0
    return signs


@dataclass
class PeerSigns:
    """What one asked peer has returned so far."""

    box: bytes | None = None
    parts: dict[int, BoolArray] = field(default_factory=dict)


@dataclass
class RedundancyTest:
    """One global redundancy test at one correction step.

    Attributes:
        dominant: the device whose candidates are tested.
        step: the correction step (its resample request).
        recipients: the peers the dominant device names (the run's devices).
        block, per_ciphertext, ciphertexts: the candidates' layout.
        vector_slots: vectors each reply covers (`vector_slots_for`).
        parts: product ciphertexts each reply has.
        deadline_at: when peers still missing are skipped.
    """

    dominant: str
    step: int
    recipients: frozenset[str]
    block: int
    per_ciphertext: int
    ciphertexts: int
    vector_slots: int
    parts: int
    deadline_at: float
    copies: int
    offered: set[str] = field(default_factory=set)
    peers: dict[str, PeerSigns] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        *,
        dominant: str,
        step: int,
        recipients: frozenset[str],
        layout: tuple[int, int, int],
        global_counts: tuple[int, ...],
        slot_count: int,
        deadline_at: float,
        max_product_ciphertexts: int = DEFAULT_MAX_PRODUCT_CIPHERTEXTS,
    ) -> RedundancyTest:
        """Open a test for an offer's layout ``(block, per_ciphertext, ciphertexts)``.

        Raises:
            RedundancyError: a layout that does not fit the context.
        """
        block, per_ciphertext, ciphertexts = layout
        copies = slot_count // block if block <= slot_count else 0
        if not copies or per_ciphertext > copies:
            raise RedundancyError(ErrorCode.MALFORMED, f"layout {layout} does not fit")
        if not 1 <= ciphertexts <= MAX_REDUNDANCY_CIPHERTEXTS:
            raise RedundancyError(ErrorCode.MALFORMED, f"{ciphertexts} ciphertexts")
        slots = vector_slots_for(
            global_counts,
            block,
            per_ciphertext,
            ciphertexts,
            slot_count,
            max_product_ciphertexts,
        )
        parts = ciphertexts * slots // (copies // per_ciphertext)
        return cls(
            dominant,
            step,
            recipients,
            block,
            per_ciphertext,
            ciphertexts,
            slots,
            parts,
            deadline_at,
            copies,
        )

    @property
    def layout(self) -> tuple[int, int, int]:
        """``(block, per_ciphertext, ciphertexts)``."""
        return self.block, self.per_ciphertext, self.ciphertexts

    def accept_offer(
        self, recipient: str, recipients: frozenset[str], layout: tuple[int, int, int]
    ) -> None:
        """Record an offer to relay to ``recipient``.

        Raises:
            RedundancyError: a layout or peer list unlike the first offer's,
                or a second offer to the same peer.
        """
        if layout != self.layout or recipients != self.recipients:
            raise RedundancyError(ErrorCode.MALFORMED, "offer unlike the first one")
        if recipient in self.offered:
            raise RedundancyError(ErrorCode.MALFORMED, f"second offer to {recipient}")
        self.offered.add(recipient)
        self.peers[recipient] = PeerSigns()

    def check_part(self, sender: str, part: int, parts: int, has_box: bool) -> None:
        """Refuse a reply part that was not asked for or is not expected.

        Raises:
            RedundancyError: an unasked sender, a wrong part count, a part
                already received.
        """
        peer = self.peers.get(sender)
        if peer is None:
            raise RedundancyError(ErrorCode.UNAUTHORISED, f"{sender} was not asked")
        if parts != self.parts:
            raise RedundancyError(
                ErrorCode.MALFORMED, f"reply of {parts} parts, expected {self.parts}"
            )
        if part in peer.parts:
            raise RedundancyError(ErrorCode.MALFORMED, f"part {part} twice")
        if has_box != (part == 0):
            raise RedundancyError(ErrorCode.MALFORMED, "box only in part 0")

    def add_part(
        self, sender: str, part: int, signs: BoolArray, box: bytes | None
    ) -> None:
        """Keep a checked, decrypted part (`check_part` first)."""
        peer = self.peers[sender]
        peer.parts[part] = signs
        if box is not None:
            peer.box = box

    @property
    def complete(self) -> tuple[str, ...]:
        """Peers that returned every part, sorted."""
        return tuple(
            sorted(d for d, p in self.peers.items() if len(p.parts) == self.parts)
        )

    @property
    def missing(self) -> tuple[str, ...]:
        """Peers asked or named that have not returned every part, sorted."""
        return tuple(sorted(self.recipients - set(self.complete)))

    def is_done(self, now: float) -> bool:
        """All named peers answered, or the deadline passed."""
        return not self.missing or now >= self.deadline_at

    def signs_of(self, peer: str) -> tuple[bytes, bytes]:
        """A complete peer's box and packed sign bits (parts in order)."""
        signs = self.peers[peer]
        bits = np.concatenate([signs.parts[i] for i in range(self.parts)])
        if signs.box is None:  # unreachable: part 0 carries it
            raise RedundancyError(ErrorCode.MALFORMED, "no box")
        return signs.box, np.packbits(bits).tobytes()


class RedundancyRelay:
    """The coordinator's side of the test at the current step: relay, decrypt, answer.

    Pure: it returns the messages to send (`Outgoing`) and takes the time as
    an argument. At most one test is open; a new step or run replaces it.

    Args:
        key_owner: Decrypts the products.
        slot_count: Slots per ciphertext of the public context.
        make: Builds coordinator messages.
        deadline_s: Time the peers get from the first offer.
        max_product_ciphertexts: Cap on one reply's ciphertexts.
    """

    def __init__(
        self,
        key_owner: CkksKeyOwner,
        slot_count: int,
        make: MessageFactory,
        *,
        deadline_s: float,
        max_product_ciphertexts: int = DEFAULT_MAX_PRODUCT_CIPHERTEXTS,
    ) -> None:
        self.test: RedundancyTest | None = None
        self._key_owner = key_owner
        self._slot_count = slot_count
        self._make = make
        self._deadline_s = deadline_s
        self._max_parts = max_product_ciphertexts

    def reset(self) -> None:
        """Forget an open test (its step is over)."""
        self.test = None

    def postpone(self, seconds: float) -> None:
        """Give an open test's peers ``seconds`` more (a broker outage's time)."""
        if self.test is not None:
            self.test.deadline_at += seconds

    def on_offer(
        self,
        offer: RedundancyOffer,
        participants: Collection[str],
        global_counts: tuple[int, ...],
        now: float,
    ) -> Outgoing:
        """Relay a checked offer (the sender is the dominant device at this step).

        Raises:
            RedundancyError: a recipient outside the run, or an offer unlike
                the test's first.
        """
        named = frozenset(offer.recipients) & (set(participants) - {offer.sender})
        if offer.recipient not in named:
            reason = f"{offer.recipient} is not a peer of this run"
            raise RedundancyError(ErrorCode.UNAUTHORISED, reason)
        layout = (offer.block_slots, offer.per_ciphertext, offer.ciphertexts)
        test = self.test
        if test is None or test.step != offer.step:
            test = RedundancyTest.open(
                dominant=offer.sender,
                step=offer.step,
                recipients=named,
                layout=layout,
                global_counts=global_counts,
                slot_count=self._slot_count,
                deadline_at=now + self._deadline_s,
                max_product_ciphertexts=self._max_parts,
            )
        test.accept_offer(offer.recipient, named, layout)
        self.test = test
        ask = self._make(
            RedundancyAsk,
            run_id=offer.run_id,
            step=offer.step,
            origin=offer.sender,
            block_slots=offer.block_slots,
            per_ciphertext=offer.per_ciphertext,
            ciphertexts=offer.ciphertexts,
            vector_slots=test.vector_slots,
            box=offer.box,
        )
        return [(ask, offer.recipient)]

    def on_reply(
        self, reply: RedundancyReply, now: float
    ) -> tuple[Outgoing, dict[str, Any] | None]:
        """Decrypt one reply part; the results once every peer answered.

        Returns the messages to send and, when the test closed, its summary.

        Raises:
            RedundancyError: no open test at this step (late), or a part not
                expected or not decrypting to plausible sums.
            CryptoError: a ciphertext under another key or malformed.
        """
        test = self.test
        if test is None or test.step != reply.step:
            reason = f"no open redundancy test at step {reply.step}"
            raise RedundancyError(ErrorCode.LATE, reason)
        test.check_part(reply.sender, reply.part, reply.parts, reply.box is not None)
        signs = decrypt_signs(self._key_owner, reply.products, test.block, test.copies)
        test.add_part(reply.sender, reply.part, signs, reply.box)
        if test.is_done(now):
            return self._close(test, reply.run_id)
        return [], None

    def on_tick(
        self, now: float, run_id: str
    ) -> tuple[Outgoing, dict[str, Any] | None]:
        """Close an overdue test with the peers that answered in full."""
        test = self.test
        if test is None or not test.is_done(now):
            return [], None
        return self._close(test, run_id)

    def _close(
        self, test: RedundancyTest, run_id: str
    ) -> tuple[Outgoing, dict[str, Any]]:
        self.test = None
        peers = test.complete
        common = {
            "run_id": run_id,
            "step": test.step,
            "peers": peers,
            "vector_slots": test.vector_slots,
        }
        out: Outgoing = []
        for peer in peers:
            box, signs = test.signs_of(peer)
            result = self._make(
                RedundancyResult, **common, peer=peer, box=box, signs=signs
            )
            out.append((result, test.dominant))
        if not peers:
            out.append((self._make(RedundancyResult, **common), test.dominant))
        summary = {
            "redundancy": test.dominant,
            "peers": list(peers),
            "silent": list(test.missing),
            "vector_slots": test.vector_slots,
            "candidate_places": test.per_ciphertext * test.ciphertexts,
        }
        return out, summary
