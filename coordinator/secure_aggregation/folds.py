"""The three gathers of a secure-aggregation round, as `Fold` s (pure, JSON-able).

``KeysFold``    asks the selected devices for their signed per-round keys
                (`SecAggSetup`); answers each device that gave keys with its
                `SecAggRoster` (U1 and its neighbours' signed keys).
``SharesFold``  takes one sealed share box per neighbour from each device of
                U1; answers each device that shared with the boxes sealed to
                it (`SecAggShareBundle`).
``UnmaskFold``  asks the survivors for their shares (`SecAggUnmask`); folds
                the revealed shares by owner. It answers nothing: the sum is
                the coordinator's.

The coordinator checks what it can without any secret: each advert's
signature against the device's enrolled identity, that a device boxes to
exactly its neighbours, that a revealed share is of the kind the unmask
request asked for and comes from a neighbour of its owner. Boxes and shares
themselves it cannot read (sealed), and a wrong share is caught when the
reconstructed key does not match the advertised one.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.gather import Fold
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity, verify_signature
from ursa.crypto.neighbour_graph import graph_seed, neighbours
from ursa.protocol.messages import (
    BaseMessage,
    ErrorCode,
    PeerKeys,
    RevealedShare,
    SecAggKeys,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggShares,
    SecAggUnmask,
    SecAggUnmaskShares,
    ShareBox,
)
from ursa.protocol.router import RejectedError
from ursa.protocol.secure_aggregation import advert_transcript

__all__ = ["Advert", "KeysFold", "RoundHead", "SharesFold", "UnmaskFold"]

Identities = Callable[[str], DevicePublicIdentity | None]
Certificates = Callable[[str], bytes]
"""A device's operator certificate, relayed with its keys (b"": none)."""


@dataclass(frozen=True)
class RoundHead:
    """Which round, model version and run a secure sum belongs to."""

    federation: str
    run: str
    round: int
    model: str
    version: int

    def check(self, message: SecAggKeys | SecAggShares | SecAggUnmaskShares) -> None:
        """Refuse a message of another round, model or version."""
        if message.round != self.round:
            raise RejectedError(ErrorCode.LATE, f"not round {self.round}")
        if message.model != self.model or message.model_version != self.version:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"secure sum of {self.model} v{self.version}, not "
                f"{message.model} v{message.model_version}",
            )


@dataclass(frozen=True)
class Advert:
    """A device's signed per-round public keys."""

    c_public: bytes
    s_public: bytes
    signature: bytes

    def dump(self) -> list[str]:
        """JSON-able form."""
        return [_b64(self.c_public), _b64(self.s_public), _b64(self.signature)]

    @classmethod
    def load(cls, data: Any) -> Advert:
        """The `dump` form back."""
        c, s, sig = (_unb64(v) for v in data)
        return cls(c, s, sig)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    return base64.b64decode(str(text), validate=True)


class KeysFold(Fold[SecAggKeys, dict[str, Advert]]):
    """SA1: signed per-round keys from the selected devices (see the module doc)."""

    def __init__(
        self,
        head: RoundHead,
        setup: SecAggSetup,
        identities: Identities,
        certificates: Certificates = lambda _device: b"",
    ) -> None:
        self._head = head
        self._setup = setup
        self._identities = identities
        self._certificates = certificates

    @property
    def setup(self) -> SecAggSetup:
        """The signed parameters the round runs with."""
        return self._setup

    def request(self) -> BaseMessage:
        """The signed setup (the same parameters at every call)."""
        return self._setup

    def requests(self) -> Iterable[tuple[BaseMessage, str | None]]:
        """The setup to each selected device on its own topic.

        Not to all: who was selected stays between the coordinator and the
        selected (the stratified draw's selections are private).
        """
        return [(self._setup, device) for device in self._setup.participants]

    def initial(self) -> dict[str, Advert]:
        """No adverts yet."""
        return {}

    def check(self, reply: SecAggKeys) -> None:
        """Refuse keys of another round or version."""
        self._head.check(reply)

    def apply(
        self, state: dict[str, Advert], device: str, reply: SecAggKeys
    ) -> dict[str, Advert]:
        """Keep keys whose signature verifies against the enrolled identity."""
        identity = self._identities(device)
        if identity is None:
            raise RejectedError(ErrorCode.UNAUTHORISED, "not enrolled")
        head = self._head
        transcript = advert_transcript(
            head.federation,
            head.run,
            head.round,
            device,
            reply.c_public,
            reply.s_public,
        )
        try:
            verify_signature(identity, transcript, reply.advert_signature)
        except CryptoError:
            raise RejectedError(
                ErrorCode.BAD_SIGNATURE, "secure-aggregation keys not signed by it"
            ) from None
        if reply.c_public == reply.s_public:
            raise RejectedError(ErrorCode.MALFORMED, "the two keys must differ")
        out = dict(state)
        out[device] = Advert(reply.c_public, reply.s_public, reply.advert_signature)
        return out

    def graph(self, state: Mapping[str, Advert]) -> dict[str, tuple[str, ...]]:
        """The masking graph over the devices that gave keys (U1)."""
        members = sorted(state)
        degree = min(self._setup.degree, max(1, len(members) - 1))
        head = self._head
        seed = graph_seed(head.federation, head.run, head.round)
        return neighbours(members, degree, seed)

    def rosters(self, state: Mapping[str, Advert]) -> list[tuple[SecAggRoster, str]]:
        """Each device of U1 with its roster (its neighbours' signed keys)."""
        graph = self.graph(state)
        members = tuple(sorted(state))
        out = []
        for device in members:
            peers = []
            for peer in graph[device]:
                identity = self._identities(peer)
                if identity is None:  # unenrolled since: it cannot be a peer
                    continue
                advert = state[peer]
                peers.append(
                    PeerKeys(
                        identity=device_keys_of(identity, self._certificates(peer)),
                        c_public=advert.c_public,
                        s_public=advert.s_public,
                        advert_signature=advert.signature,
                    )
                )
            roster = SecAggRoster(
                federation=self._head.federation,
                run=self._head.run,
                round=self._head.round,
                sender=self._setup.sender,
                model=self._head.model,
                model_version=self._head.version,
                participants=members,
                peers=tuple(peers),
            )
            out.append((roster, device))
        return out

    def result(self, state: dict[str, Advert]) -> BaseMessage | None:
        """Nothing to all: every device gets its own roster (`results`)."""
        return None

    def results(
        self, state: dict[str, Advert]
    ) -> Iterable[tuple[BaseMessage, str | None]]:
        """Each device's roster, on its own topic."""
        return self.rosters(state)

    def dump(self, state: dict[str, Advert]) -> Any:
        """Adverts by device."""
        return {device: advert.dump() for device, advert in state.items()}

    def load(self, data: Any, answered: frozenset[str]) -> dict[str, Advert]:
        """Adverts back; the answered devices must be the ones with adverts."""
        state = {str(d): Advert.load(v) for d, v in dict(data).items()}
        if set(state) != set(answered):
            raise ValueError("adverts do not match the answered devices")
        return state


BoxState = dict[str, dict[str, bytes]]
"""sender -> recipient -> sealed box."""


class SharesFold(Fold[SecAggShares, BoxState]):
    """SA2: one sealed box per neighbour from each device of U1."""

    def __init__(
        self, head: RoundHead, rosters: list[tuple[SecAggRoster, str]]
    ) -> None:
        self._head = head
        self._rosters = rosters
        self._neighbours = {
            device: frozenset(p.identity.device_id for p in roster.peers)
            for roster, device in rosters
        }

    def request(self) -> BaseMessage:
        """Unused: each device is asked with its roster (`requests`)."""
        return self._rosters[0][0]

    def requests(self) -> Iterable[tuple[BaseMessage, str | None]]:
        """Each device's roster, which asks it for its shares."""
        return list(self._rosters)

    def initial(self) -> BoxState:
        """No boxes yet."""
        return {}

    def check(self, reply: SecAggShares) -> None:
        """Refuse boxes of another round or version."""
        self._head.check(reply)

    def apply(self, state: BoxState, device: str, reply: SecAggShares) -> BoxState:
        """Keep the boxes when they go to exactly the sender's neighbours."""
        wanted = self._neighbours.get(device, frozenset())
        got = {box.peer for box in reply.boxes}
        if got != wanted:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"shares for {len(got)} peers, its neighbours are {len(wanted)}",
            )
        out = dict(state)
        out[device] = {box.peer: box.box for box in reply.boxes}
        return out

    def result(self, state: BoxState) -> BaseMessage | None:
        """Nothing to all: every device gets its own bundle (`results`)."""
        return None

    def results(self, state: BoxState) -> Iterable[tuple[BaseMessage, str | None]]:
        """Each device that shared gets the boxes its sharing neighbours sealed it."""
        head = self._head
        out: list[tuple[BaseMessage, str | None]] = []
        for recipient in sorted(state):
            boxes = tuple(
                ShareBox(peer=sender, box=boxes_of[recipient])
                for sender, boxes_of in sorted(state.items())
                if recipient in boxes_of
            )
            bundle = SecAggShareBundle(
                federation=head.federation,
                run=head.run,
                round=head.round,
                sender=self._rosters[0][0].sender,
                model=head.model,
                model_version=head.version,
                boxes=boxes,
            )
            out.append((bundle, recipient))
        return out

    def dump(self, state: BoxState) -> Any:
        """Boxes by sender and recipient."""
        return {
            sender: {peer: _b64(box) for peer, box in boxes.items()}
            for sender, boxes in state.items()
        }

    def load(self, data: Any, answered: frozenset[str]) -> BoxState:
        """Boxes back; the answered devices must be the senders."""
        state = {
            str(sender): {str(p): _unb64(b) for p, b in dict(boxes).items()}
            for sender, boxes in dict(data).items()
        }
        if set(state) != set(answered):
            raise ValueError("boxes do not match the answered devices")
        return state


ShareState = dict[str, list[tuple[str, RevealedShare]]]
"""owner -> (holder, revealed share) in arrival order."""


class UnmaskFold(Fold[SecAggUnmaskShares, ShareState]):
    """SA3: the survivors' revealed shares, by owner."""

    def __init__(
        self,
        head: RoundHead,
        request: SecAggUnmask,
        graph: Mapping[str, tuple[str, ...]],
    ) -> None:
        self._head = head
        self._request = request
        self._graph = graph
        self._survivors = frozenset(request.survivors)
        self._dropped = frozenset(request.dropped)

    @property
    def unmask(self) -> SecAggUnmask:
        """The signed survivor list."""
        return self._request

    def request(self) -> BaseMessage:
        """The signed survivor list, the same to all."""
        return self._request

    def requests(self) -> Iterable[tuple[BaseMessage, str | None]]:
        """The same signed list to each survivor, on its own topic."""
        return [(self._request, device) for device in self._request.survivors]

    def initial(self) -> ShareState:
        """No shares yet."""
        return {}

    def check(self, reply: SecAggUnmaskShares) -> None:
        """Refuse shares of another round or version."""
        self._head.check(reply)

    def apply(
        self, state: ShareState, device: str, reply: SecAggUnmaskShares
    ) -> ShareState:
        """Keep shares of the asked kind from neighbours of their owners."""
        around = {*self._graph.get(device, ()), device}  # it holds its own share
        for share in reply.shares:
            owner = share.owner
            if owner not in around:
                raise RejectedError(
                    ErrorCode.MALFORMED, f"holds no share of {owner} (not a neighbour)"
                )
            wanted = "b" if owner in self._survivors else "s"
            if owner not in self._survivors and owner not in self._dropped:
                raise RejectedError(ErrorCode.MALFORMED, f"{owner} did not share")
            if share.secret != wanted:
                raise RejectedError(
                    ErrorCode.MALFORMED, f"the {wanted}-share of {owner} was asked"
                )
        out = {owner: list(shares) for owner, shares in state.items()}
        for share in reply.shares:
            out.setdefault(share.owner, []).append((device, share))
        return out

    def result(self, state: ShareState) -> BaseMessage | None:
        """Nothing: the unmasked sum stays on the coordinator."""
        return None

    def dump(self, state: ShareState) -> Any:
        """Shares by owner."""
        return {
            owner: [[holder, s.secret, s.index, _b64(s.data)] for holder, s in shares]
            for owner, shares in state.items()
        }

    def load(self, data: Any, answered: frozenset[str]) -> ShareState:
        """Shares back."""
        out: ShareState = {}
        for owner, shares in dict(data).items():
            out[str(owner)] = [
                (
                    str(holder),
                    RevealedShare(
                        owner=str(owner),
                        secret=secret,
                        index=int(index),
                        data=_unb64(data_b64),
                    ),
                )
                for holder, secret, index, data_b64 in shares
            ]
        return out
