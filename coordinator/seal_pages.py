"""Paging a key epoch's sealing: which recipients' boxes the agent still owes.

Pure bookkeeping, no I/O. The recipients (the agent left out: it keeps its own
key) are cut into pages of `SEAL_PAGE_SIZE` in roster order. At most `window`
pages are open (sent to the agent, not yet complete) at a time; a page is
complete once every recipient in it has had a box relayed, and its place goes
to the next page. So the coordinator never holds more than `window` pages of
requests in flight, the agent never more than one page of work, and nothing
on the wire grows with the fleet.

Each recipient is relayed one box: a second box for it (the agent re-sealed
a page sent again, or a resent message) is a duplicate. After a restart the
coordinator knows only the completed prefix (`done_through`), so the open
pages are asked for again. A completed page is not proof that its boxes
reached anyone: the relayed boxes wait in the in-memory outbox after the
commit, and a ``kill -9`` in between loses them. So a restart also reopens
every completed page that holds a recipient not yet registered (`reopen`);
a recipient that got its box before the restart may get a second one, which
a device that holds the key ignores.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ursa.protocol.messages import SEAL_PAGE_SIZE

__all__ = ["DEFAULT_WINDOW", "BoxVerdict", "SealPaging"]

DEFAULT_WINDOW = 2
"""Pages open at once: the agent seals one while the next is on its way."""


class BoxVerdict(enum.Enum):
    """What one arriving box means for the paging."""

    NEW = "new"
    """A recipient's first box: relay it."""
    DUPLICATE = "duplicate"
    """The recipient had a box relayed already: drop it."""
    UNKNOWN = "unknown"
    """Not a recipient of this epoch's sealing (nor the agent)."""


@dataclass
class SealPaging:
    """The sealing of one key epoch, page by page.

    Attributes:
        pages: The recipients of each page, roster order, the agent left out.
        window: Pages open at once.
    """

    pages: tuple[tuple[str, ...], ...]
    window: int = DEFAULT_WINDOW
    _page_of: dict[str, int] = field(default_factory=dict, repr=False)
    _open: dict[int, set[str]] = field(default_factory=dict, repr=False)
    _done: set[int] = field(default_factory=set, repr=False)
    _next: int = 0

    @classmethod
    def plan(
        cls,
        recipients: Sequence[str],
        agent: str,
        *,
        page_size: int = SEAL_PAGE_SIZE,
        window: int = DEFAULT_WINDOW,
        done_through: int = 0,
    ) -> SealPaging:
        """Cut `recipients` into pages; pages before `done_through` are complete."""
        if page_size < 1 or window < 1:
            raise ValueError(
                f"page_size and window must be >= 1: {page_size}, {window}"
            )
        others = [d for d in recipients if d != agent]
        pages = tuple(
            tuple(others[i : i + page_size]) for i in range(0, len(others), page_size)
        )
        paging = cls(pages, window)
        paging._page_of = {d: i // page_size for i, d in enumerate(others)}
        first = max(0, min(done_through, len(pages)))
        paging._done = set(range(first))
        paging._next = first
        return paging

    @property
    def num_pages(self) -> int:
        """Pages in all (0: the agent is the only recipient)."""
        return len(self.pages)

    @property
    def is_complete(self) -> bool:
        """Every page has had all its boxes relayed."""
        return len(self._done) == len(self.pages)

    @property
    def pages_done(self) -> int:
        """Pages whose boxes were all relayed."""
        return len(self._done)

    @property
    def done_through(self) -> int:
        """Pages complete from the first on (what a restart may skip)."""
        first = 0
        while first in self._done:
            first += 1
        return first

    @property
    def open_pages(self) -> tuple[int, ...]:
        """Pages sent and not yet complete, in order."""
        return tuple(sorted(self._open))

    def owed(self, page: int) -> int:
        """Boxes still owed for an open page (0 for any other)."""
        return len(self._open.get(page, ()))

    def open_next(self) -> list[int]:
        """Open pages up to the window; the caller sends them to the agent."""
        opened: list[int] = []
        while len(self._open) < self.window and self._next < len(self.pages):
            page = self._next
            self._next += 1
            if page in self._done or page in self._open:
                continue
            self._open[page] = set(self.pages[page])
            opened.append(page)
        return opened

    def record(self, recipient: str) -> tuple[BoxVerdict, int | None]:
        """Account for one box to `recipient`: the verdict, and a page it completed.

        A box for a recipient of a page not yet open (a restart forgot that
        the page was sent) counts too: the recipient has its key either way.
        """
        page = self._page_of.get(recipient)
        if page is None:
            return BoxVerdict.UNKNOWN, None
        if page in self._done:
            return BoxVerdict.DUPLICATE, None
        owed = self._open.get(page)
        if owed is None:
            owed = self._open[page] = set(self.pages[page])
        if recipient not in owed:
            return BoxVerdict.DUPLICATE, None
        owed.discard(recipient)
        if owed:
            return BoxVerdict.NEW, None
        del self._open[page]
        self._done.add(page)
        return BoxVerdict.NEW, page

    def reopen(self, recipients: Iterable[str]) -> list[int]:
        """Mark the completed pages holding `recipients` as not done; those pages.

        They open again in order, within the window, before any page not yet
        sent; `open_next` hands them out.
        """
        pages = sorted(
            {
                page
                for d in recipients
                if (page := self._page_of.get(d)) is not None and page in self._done
            }
        )
        self._done.difference_update(pages)
        if pages:
            self._next = min(self._next, pages[0])
        return pages

    def is_recipient(self, device: str) -> bool:
        """Whether `device` is owed a box in this epoch."""
        return device in self._page_of
