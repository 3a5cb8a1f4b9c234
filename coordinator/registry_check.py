"""The agent's one-hot check of a key epoch's registrations, before the sum.

A registration is one party's encrypted registry: honest, it is one-hot (one
slot 1, every other 0). The coordinator cannot look inside, and the sum the
devices decrypt only shows the total: a registration of +5 on one slot and
-1 on four others adds up to 1 like an honest one, and empties four slots
of one honest device each, whose devices never volunteer again that epoch.
So when registration closes, the coordinator sends the agent every
registration, in a uniformly random order and without device ids
(`RegistryCheck` pages, a few open at a time: `SealPaging`); the agent
decrypts each and answers, signed, which positions are not one-hot
(`RegistryVerdict`). The coordinator maps positions back to devices, leaves
those out of the epoch (they are not registered, so never eligible) and
publishes the sum of the others. The agent learns an anonymous, shuffled
list of categories: the overall registry every device decrypts anyway.

Pure bookkeeping: the coordinator's key-epoch stages send the pages, verify
the verdicts' signatures and sum (`ursa.coordinator.key_epoch`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ursa.coordinator.seal_pages import BoxVerdict, SealPaging
from ursa.protocol.messages import (
    COORDINATOR,
    RANK_PAGE_BUDGET,
    RANK_PAGE_SIZE,
    RegistryCheck,
)

__all__ = ["RegistryCheckError", "RegistryChecking", "shuffle_generator"]

SHUFFLE_STREAM = 0x5EC4
"""Sub-stream of the coordinator's seed that shuffles the check's entries."""


def shuffle_generator(seed: int | None, epoch: int) -> np.random.Generator:
    """The check's own generator: the coordinator's seeded draws stay as they were.

    Seeded runs shuffle reproducibly; an unseeded coordinator from OS entropy.
    """
    return np.random.default_rng(
        None if seed is None else [seed, epoch, SHUFFLE_STREAM]
    )


class RegistryCheckError(ValueError):
    """A verdict that does not fit the check (another page cut, a closed page)."""


@dataclass
class RegistryChecking:
    """One key epoch's check, page by page.

    Attributes:
        epoch: The key epoch.
        blobs: Each registrant's registration ciphertext.
        paging: The shuffled registrants in pages; which are open and done.
        excluded: Registrants the agent found not one-hot.
        sent_at: When a page was last sent or answered (a stalled agent is
            asked again).
    """

    epoch: int
    blobs: dict[str, bytes]
    paging: SealPaging
    excluded: set[str] = field(default_factory=set)
    sent_at: float = float("-inf")

    @classmethod
    def start(
        cls, epoch: int, blobs: Mapping[str, bytes], rng: np.random.Generator
    ) -> RegistryChecking:
        """A check of `blobs` in a uniformly random order (the generator's)."""
        devices = sorted(blobs)
        order = [devices[int(i)] for i in rng.permutation(len(devices))]
        longest = max((len(b) for b in blobs.values()), default=1)
        size = max(1, min(RANK_PAGE_SIZE, RANK_PAGE_BUDGET // longest))
        paging = SealPaging.plan(order, COORDINATOR, page_size=size)
        return cls(epoch, dict(blobs), paging)

    @property
    def is_complete(self) -> bool:
        """Every page has its verdict."""
        return self.paging.is_complete

    def requests(
        self, federation: str, round_index: int, *, again: bool
    ) -> list[RegistryCheck]:
        """The pages to send now: newly opened (and, `again`, still open) ones."""
        pages = list(self.paging.open_pages) if again else []
        pages += self.paging.open_next()
        return [
            RegistryCheck(
                federation=federation,
                round=round_index,
                sender=COORDINATOR,
                epoch=self.epoch,
                page=page,
                pages=self.paging.num_pages,
                registries=tuple(self.blobs[d] for d in self.paging.pages[page]),
            )
            for page in pages
        ]

    def record(self, page: int, entries: int, bad: Sequence[int]) -> bool:
        """The agent's verdict on `page`; False when it had one already.

        Raises:
            RegistryCheckError: no such page, or one of another length.
        """
        if not 0 <= page < self.paging.num_pages:
            raise RegistryCheckError(f"no page {page} of {self.paging.num_pages}")
        devices = self.paging.pages[page]
        if entries != len(devices):
            raise RegistryCheckError(
                f"page {page} has {len(devices)} entries, the verdict {entries}"
            )
        fresh = False
        for device in devices:
            verdict, _ = self.paging.record(device)
            fresh |= verdict is BoxVerdict.NEW
        if fresh:
            self.excluded.update(devices[b] for b in bad)
        return fresh

    def good(self) -> list[str]:
        """The registrants whose registration passed, in id order."""
        return sorted(set(self.blobs) - self.excluded)
