"""Dubhe's wire contract: registration (Fig. 4) and multi-time selection (Fig. 3, 5).

The parameter search of §5.3.2 (sigma grid) has no messages: it ran in the
simulator only and, measured there, a fixed sigma did as well
(docs/results/dubhe-selection.md).

The stratified draw adds the rank hand-out, once per key epoch: a device's
`Registration` carries a one-time X25519 key (`rank_key`); the coordinator
sends the agent the (registry, one-time key) pairs in a shuffled order, in
`RankRequest` pages; the agent answers each page with `SealedRanks` (one box
per entry, by position: it never learns a device id) and the coordinator
relays each box to its device as a `SealedRank`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    MAX_TRIES,
    REGISTRY,
    BaseMessage,
    Blob,
    Count,
    Key32,
    Positive,
    TryIndices,
    _Frozen,
)

DISTRIBUTION_BOUND = 1.0
"""Largest label proportion a device encodes (`FixedPoint` bound): the agent's
and the coordinator's checks of a try's distributions follow from it."""

RANK_PAGE_SIZE = 256
"""Most entries in one `RankRequest` page (as `SEAL_PAGE_SIZE` for sealing)."""

RANK_PAGE_BUDGET = 256 * 1024
"""Most registry ciphertext bytes in one `RankRequest` (a quarter of the cap):
pages are cut smaller when the epoch's registries are long."""

MAX_RANK_BOX_BYTES = 256
"""Longest sealed rank (8 bytes of slot and rank, sealed: 69)."""


class Registration(BaseMessage):
    """Device to coordinator: its encrypted one-hot registry."""

    kind: Literal["registration"] = "registration"
    epoch: Count
    candidate: Count = 0
    registry: Blob
    rank_key: Key32 | None = None
    """Stratified draw only: a one-time X25519 public key, fresh per key
    epoch, that the agent seals this registration's rank to."""


class RegistrySum(BaseMessage):
    """Coordinator to all: the encrypted overall registry and its party count."""

    kind: Literal["registry_sum"] = "registry_sum"
    topic: ClassVar[str] = REGISTRY
    retained: ClassVar[bool] = True
    epoch: Count
    candidate: Count = 0
    registry_sum: Blob
    num_parties: Positive


class RegistryCheck(BaseMessage):
    """Coordinator to agent: one page of the epoch's registries, shuffled, no ids.

    Sent when registration closes, before the `RegistrySum`: the agent
    decrypts each entry and names those that are not one-hot (exactly one
    slot 1, the others 0), so they leave the sum. The order over all pages is
    a uniformly random permutation of the registrants; `page` counts from 0.
    """

    kind: Literal["registry_check"] = "registry_check"
    epoch: Count
    page: Count = 0
    pages: Positive = 1
    registries: Annotated[
        tuple[Blob, ...], Field(min_length=1, max_length=RANK_PAGE_SIZE)
    ]

    @_model_validator(mode="after")
    def _page_in_range(self) -> Self:
        if self.page >= self.pages:
            raise ValueError(f"page {self.page} of {self.pages} pages")
        return self


class RegistryVerdict(BaseMessage):
    """Agent to coordinator: one checked page's entries that are not one-hot, signed.

    ``entries`` repeats the page's length (a verdict for another page cut is
    refused); ``bad`` are positions in it.
    """

    kind: Literal["registry_verdict"] = "registry_verdict"
    epoch: Count
    page: Count
    entries: Annotated[int, Field(ge=1, le=RANK_PAGE_SIZE)]
    bad: Annotated[tuple[Count, ...], Field(max_length=RANK_PAGE_SIZE)] = ()

    @_model_validator(mode="after")
    def _bad_in_page(self) -> Self:
        if len(set(self.bad)) != len(self.bad):
            raise ValueError("an entry is named twice")
        if any(b >= self.entries for b in self.bad):
            raise ValueError(f"a bad entry outside the page's {self.entries}")
        return self


class Volunteer(BaseMessage):
    """Device to coordinator: one Bernoulli(P) draw per try (length = tries)."""

    kind: Literal["volunteer"] = "volunteer"
    draws: Annotated[tuple[bool, ...], Field(min_length=1, max_length=MAX_TRIES)]


class TryAssignment(BaseMessage):
    """Coordinator to a tentative member: the tries it is in; send its distribution."""

    kind: Literal["try_assignment"] = "try_assignment"
    try_indices: TryIndices


class EncryptedDistribution(BaseMessage):
    """Device to coordinator: its packed fixed-point label distribution.

    Sent once per round; the coordinator adds it into every try it is in.
    """

    kind: Literal["encrypted_distribution"] = "encrypted_distribution"
    distribution: Blob


class TrySums(BaseMessage):
    """Coordinator to agent: the encrypted distribution sum of each try."""

    kind: Literal["try_sums"] = "try_sums"
    sums: Annotated[tuple[Blob, ...], Field(min_length=1, max_length=MAX_TRIES)]
    member_counts: tuple[Positive, ...]

    @_model_validator(mode="after")
    def _same_length(self) -> Self:
        if len(self.member_counts) != len(self.sums):
            raise ValueError("member_counts needs one entry per sum")
        return self


class AgentAnswer(BaseMessage):
    """Agent to coordinator: the index of the best try, and the bad sums, signed.

    ``bad_tries`` (positions in `TrySums.sums`) lists the sums no honest
    members can produce (a slot over its bound, a ciphertext count the layout
    does not have, totals that are not the member count's distributions): the
    coordinator drops the offending member and sums again instead of re-keying.
    ``best_try`` is the best of the others; None when every sum was bad.
    """

    kind: Literal["agent_answer"] = "agent_answer"
    best_try: Count | None
    bad_tries: Annotated[tuple[Count, ...], Field(max_length=MAX_TRIES)] = ()

    @_model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(set(self.bad_tries)) != len(self.bad_tries):
            raise ValueError("a bad try is named twice")
        if self.best_try is None and not self.bad_tries:
            raise ValueError("no best try, yet no bad sum")
        if self.best_try is not None and self.best_try in self.bad_tries:
            raise ValueError(f"best try {self.best_try} is also a bad sum")
        return self


class RankEntry(_Frozen):
    """One anonymous registration in a `RankRequest` (not a message)."""

    registry: Blob
    rank_key: Key32


class RankRequest(BaseMessage):
    """Coordinator to agent: one page of the epoch's registrations, shuffled.

    Entries carry no device id; their order over all pages is a uniformly
    random permutation of the registered devices, fixed once per key epoch.
    `page` counts from 0 up to `pages` - 1; the agent ranks pages in order.
    """

    kind: Literal["rank_request"] = "rank_request"
    epoch: Count
    page: Count = 0
    pages: Positive = 1
    entries: Annotated[
        tuple[RankEntry, ...], Field(min_length=1, max_length=RANK_PAGE_SIZE)
    ]

    @_model_validator(mode="after")
    def _page_in_range(self) -> Self:
        if self.page >= self.pages:
            raise ValueError(f"page {self.page} of {self.pages} pages")
        return self


class RankBox(_Frozen):
    """One entry's sealed rank in a `SealedRanks` (not a message)."""

    entry: Count
    """The entry's position in its `RankRequest` page."""
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_RANK_BOX_BYTES)]


class SealedRanks(BaseMessage):
    """Agent to coordinator: one page's ranks, each sealed to its one-time key."""

    kind: Literal["sealed_ranks"] = "sealed_ranks"
    epoch: Count
    page: Count
    boxes: Annotated[
        tuple[RankBox, ...], Field(min_length=1, max_length=RANK_PAGE_SIZE)
    ]

    @_model_validator(mode="after")
    def _unique_entries(self) -> Self:
        entries = [b.entry for b in self.boxes]
        if len(set(entries)) != len(entries):
            raise ValueError("one box per entry")
        return self


class SealedRank(BaseMessage):
    """Coordinator to one device: its sealed rank (unopenable by the coordinator)."""

    kind: Literal["sealed_rank"] = "sealed_rank"
    epoch: Count
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_RANK_BOX_BYTES)]
