"""`StartupHold`: what arrives while the coordinator restores its stage, capped.

Until the current stage is restored, messages are held, not judged (an update
queued in the broker during a restart must not be refused as late). The
broker's backlog is bounded by its per-session queue (``max_queued_bytes``),
but a flood at start-up must not grow memory without end, nor may one
device's backlog crowd out the others': the hold is capped in messages, in
bytes, and in bytes per sender. Beyond a cap a message is dropped (counted)
like one the network lost; the coordinator's re-published requests and the
devices' retransmissions bring back what matters. Each held message has
already taken its token from the sender's admission bucket (the caller
charges it), so a held message is not charged again when it is replayed.
Pure: no clock, no I/O, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MAX_HELD",
    "MAX_HELD_BYTES",
    "MAX_HELD_SENDER_BYTES",
    "StartupHold",
]

MAX_HELD = 10_000
"""Messages held at most (as the admission burst)."""
MAX_HELD_BYTES = 256 * 1024 * 1024
"""Bytes held at most, from every sender together."""
MAX_HELD_SENDER_BYTES = 16 * 1024 * 1024
"""Bytes held at most from one sender: 64 model chunks of 256 KiB; the rest
of an honest upload is asked again once its round is open."""


@dataclass
class StartupHold:
    """The held messages, in arrival order, and what was dropped."""

    max_messages: int = MAX_HELD
    max_bytes: int = MAX_HELD_BYTES
    max_sender_bytes: int = MAX_HELD_SENDER_BYTES
    dropped: int = 0
    """Messages dropped over a cap."""
    dropped_bytes: int = 0
    _held: list[tuple[str, bytes]] = field(default_factory=list)
    _bytes: int = 0
    _by_sender: dict[str, int] = field(default_factory=dict)

    @property
    def held_bytes(self) -> int:
        """Payload bytes held now."""
        return self._bytes

    def offer(self, sender: str, topic: str, payload: bytes) -> bool:
        """Hold a message of ``sender`` (``""``: no device); False if dropped."""
        size = len(payload)
        mine = self._by_sender.get(sender, 0) + size
        if (
            len(self._held) >= self.max_messages
            or self._bytes + size > self.max_bytes
            or mine > self.max_sender_bytes
        ):
            self.drop(size)
            return False
        self._held.append((topic, payload))
        self._bytes += size
        self._by_sender[sender] = mine
        return True

    def drop(self, size: int) -> None:
        """Count a message of ``size`` bytes dropped before it was offered."""
        self.dropped += 1
        self.dropped_bytes += size

    def take(self) -> list[tuple[str, bytes]]:
        """Every held message, oldest first; the hold is empty afterwards."""
        held, self._held = self._held, []
        self._bytes = 0
        self._by_sender.clear()
        return held
