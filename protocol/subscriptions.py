"""`SubscriptionBook`: the filters a client wants, and the SUBACKs due for them.

A transport renews every filter on each new connection (with or without a
persistent session), so the table lives client-side and outlives connections.
A SUBACK answers one SUBSCRIBE by its packet id: `MqttTransport` waits for it
(paho's thread may record it before the caller starts waiting, so results are
kept, the oldest aging out), `MqttPool` only says whether one is still due.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from ursa.protocol.transport import (
    SubscriptionRefusedError,
    TransportTimeoutError,
    validate_filter,
)

__all__ = ["SUBACK_MEMORY", "SubscriptionBook"]

SUBACK_MEMORY = 256
"""SUBACK results kept for waiters (older ones age out)."""


class SubscriptionBook:
    """Wanted filters with their QoS, and SUBACKs by packet id (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._filters: dict[str, int] = {}
        self._due: set[int] = set()
        self._results: OrderedDict[int, list[bool]] = OrderedDict()

    def add(self, pattern: str, qos: int) -> None:
        """Want `pattern` at `qos` from now on (renewed on every connection).

        Raises:
            InvalidTopicError: `pattern` is not a valid filter.
            ValueError: `qos` is not 0, 1 or 2.
        """
        validate_filter(pattern)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos}")
        with self._cond:
            self._filters[pattern] = qos

    def remove(self, pattern: str) -> None:
        """Forget `pattern` (no error if it was not wanted)."""
        with self._cond:
            self._filters.pop(pattern, None)

    def filters(self) -> list[tuple[str, int]]:
        """Every wanted `(filter, qos)`, in the order first added."""
        with self._cond:
            return list(self._filters.items())

    @property
    def is_due(self) -> bool:
        """True while a SUBSCRIBE recorded by `sent` awaits its SUBACK."""
        with self._cond:
            return bool(self._due)

    def sent(self, mid: int) -> None:
        """Record a SUBSCRIBE (packet id `mid`) whose SUBACK is due."""
        with self._cond:
            if mid not in self._results:
                self._due.add(mid)

    def new_connection(self) -> None:
        """Forget SUBACKs due on an earlier connection (they never come)."""
        with self._cond:
            self._due.clear()

    def acked(self, mid: int, refused: Sequence[bool]) -> None:
        """Record the SUBACK for `mid`: per filter sent, whether it was refused."""
        with self._cond:
            self._due.discard(mid)
            self._results[mid] = list(refused)
            while len(self._results) > SUBACK_MEMORY:
                self._results.popitem(last=False)
            self._cond.notify_all()

    def wait(self, mid: int, patterns: Sequence[str], timeout_s: float) -> None:
        """Wait for the SUBACK of `mid`, which subscribed `patterns` in order.

        Raises:
            TransportTimeoutError: no SUBACK in time (the filters stay wanted
                and are renewed on the next connection).
            SubscriptionRefusedError: the broker refused some of `patterns`;
                those are forgotten.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._results, timeout_s):
                raise TransportTimeoutError(
                    f"no SUBACK for {list(patterns)} within {timeout_s} s"
                )
            refused = [
                pattern
                for pattern, no in zip(patterns, self._results.pop(mid), strict=False)
                if no
            ]
            for pattern in refused:
                self._filters.pop(pattern, None)
        if refused:
            raise SubscriptionRefusedError(f"broker refused the filter(s) {refused}")
