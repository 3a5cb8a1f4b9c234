"""Device sets whose upkeep costs O(1) per message, whatever the fleet's size.

A coordinator of 100,000 devices cannot rebuild "who is online" or "who may
be selected" after every message: each rebuild copies O(N) set elements. The
service keeps `OnlineDevices` per device as presence, enrolment and refusals
change, and hands out a read-only view of it; a set only needed once per
stage is a `LazyDevices`, built the first time someone looks at it. A set a
round draws from (a key epoch's eligible devices, for Dubhe's top-up) is an
`IndexedDevices`: kept per device like `OnlineDevices`, and indexable, so a
uniform draw of a few of its members costs O(draws), not a sort of N ids.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import TypeVar

__all__ = ["CHANGE_LOG", "IndexedDevices", "LazyDevices", "OnlineDevices"]

_S = TypeVar("_S")

CHANGE_LOG = 4096
"""Recent membership changes an `OnlineDevices` remembers for `changes_since`."""


class _DeviceSet(Set[str]):
    """A read-only device set whose operators (``members & online``) give frozensets.

    `Set`'s mixin operators iterate the other operand, so ``tries & online``
    costs O(len(tries)) however large this set is.
    """

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> frozenset[_S]:
        return frozenset(it)


class OnlineDevices(_DeviceSet):
    """A read-only view: online enrolled devices not refusing us nor sitting out.

    ``ready`` is the service's maintained set (online, enrolled, not refusing);
    ``sat_out`` maps the few devices that sat a key epoch out to that epoch,
    and ``epoch`` gives the current one. Membership is O(1); the size costs
    O(devices that sat out), a handful. The service calls `touch` for every
    device whose membership may have changed, so a phase waiting on many
    devices follows the changes (`changes_since`) instead of rescanning.
    """

    def __init__(
        self,
        ready: Set[str],
        sat_out: Callable[[], Mapping[str, int]],
        epoch: Callable[[], int],
    ) -> None:
        self._ready = ready
        self._sat_out = sat_out
        self._epoch = epoch
        self._version = 0
        self._log: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)

    @property
    def version(self) -> int:
        """How many changes were recorded so far."""
        return self._version

    def touch(self, device: str) -> None:
        """Record that ``device`` may have joined or left the view."""
        self._version += 1
        self._log.append((self._version, device))

    def forget(self) -> None:
        """Everything may have changed (a restore): every follower rescans once."""
        self._version += len(self._log) + 1
        self._log.clear()

    def changes_since(self, version: int | None) -> tuple[int, list[str] | None]:
        """``(now, devices touched after version)``; None: rescan (log too short)."""
        now = self._version
        if version is None or now - version > len(self._log):
            return now, None
        changed: list[str] = []
        for v, device in reversed(self._log):
            if v <= version:
                break
            changed.append(device)
        changed.reverse()
        return now, changed

    def _sitting(self, device: str) -> bool:
        return self._sat_out().get(device) == self._epoch()

    def __contains__(self, device: object) -> bool:
        return (
            isinstance(device, str)
            and device in self._ready
            and not self._sitting(device)
        )

    def __len__(self) -> int:
        epoch = self._epoch()
        sitting = sum(
            1 for d, e in self._sat_out().items() if e == epoch and d in self._ready
        )
        return len(self._ready) - sitting

    def __iter__(self) -> Iterator[str]:
        return (d for d in list(self._ready) if not self._sitting(d))

    def __repr__(self) -> str:
        return f"OnlineDevices({len(self)} devices)"


class LazyDevices(_DeviceSet):
    """A device set computed on first use, then kept (it does not follow changes).

    For a set a step may never need, or needs once: building it per message
    would be O(N) work per message.
    """

    def __init__(self, compute: Callable[[], Set[str]]) -> None:
        self._compute: Callable[[], Set[str]] | None = compute
        self._devices: frozenset[str] = frozenset()

    @property
    def is_built(self) -> bool:
        """Whether the set was computed (for tests that count the work)."""
        return self._compute is None

    def _built(self) -> frozenset[str]:
        if self._compute is not None:
            self._devices = frozenset(self._compute())
            self._compute = None
        return self._devices

    def __contains__(self, device: object) -> bool:
        return device in self._built()

    def __len__(self) -> int:
        return len(self._built())

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __repr__(self) -> str:
        return f"LazyDevices({set(self._built())!r})"


class IndexedDevices(_DeviceSet):
    """A device set with O(1) add, discard, membership and access by position.

    An indexed list with swap-remove: `at` gives the member at a position in
    ``0 .. len - 1``, so a uniform random member is one random integer away.
    The order depends only on the sequence of adds and discards (never on
    string hashing), so a seeded draw is reproducible for a given sequence of
    events.
    """

    def __init__(self, devices: Iterable[str] = ()) -> None:
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        for device in devices:
            self.add(device)

    def add(self, device: str) -> None:
        """Make ``device`` a member (O(1); no-op if it is one)."""
        if device not in self._index:
            self._index[device] = len(self._ids)
            self._ids.append(device)

    def discard(self, device: str) -> None:
        """Remove ``device`` if present: the last member takes its position (O(1))."""
        position = self._index.pop(device, None)
        if position is None:
            return
        last = self._ids.pop()
        if position < len(self._ids):
            self._ids[position] = last
            self._index[last] = position

    def at(self, position: int) -> str:
        """The member at ``position`` (0 <= position < len)."""
        return self._ids[position]

    def __contains__(self, device: object) -> bool:
        return device in self._index

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __repr__(self) -> str:
        return f"IndexedDevices({len(self)} devices)"
