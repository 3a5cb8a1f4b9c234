"""FLICKER's ring as the coordinator relays it: a `Relay` plus the hop checks.

The coordinator relays the ring's sealed hops without opening them. The
persisted `ursa.coordinator.relay.Relay` keeps who holds the running sum, the
chain of relayed hops and the skipped devices (a silent holder's predecessor
re-seals to its new successor; with no chain the first live device starts
again); this module adds what FLICKER's messages must match, so misrouted,
forged or late hops are refused:

* a hop's contributors are the chain plus its sender, its ``hop_index`` is
  their number minus one, its recipient the sender's next live device;
* a result comes from the last live device and carries at least
  `MIN_RING_DEVICES` contributors (a smaller sum would expose a device);
* fewer than `MIN_RING_DEVICES` live devices end the ring (`RingError`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ursa.coordinator.methods.flicker.algorithm import MIN_RING_DEVICES
from ursa.coordinator.phase import PhaseStatus, Record
from ursa.coordinator.relay import Relay
from ursa.protocol.messages import ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["FlickerRing", "RingError"]


class RingError(ValueError):
    """A ring message the relay refuses; ``code`` is an `ErrorCode` value."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _no_turn(holder: str, contributors: tuple[str, ...]) -> None:
    """The engine tells every live device the order itself (`RingStart`)."""


class FlickerRing:
    """One FLICKER ring: its `Relay` and the checks of hops and results."""

    def __init__(self, relay: Relay, skipped: Sequence[str] = ()) -> None:
        self.relay = relay
        self._skipped = list(skipped)

    @classmethod
    def start(
        cls, ring_id: str, order: Sequence[str], now: float, hop_deadline_s: float
    ) -> FlickerRing:
        """A ring whose first device must send within ``hop_deadline_s``.

        Raises:
            RingError: fewer than `MIN_RING_DEVICES` devices, or one twice.
        """
        if len(order) < MIN_RING_DEVICES or len(set(order)) != len(order):
            raise RingError(ErrorCode.MALFORMED, "a ring needs >= 3 distinct devices")
        relay = Relay.open(
            ring_id,
            order,
            now=now,
            hop_timeout_s=hop_deadline_s,
            on_turn=_no_turn,
            min_live=MIN_RING_DEVICES,
        )
        return cls(relay)

    @property
    def ring_id(self) -> str:
        """The ring's id (the run's id)."""
        return self.relay.key

    @property
    def order(self) -> tuple[str, ...]:
        """The ring order as started."""
        return self.relay.order

    @property
    def live(self) -> tuple[str, ...]:
        """The order without the skipped devices."""
        return tuple(d for d in self.relay.order if d not in self.relay.silent)

    @property
    def silent(self) -> tuple[str, ...]:
        """The skipped devices, in the order they were skipped."""
        return tuple(self._skipped)

    def _check(self, ring_id: str, sender: str, contributors: tuple[str, ...]) -> None:
        if ring_id != self.ring_id or not self.relay.is_open:
            raise RingError(ErrorCode.LATE, f"ring {ring_id} is not running")
        if sender != self.relay.holder:
            raise RingError(ErrorCode.LATE, f"{sender} does not hold the ring sum")
        expected = self.relay.contributors()
        if contributors != expected:
            raise RingError(
                ErrorCode.MALFORMED, f"contributors {contributors} != {expected}"
            )

    def accept_hop(
        self,
        ring_id: str,
        sender: str,
        contributors: tuple[str, ...],
        hop_index: int,
        recipient: str,
        now: float,
    ) -> None:
        """Check a hop to relay and hand the sum to its recipient.

        Raises:
            RingError: another ring, not the holder, wrong contributors, hop
                index or recipient.
        """
        self._check(ring_id, sender, contributors)
        if hop_index != len(contributors) - 1:
            raise RingError(ErrorCode.MALFORMED, "hop_index is not contributors - 1")
        successor = self.relay.successor(sender)
        if successor is None or recipient != successor:
            raise RingError(
                ErrorCode.MALFORMED, f"recipient {recipient} is not {successor}"
            )
        self._offer(sender, now)

    def accept_result(
        self, ring_id: str, sender: str, contributors: tuple[str, ...], now: float
    ) -> None:
        """Check the last device's result; the ring is then over.

        Raises:
            RingError: another ring, not the holder, wrong contributors, the
                sender is not last, or fewer than `MIN_RING_DEVICES` of them.
        """
        self._check(ring_id, sender, contributors)
        if self.relay.successor(sender) is not None:
            raise RingError(ErrorCode.MALFORMED, "the sender is not last in the ring")
        if len(contributors) < MIN_RING_DEVICES:
            raise RingError(ErrorCode.MALFORMED, "fewer than 3 contributors")
        self._offer(sender, now)

    def _offer(self, sender: str, now: float) -> None:
        try:
            self.relay.offer(sender, now)
        except RejectedError as exc:  # unreachable: _check saw the holder
            raise RingError(exc.code, exc.reason) from None

    def skip_overdue(self, now: float) -> str | None:
        """Skip a holder silent past its deadline; the skipped device, if any.

        Raises:
            RingError: fewer than `MIN_RING_DEVICES` live devices would remain.
        """
        holder = self.relay.holder
        self.relay.poll(now, _no_turn)
        self._check_live()
        if holder is None or holder not in self.relay.silent:
            return None
        self._skipped.append(holder)
        return holder

    def device_left(self, device: str, now: float) -> bool:
        """A last will; True if ``device`` was skipped (it had not sent its hop).

        A device already in the chain stays: its counts are in the sum.

        Raises:
            RingError: fewer than `MIN_RING_DEVICES` live devices would remain.
        """
        before = set(self.relay.silent)
        self.relay.device_left(device, now, _no_turn)
        self._check_live()
        if device in before or device not in self.relay.silent:
            return False
        self._skipped.append(device)
        return True

    def postpone(self, seconds: float) -> None:
        """Give the holder ``seconds`` more (a broker outage's time)."""
        if self.relay.is_open:
            self.relay.deadline_at += seconds

    def _check_live(self) -> None:
        if self.relay.status is PhaseStatus.FALLBACK:
            left = self.relay.live_count
            reason = f"only {left} live devices left in the ring"
            raise RingError(ErrorCode.LATE, reason)

    def to_record(self) -> Record:
        """The relay's JSON-able record, plus the order of the skips."""
        return {**self.relay.to_record(), "skipped": list(self._skipped)}

    @classmethod
    def from_record(cls, record: Record) -> FlickerRing:
        """Rebuild from `to_record` (a damaged record raises as `Relay`'s does)."""
        skipped = [str(d) for d in record.get("skipped", ())]
        return cls(Relay.from_record(record), skipped)
