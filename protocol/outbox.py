"""A send queue: messages are queued under a lock and published outside it.

Message handlers run inside transport callbacks (and, on the in-memory bus,
inside another party's `publish`), so they must not publish while holding
their state lock. They queue instead, and the caller flushes once the state is
consistent. A flush already under way in another frame or thread makes a
second flush return at once: the running one drains whatever was queued
meanwhile, so messages leave in the order they were queued.

A durable owner (the coordinator, whose store commits in batches) sets a
`CommitGate`: an item queued while a write is not committed yet leaves only
after the gate has committed it, so nothing published reveals a state change
that a crash could still take back.

`close` marks an owner that is shutting down: what is still queued or fails
afterwards (another thread answering a last message while the transport
closes) is dropped with a DEBUG line instead of an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import NamedTuple, Protocol

from ursa.protocol.transport import Transport, TransportError

__all__ = ["CommitGate", "Outbox", "Outgoing"]

logger = logging.getLogger("ursa.protocol.outbox")


class Outgoing(NamedTuple):
    """One queued publish."""

    topic: str
    payload: bytes
    qos: int
    retain: bool = False


class CommitGate(Protocol):
    """What an outbox waits on before it publishes (`Outbox.wait_for`)."""

    def position(self) -> int:
        """The owner's write position now (an item queued now waits for it)."""
        ...

    def commit_through(self, position: int) -> bool:
        """Commit every write up to ``position``; False if not possible now."""
        ...


class Outbox:
    """Thread-safe FIFO of publishes, flushed outside the caller's locks."""

    def __init__(self, owner: str) -> None:
        """`owner` names the sender in log lines."""
        self._owner = owner
        self._items: deque[tuple[Outgoing, int]] = deque()
        self._lock = threading.Lock()
        self._flushing = False
        self._closed = False
        self._gate: CommitGate | None = None

    def wait_for(self, gate: CommitGate) -> None:
        """From now on, publish an item only once `gate` committed what preceded it."""
        self._gate = gate

    def _position(self) -> int:
        gate = self._gate
        return 0 if gate is None else gate.position()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def put(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> None:
        """Queue one publish."""
        position = self._position()
        with self._lock:
            self._items.append((Outgoing(topic, payload, qos, retain), position))

    def put_item(self, item: Outgoing) -> None:
        """Queue a publish made earlier (e.g. a cached reply sent again)."""
        position = self._position()
        with self._lock:
            self._items.append((item, position))

    def close(self) -> None:
        """The owner is shutting down: drop what is queued from now on, quietly."""
        with self._lock:
            self._closed = True
            dropped = len(self._items)
            self._items.clear()
        if dropped:
            logger.debug(
                "%s: %d queued publishes dropped on close", self._owner, dropped
            )

    def drain(self, transport: Transport | None, timeout_s: float) -> bool:
        """Flush, and wait for a flush under way in another thread to finish.

        For an owner about to `close`: what another thread is still sending
        (e.g. the last answers a handler queued) leaves before the close.
        True if the queue is empty and no flush runs.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self.flush(transport)
            with self._lock:
                if not self._items and not self._flushing:
                    return True
            if time.monotonic() >= deadline or transport is None:
                return False
            time.sleep(0.01)

    def flush(self, transport: Transport | None) -> None:
        """Publish everything queued, in order; failed publishes are logged.

        With a gate, each item first waits for the commit of what was written
        before it was queued; where the gate cannot commit now (this thread
        is inside a unit of work), the rest stays queued for a later flush.
        """
        if transport is None:
            return
        with self._lock:
            if self._flushing:
                return
            if self._closed:
                self._items.clear()
                return
            self._flushing = True
        try:
            while True:
                with self._lock:
                    if not self._items:
                        self._flushing = False
                        return
                    item, position = self._items.popleft()
                gate = self._gate
                if gate is not None and not gate.commit_through(position):
                    with self._lock:
                        if not self._closed:
                            self._items.appendleft((item, position))
                        self._flushing = False
                    return
                try:
                    transport.publish(
                        item.topic, item.payload, qos=item.qos, retain=item.retain
                    )
                except TransportError as exc:
                    log = logger.debug if self._closed else logger.error
                    log("%s: publish to %s failed: %s", self._owner, item.topic, exc)
        except BaseException:
            with self._lock:
                self._flushing = False
            raise
