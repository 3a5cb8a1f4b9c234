"""The stratified draw's rank hand-out on the coordinator, once per key epoch.

Every registrant sent, with its encrypted registry, a one-time X25519 public
key (kept in Dubhe's records beside the key epoch's registries:
`ursa.coordinator.methods.dubhe.records.DubheRecords.rank_entries`). Before
the epoch's first round draws, the coordinator puts the registrants in a
uniformly random order (its seeded generator, fixed once and persisted),
cuts the order into pages and sends the agent each page's (registry,
one-time key) pairs as a `RankRequest`, without device ids. The agent ranks
the entries in order, seals each rank to its one-time key and answers
`SealedRanks` by position;
the coordinator maps each position back to its device and relays the box
(`SealedRank`). The coordinator sees ciphertexts and boxes only; the agent
sees an anonymous, shuffled list of categories.

Paging reuses `SealPaging` (a few pages open at a time, the next as one
completes). Progress is two ``method_state`` values under ``dubhe``: the
order and page size (written once per epoch) and the completed prefix of
pages (written per completed page), so a restarted coordinator re-sends only
the pages not known complete, in the same order; the agent ranks a page sent
again to the same ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ursa.coordinator.seal_pages import BoxVerdict, SealPaging
from ursa.protocol.messages import (
    COORDINATOR,
    RANK_PAGE_BUDGET,
    RANK_PAGE_SIZE,
    RankEntry,
    RankRequest,
)

__all__ = ["RANKS_DONE_KEY", "RANKS_KEY", "RankHandout", "rank_page_size"]

logger = logging.getLogger("ursa.coordinator.dubhe")

RANKS_KEY = "ranks"
"""``method_state("dubhe", ...)``: ``{"epoch", "order", "page_size"}``."""
RANKS_DONE_KEY = "ranks_done"
"""``method_state("dubhe", ...)``: ``{"epoch", "done_through"}``."""


def rank_page_size(blob_bytes: int) -> int:
    """Entries per page: at most `RANK_PAGE_SIZE` and `RANK_PAGE_BUDGET` bytes."""
    return max(1, min(RANK_PAGE_SIZE, RANK_PAGE_BUDGET // max(1, blob_bytes)))


@dataclass
class RankHandout:
    """One key epoch's rank hand-out, page by page.

    Attributes:
        epoch: The key epoch.
        order: The registrants in the shuffled order the agent ranks them in.
        page_size: Entries per `RankRequest` page.
        paging: Which pages are open and complete (`SealPaging`).
    """

    epoch: int
    order: tuple[str, ...]
    page_size: int
    paging: SealPaging
    sent_at: float | None = float("-inf")
    """When a page was last sent or completed (a stalled agent is asked again);
    None: just now, timed from the next step."""

    @classmethod
    def start(
        cls,
        epoch: int,
        entries: Mapping[str, tuple[bytes, bytes]],
        rng: np.random.Generator,
    ) -> RankHandout:
        """A new hand-out over `entries` in a uniformly random order."""
        devices = sorted(entries)
        order = tuple(devices[int(i)] for i in rng.permutation(len(devices)))
        longest = max((len(blob) for blob, _ in entries.values()), default=1)
        return cls.planned(epoch, order, rank_page_size(longest), 0)

    @classmethod
    def planned(
        cls, epoch: int, order: tuple[str, ...], page_size: int, done_through: int
    ) -> RankHandout:
        """The hand-out of `order`; pages before `done_through` are complete."""
        paging = SealPaging.plan(
            order,
            COORDINATOR,  # never a device id: nobody is left out
            page_size=page_size,
            done_through=done_through,
        )
        return cls(epoch, order, page_size, paging)

    @classmethod
    def restored(cls, plan: Any, done: Any) -> RankHandout | None:
        """The hand-out from its two stored records (None: none or unreadable)."""
        try:
            epoch = int(plan["epoch"])
            order = tuple(str(d) for d in plan["order"])
            page_size = int(plan["page_size"])
            through = 0
            if isinstance(done, dict) and int(done.get("epoch", -1)) == epoch:
                through = max(0, int(done.get("done_through", 0)))
            return cls.planned(epoch, order, page_size, through)
        except (KeyError, TypeError, ValueError):
            if plan is not None:
                logger.warning("ignoring an unreadable rank hand-out record")
            return None

    def plan_record(self) -> dict[str, Any]:
        """What `restored` needs of the plan (written once per epoch)."""
        return {
            "epoch": self.epoch,
            "order": list(self.order),
            "page_size": self.page_size,
        }

    def done_record(self) -> dict[str, Any]:
        """What `restored` needs of the progress (written per completed page)."""
        return {"epoch": self.epoch, "done_through": self.paging.done_through}

    @property
    def is_complete(self) -> bool:
        """Every page's boxes were relayed."""
        return self.paging.is_complete

    def pages_to_send(self, *, again: bool) -> list[int]:
        """Pages to send now: newly opened ones (and, `again`, those still open)."""
        pages = list(self.paging.open_pages) if again else []
        return pages + self.paging.open_next()

    def request(
        self,
        page: int,
        entries: Mapping[str, tuple[bytes, bytes]],
        federation: str,
        round_index: int,
    ) -> RankRequest:
        """Page `page` as a `RankRequest` (`entries` holds every device of `order`)."""
        rows = [entries[d] for d in self.paging.pages[page]]
        return RankRequest(
            federation=federation,
            round=round_index,
            sender=COORDINATOR,
            epoch=self.epoch,
            page=page,
            pages=self.paging.num_pages,
            entries=tuple(RankEntry(registry=r, rank_key=k) for r, k in rows),
        )

    def device_at(self, page: int, entry: int) -> str | None:
        """The device behind entry `entry` of page `page` (None: no such entry)."""
        if not 0 <= page < self.paging.num_pages:
            return None
        devices = self.paging.pages[page]
        return devices[entry] if 0 <= entry < len(devices) else None

    def record(self, device: str) -> tuple[BoxVerdict, int | None]:
        """Account for `device`'s box: relay it when NEW; the page it completed."""
        return self.paging.record(device)
