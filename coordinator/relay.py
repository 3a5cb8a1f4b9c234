"""Relay: a token passed along an ordered ring of devices, skipping the silent.

FLICKER's ring is this shape (each device adds to a sealed running sum and
hands it to the next); the coordinator only relays and keeps order::

    holder = order[0]            -> on_turn(holder, (holder,))
    offer(holder)                -> the hop goes to the next live device
    [the holder is silent past hop_timeout_s, or its last will says offline]
    skip                         -> the holder is marked silent; the device
                                    that handed it the token holds it again and
                                    must resend to its new successor (the same
                                    contributors); with no chain, the first
                                    live device starts again
    offer(last live device)      -> DONE (its hop is the result)
    fewer than min_live left     -> FALLBACK

The chain (devices whose hop was relayed) and the silent set are kept per
event; a successor is found by position, skipping only silent devices. No
I/O: whoever must send next is told through ``on_turn``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ursa.coordinator.phase import PhaseStatus, Record, check_record
from ursa.protocol.messages import ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["OnTurn", "Relay"]

OnTurn = Callable[[str, tuple[str, ...]], None]
"""``on_turn(holder, contributors)``: tell ``holder`` it must send now, with
``contributors`` in its hop (itself included)."""

_KIND = "relay"


@dataclass(eq=False)
class Relay:
    """Who holds the token of one ring, who was skipped, the holder's deadline."""

    key: str
    order: tuple[str, ...]
    hop_timeout_s: float
    deadline_at: float
    min_live: int
    holder: str | None
    chain: list[str] = field(default_factory=list)
    silent: set[str] = field(default_factory=set)
    status: PhaseStatus = PhaseStatus.OPEN
    _position: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        """Index the order once (successors are found by position)."""
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"{self.key}: a device appears twice in the ring")
        self._position = {device: i for i, device in enumerate(self.order)}

    @classmethod
    def open(
        cls,
        key: str,
        order: Sequence[str],
        *,
        now: float,
        hop_timeout_s: float,
        on_turn: OnTurn,
        min_live: int = 1,
    ) -> Relay:
        """Start the ring at its first device.

        Raises:
            ValueError: fewer than ``min_live`` (or no) devices, a repeated
                device, or a non-positive timeout.
        """
        if hop_timeout_s <= 0 or min_live < 1 or len(order) < min_live:
            raise ValueError(f"{key}: needs >= {max(min_live, 1)} devices, timeout > 0")
        ring = tuple(order)
        relay = cls(key, ring, hop_timeout_s, now + hop_timeout_s, min_live, ring[0])
        on_turn(ring[0], relay.contributors())
        return relay

    # --- view -------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether hops are still taken."""
        return self.status is PhaseStatus.OPEN

    @property
    def live_count(self) -> int:
        """Devices of the ring not skipped."""
        return len(self.order) - len(self.silent)

    def successor(self, device: str) -> str | None:
        """The next live device after ``device``; None: ``device`` is last."""
        for nxt in self.order[self._position[device] + 1 :]:
            if nxt not in self.silent:
                return nxt
        return None

    def contributors(self) -> tuple[str, ...]:
        """Who the holder's next hop must carry (itself included)."""
        if self.holder is None:
            return tuple(self.chain)
        if self.chain and self.chain[-1] == self.holder:
            return tuple(self.chain)  # it resends what it sent before
        return (*self.chain, self.holder)

    # --- events -----------------------------------------------------------------

    def offer(self, device: str, now: float) -> str | None:
        """Relay the holder's hop; its recipient, or None when the ring is done.

        Raises:
            RejectedError: the ring is over, or ``device`` does not hold the
                token (``late``: its turn passed or has not come).
        """
        if not self.is_open:
            raise RejectedError(ErrorCode.LATE, f"{self.key} is over")
        if device != self.holder:
            raise RejectedError(ErrorCode.LATE, f"{device} does not hold {self.key}")
        if not (self.chain and self.chain[-1] == device):
            self.chain.append(device)
        recipient = self.successor(device)
        self.holder = recipient
        if recipient is None:
            self.status = PhaseStatus.DONE
        else:
            self.deadline_at = now + self.hop_timeout_s
        return recipient

    def poll(self, now: float, on_turn: OnTurn) -> PhaseStatus:
        """Skip a holder silent past its deadline; the status after that."""
        if self.is_open and now >= self.deadline_at and self.holder is not None:
            self._skip(self.holder, now, on_turn)
        return self.status

    def device_left(self, device: str, now: float, on_turn: OnTurn) -> None:
        """A last will: skip ``device`` now if it holds the token, else when reached.

        A device already in the chain stays there: its part is in the sum.
        """
        if not self.is_open or device not in self._position or device in self.chain:
            return
        if device == self.holder:
            self._skip(device, now, on_turn)
            return
        self.silent.add(device)
        self._fall_back_if_too_few()

    def restarted(self, now: float, on_turn: OnTurn) -> None:
        """After a coordinator restart: a fresh deadline; tell the holder again."""
        if self.is_open and self.holder is not None:
            self.deadline_at = now + self.hop_timeout_s
            on_turn(self.holder, self.contributors())

    def _skip(self, device: str, now: float, on_turn: OnTurn) -> None:
        self.silent.add(device)
        if self.chain and self.chain[-1] == device:
            self.chain.pop()  # it never resent: its sum is lost
        if self._fall_back_if_too_few():
            return
        self.holder = self.chain[-1] if self.chain else self._first_live()
        self.deadline_at = now + self.hop_timeout_s
        on_turn(self.holder, self.contributors())

    def _first_live(self) -> str:
        return next(d for d in self.order if d not in self.silent)

    def _fall_back_if_too_few(self) -> bool:
        if self.live_count >= self.min_live:
            return False
        self.status = PhaseStatus.FALLBACK
        self.holder = None
        return True

    # --- records ----------------------------------------------------------------

    def to_record(self) -> Record:
        """The JSON-able record of the ring."""
        return {
            "kind": _KIND,
            "key": self.key,
            "order": list(self.order),
            "hop_timeout_s": self.hop_timeout_s,
            "deadline_at": self.deadline_at,
            "min_live": self.min_live,
            "holder": self.holder,
            "chain": list(self.chain),
            "silent": [d for d in self.order if d in self.silent],
            "status": self.status.value,
        }

    @classmethod
    def from_record(cls, record: Record) -> Relay:
        """Rebuild a ring from `to_record` (after ``json.loads``).

        Raises:
            PhaseRecordError: not a relay record.
            KeyError, TypeError, ValueError: a damaged record.
        """
        check_record(record, _KIND)
        holder = record["holder"]
        return cls(
            str(record["key"]),
            tuple(str(d) for d in record["order"]),
            float(record["hop_timeout_s"]),
            float(record["deadline_at"]),
            int(record["min_live"]),
            None if holder is None else str(holder),
            [str(d) for d in record["chain"]],
            {str(d) for d in record["silent"]},
            PhaseStatus(record["status"]),
        )
