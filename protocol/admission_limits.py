"""Per-sender admission limits, pure: a token bucket and a size cap per sender.

Both sides judge every incoming message here *before* decoding it, so a flood
from one device's credentials costs a dictionary look-up per message, not a
msgpack parse, a pydantic validation, a signature check or a store query.
Each message takes one token from its sender's bucket (refilled at
`AdmissionLimits.messages_per_s` up to `AdmissionLimits.burst`); a message
with no token left is dropped as `DropReason.RATE`, and one that takes a token
but is longer than ``max_message_bytes`` as `DropReason.OVERSIZE`.

Drops are counted per sender and per reason. So that a flood cannot flood the
log either, a `Verdict` asks the caller to log only the first drop of a sender
in each `LOG_INTERVAL_S` window, with the number dropped since the last line.

No clock and no I/O: the caller passes the time (seconds, any monotonic
origin). At most `MAX_TRACKED_SENDERS` buckets are kept; the least recently
seen goes first (a bucket forgotten is a full one, so only a sender idle
while that many others spoke can gain from it).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from ursa.protocol.messages import MAX_DEVICES

__all__ = [
    "DEFAULT_BURST",
    "DEFAULT_MESSAGES_PER_S",
    "LOG_INTERVAL_S",
    "MAX_TRACKED_SENDERS",
    "AdmissionLimiter",
    "AdmissionLimits",
    "AdmissionStats",
    "DropReason",
    "Verdict",
]

DEFAULT_MESSAGES_PER_S = 100.0
"""Sustained messages per second per sender. A device sends tens of messages
in a round; a model upload in 256 KiB chunks at this rate is 25 MiB/s, more
than a Raspberry Pi's Wi-Fi carries, so uploads are bounded by the link."""
DEFAULT_BURST = MAX_DEVICES
"""Messages a sender may send at once. A key epoch's agent sends one
`sealed_keys` per page of recipients (`SEAL_PAGE_SIZE`), a few pages at a
time, so its boxes stay far below this at any fleet size; a broker's backlog
after an outage (Mosquitto queues 1000 messages per session by default) and
a model upload of up to 2.4 GiB in 256 KiB chunks fit."""
LOG_INTERVAL_S = 10.0
"""A sender's drops are logged at most once per this many seconds."""
MAX_TRACKED_SENDERS = 4 * MAX_DEVICES
"""Buckets kept at once (least recently seen forgotten first)."""


class AdmissionLimits(BaseModel):
    """Per-sender rate limit of one side's admission (a config section).

    The size cap is the side's ``max_message_bytes`` (a top-level field of
    the coordinator's and the device's config), passed to `AdmissionLimiter`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    messages_per_s: float = Field(default=DEFAULT_MESSAGES_PER_S, gt=0)
    """Sustained rate: tokens added to a sender's bucket per second."""
    burst: int = Field(default=DEFAULT_BURST, ge=1)
    """Bucket size: messages a sender may send at once after a quiet spell."""


class DropReason(enum.Enum):
    """Why admission dropped a message before decoding it."""

    RATE = "rate"
    """The sender's bucket was empty."""
    OVERSIZE = "oversize"
    """Longer than ``max_message_bytes``."""


@dataclass(frozen=True)
class Verdict:
    """What `AdmissionLimiter.admit` decided about one message.

    Attributes:
        reason: None when the message may be decoded, else why it was dropped.
        should_log: the caller should log this drop (the sender's first in
            its `LOG_INTERVAL_S` window); False for an admitted message.
        dropped_since_log: drops of this sender since its last logged one,
            this one included (the count to put in the log line).
    """

    reason: DropReason | None
    should_log: bool = False
    dropped_since_log: int = 0

    @property
    def is_admitted(self) -> bool:
        """The message passed the limits."""
        return self.reason is None


@dataclass(frozen=True)
class AdmissionStats:
    """Counts since the limiter was made (for tests and metrics).

    Attributes:
        admitted: messages that passed the limits.
        dropped: drops per reason (every reason present, 0 when none).
        dropped_by_sender: drops per sender and reason, for senders that have
            dropped anything (as long as their bucket is tracked).
    """

    admitted: int
    dropped: Mapping[DropReason, int]
    dropped_by_sender: Mapping[str, Mapping[DropReason, int]]

    def total_dropped(self) -> int:
        """Drops of every reason together."""
        return sum(self.dropped.values())


@dataclass
class _Bucket:
    tokens: float
    updated_at: float
    logged_at: float | None = None
    unlogged: int = 0
    dropped: dict[DropReason, int] = field(default_factory=dict)


class AdmissionLimiter:
    """Token buckets per sender plus a size cap; judges messages before decode.

    Not thread-safe: both services call it under their own lock.
    """

    def __init__(self, limits: AdmissionLimits, *, max_message_bytes: int) -> None:
        if max_message_bytes < 1:
            raise ValueError("max_message_bytes must be positive")
        self._limits = limits
        self._max_message_bytes = max_message_bytes
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._admitted = 0
        self._dropped = dict.fromkeys(DropReason, 0)

    @property
    def limits(self) -> AdmissionLimits:
        """The rate limits in force."""
        return self._limits

    @property
    def max_message_bytes(self) -> int:
        """The size cap in force."""
        return self._max_message_bytes

    def admit(self, sender: str, size: int, now: float) -> Verdict:
        """Judge one message of ``size`` bytes from ``sender`` at time ``now``."""
        bucket = self._bucket(sender, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            if size <= self._max_message_bytes:
                self._admitted += 1
                return Verdict(None)
            return self._drop(bucket, DropReason.OVERSIZE, now)
        return self._drop(bucket, DropReason.RATE, now)

    def stats(self) -> AdmissionStats:
        """A snapshot of the counts."""
        by_sender = {
            sender: dict(bucket.dropped)
            for sender, bucket in self._buckets.items()
            if bucket.dropped
        }
        return AdmissionStats(self._admitted, dict(self._dropped), by_sender)

    def unlogged(self) -> dict[str, int]:
        """Drops per sender not yet in a log line, then none (for a last line)."""
        out = {s: b.unlogged for s, b in self._buckets.items() if b.unlogged}
        for sender in out:
            self._buckets[sender].unlogged = 0
        return out

    def _bucket(self, sender: str, now: float) -> _Bucket:
        limits = self._limits
        bucket = self._buckets.get(sender)
        if bucket is None:
            bucket = _Bucket(tokens=float(limits.burst), updated_at=now)
            self._buckets[sender] = bucket
            while len(self._buckets) > MAX_TRACKED_SENDERS:
                self._buckets.popitem(last=False)
            return bucket
        self._buckets.move_to_end(sender)
        elapsed = max(0.0, now - bucket.updated_at)  # a clock that steps back
        bucket.tokens = min(
            float(limits.burst), bucket.tokens + elapsed * limits.messages_per_s
        )
        bucket.updated_at = max(now, bucket.updated_at)
        return bucket

    def _drop(self, bucket: _Bucket, reason: DropReason, now: float) -> Verdict:
        self._dropped[reason] += 1
        bucket.dropped[reason] = bucket.dropped.get(reason, 0) + 1
        bucket.unlogged += 1
        if bucket.logged_at is not None and now - bucket.logged_at < LOG_INTERVAL_S:
            return Verdict(reason)
        count, bucket.unlogged, bucket.logged_at = bucket.unlogged, 0, now
        return Verdict(reason, should_log=True, dropped_since_log=count)
