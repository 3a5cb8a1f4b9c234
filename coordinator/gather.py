"""Gather: ask every expected device once, fold the replies, close, answer all.

The shape shared by CLIMB's dual step, FedDisk's MADE loss step and any
encrypted mean (`ursa.coordinator.secure_mean`)::

    open      -> fold.request() to all
    offer     -> refused (typed `RejectedError`), a duplicate (ignored), or
                 folded into the state
    [every expected device answered or left (last will), or the deadline]
    close     -> fold.result(state) to all if at least ``min_replies`` answered
                 (`PhaseStatus.DONE`), else nothing (`PhaseStatus.FALLBACK`)

What is method-specific (the messages, the checks, the state and how it is
saved) is a `Fold`, so the gather itself stays generic and JSON-able. The
devices still owed a reply are kept as a set updated per event, so a reply or
a last will costs O(1), not a pass over the fleet. No I/O: sending goes
through the ``send`` callback, the time is passed in, and `save_gather`
writes through the store it is given: the whole record when the gather opens
or closes, one row per reply between (O(1), not every answered id again).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.device_sets import OnlineDevices
from ursa.coordinator.phase import PhaseStatus, Record, check_record
from ursa.coordinator.plugin import Send
from ursa.protocol.messages import BaseMessage, ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["Fold", "Gather", "GatherStore", "save_gather"]

ReplyT = TypeVar("ReplyT", bound=BaseMessage)
StateT = TypeVar("StateT")

_KIND = "gather"


class Fold(ABC, Generic[ReplyT, StateT]):
    """What a gather asks, how it folds a reply, what it answers (pure)."""

    @abstractmethod
    def request(self) -> BaseMessage:
        """The request every expected device answers (fresh id at every call)."""

    @abstractmethod
    def initial(self) -> StateT:
        """The state before any reply."""

    @abstractmethod
    def check(self, reply: ReplyT) -> None:
        """Refuse a reply whoever sent it (another epoch, another version).

        Raises:
            RejectedError: with the `ErrorReply` code.
        """

    @abstractmethod
    def apply(self, state: StateT, device: str, reply: ReplyT) -> StateT:
        """Fold a first reply of an expected device into the state.

        Raises:
            RejectedError: the reply's content is unusable.
        """

    @abstractmethod
    def result(self, state: StateT) -> BaseMessage | None:
        """What to send to all when the gather closes (None: nothing)."""

    def requests(self) -> Iterable[tuple[BaseMessage, str | None]]:
        """What the gather sends when it opens: (message, device or None: all).

        Default: `request` to all. A fold whose request differs per device
        (secure aggregation's rosters) overrides this instead.
        """
        return ((self.request(), None),)

    def results(self, state: StateT) -> Iterable[tuple[BaseMessage, str | None]]:
        """What the gather sends when it closes done (default: `result` to all)."""
        result = self.result(state)
        return () if result is None else ((result, None),)

    @abstractmethod
    def dump(self, state: StateT) -> Any:
        """The state as JSON-able data."""

    @abstractmethod
    def load(self, data: Any, answered: frozenset[str]) -> StateT:
        """The state `dump` saved, with the devices folded into it.

        Raises:
            ValueError: ``data`` is not this fold's state (another round,
                epoch or key): the owner opens a new gather instead.
        """


@dataclass(eq=False)
class Gather(Generic[ReplyT, StateT]):
    """One request to the expected devices and their folded replies."""

    key: str
    fold: Fold[ReplyT, StateT]
    state: StateT
    expected: frozenset[str]
    timeout_s: float
    deadline_at: float
    min_replies: int = 1
    answered: set[str] = field(default_factory=set)
    absent: set[str] = field(default_factory=set)
    """Expected devices not waited for: their last will said offline."""
    status: PhaseStatus = PhaseStatus.OPEN
    _pending: set[str] = field(default_factory=set, repr=False)
    _expected_ids: list[str] = field(default_factory=list, repr=False)
    _seen: int | None = field(default=None, repr=False)
    """The `OnlineDevices.version` last followed (None: scan next time)."""

    def __post_init__(self) -> None:
        """Derive the devices still owed a reply (once; then kept per event)."""
        self._pending = set(self.expected) - self.answered - self.absent
        self._expected_ids = sorted(self.expected)  # for every record, sorted once

    def extend(self, seconds: float) -> None:
        """Wait ``seconds`` longer if still open (a broker outage ate them)."""
        if self.is_open and seconds > 0:
            self.deadline_at += seconds

    @classmethod
    def open(
        cls,
        key: str,
        fold: Fold[ReplyT, StateT],
        *,
        expected: Iterable[str],
        online: Set[str],
        now: float,
        timeout_s: float,
        send: Send,
        min_replies: int = 1,
    ) -> Gather[ReplyT, StateT]:
        """Send the request and wait for the expected devices that are online.

        Closes at once when none of them is online.
        """
        if min_replies < 0 or timeout_s <= 0:
            raise ValueError("min_replies must be >= 0 and timeout_s > 0")
        wanted = frozenset(expected)
        gather = cls(
            key,
            fold,
            fold.initial(),
            wanted,
            timeout_s,
            now + timeout_s,
            min_replies,
            absent={d for d in wanted if d not in online},
        )
        for message, device in fold.requests():
            send(message, device)
        gather._close_if_answered(send)
        return gather

    # --- view -------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether replies are still taken."""
        return self.status is PhaseStatus.OPEN

    @property
    def pending(self) -> frozenset[str]:
        """Expected online devices whose reply has not arrived."""
        return frozenset(self._pending)

    # --- events -----------------------------------------------------------------

    def offer(self, device: str, reply: ReplyT, send: Send) -> UpdateOutcome:
        """Fold a device's reply; close when it was the last one owed.

        Raises:
            RejectedError: the gather is closed (``late``), the fold refuses
                the reply, or the device was not asked (``unauthorised``).
        """
        if not self.is_open:
            raise RejectedError(ErrorCode.LATE, f"{self.key} is closed")
        self.fold.check(reply)
        if device not in self.expected:
            raise RejectedError(ErrorCode.UNAUTHORISED, f"{self.key} did not ask it")
        if device in self.answered:
            return UpdateOutcome.DUPLICATE
        self.state = self.fold.apply(self.state, device, reply)
        self.answered.add(device)
        self.absent.discard(device)
        self._pending.discard(device)
        self._close_if_answered(send)
        return UpdateOutcome.ACCEPTED

    def device_left(self, device: str, send: Send) -> None:
        """A last will: stop waiting for ``device`` (close if nobody else is owed)."""
        if self.is_open and device in self._pending:
            self._pending.discard(device)
            self.absent.add(device)
            self._close_if_answered(send)

    def device_returned(self, device: str) -> None:
        """An absent device is online again: wait for it again."""
        if self.is_open and device in self.absent:
            self.absent.discard(device)
            self._pending.add(device)

    def track_online(self, online: Set[str], send: Send) -> None:
        """Apply the devices that left or came back since the last call.

        The service's `OnlineDevices` says which devices changed since the
        last call: O(changes), so a tick or a message costs O(1) even while
        thousands are owed a reply. Any other set is scanned.
        """
        changed: Iterable[str] | None = None
        if isinstance(online, OnlineDevices):
            self._seen, changed = online.changes_since(self._seen)
        if changed is None:
            returned = [d for d in self.absent if d in online]
            left = [d for d in self._pending if d not in online]
        else:
            returned = [d for d in changed if d in self.absent and d in online]
            left = [d for d in changed if d in self._pending and d not in online]
        for device in returned:
            self.device_returned(device)
        for device in left:
            self.device_left(device, send)

    def poll(self, now: float, send: Send) -> PhaseStatus:
        """Close at the deadline; the status after that."""
        if self.is_open and now >= self.deadline_at:
            self._close(send)
        return self.status

    def republish(self, send: Send) -> None:
        """Send again what the devices wait on: the request, or the result."""
        if self.is_open:
            for message, device in self.fold.requests():
                send(message, device)
        elif self.status is PhaseStatus.DONE:
            for message, device in self.fold.results(self.state):
                send(message, device)

    def restarted(self, now: float, send: Send) -> None:
        """After a coordinator restart: a fresh deadline, then `republish`.

        Devices may have missed the request while the coordinator was down.
        """
        if self.is_open:
            self.deadline_at = now + self.timeout_s
        self.republish(send)

    def _close_if_answered(self, send: Send) -> None:
        if self.is_open and not self._pending:
            self._close(send)

    def _close(self, send: Send) -> None:
        if len(self.answered) < self.min_replies:
            self.status = PhaseStatus.FALLBACK
            return
        self.status = PhaseStatus.DONE
        for message, device in self.fold.results(self.state):
            send(message, device)

    # --- records ----------------------------------------------------------------

    def progress(self) -> Record:
        """The record's fields a reply changes (the rest is saved at open and close)."""
        return {
            "deadline_at": self.deadline_at,
            "status": self.status.value,
            "state": self.fold.dump(self.state),
        }

    def to_record(self) -> Record:
        """The JSON-able record of the gather (the fold's state via `Fold.dump`)."""
        return {
            "kind": _KIND,
            "key": self.key,
            "expected": self._expected_ids,
            "answered": sorted(self.answered),
            "absent": sorted(self.absent),
            "timeout_s": self.timeout_s,
            "deadline_at": self.deadline_at,
            "min_replies": self.min_replies,
            "status": self.status.value,
            "state": self.fold.dump(self.state),
        }

    @classmethod
    def from_record(
        cls, record: Record, fold: Fold[ReplyT, StateT]
    ) -> Gather[ReplyT, StateT]:
        """Rebuild a gather from `to_record` (after ``json.loads``).

        Raises:
            PhaseRecordError: not a gather record.
            KeyError, TypeError, ValueError: a damaged record, or a state the
                fold does not accept (`Fold.load`).
        """
        check_record(record, _KIND)
        answered = {str(d) for d in record["answered"]}
        return cls(
            str(record["key"]),
            fold,
            fold.load(record["state"], frozenset(answered)),
            frozenset(str(d) for d in record["expected"]),
            float(record["timeout_s"]),
            float(record["deadline_at"]),
            int(record["min_replies"]),
            answered,
            {str(d) for d in record["absent"]},
            PhaseStatus(record["status"]),
        )


class GatherStore(Protocol):
    """Where gathers are saved (`ursa.coordinator.store.CoordinatorStore`)."""

    def save_phase(self, key: str, round_index: int, record: Record) -> None:
        """Save the whole record."""

    def save_phase_reply(self, key: str, device: str, fields: Record) -> None:
        """Save one reply: its device, and the record's changed ``fields``."""


def save_gather(
    store: GatherStore,
    gather: Gather[Any, Any],
    round_index: int,
    replied: str | None = None,
) -> None:
    """Save ``gather`` after an event; ``replied``: the device whose reply it was.

    A reply to an open gather adds its device's row and the new `progress`
    (O(1)); anything else (open, close, resume) saves the whole record.
    """
    if replied is not None and gather.is_open and replied in gather.answered:
        store.save_phase_reply(gather.key, replied, gather.progress())
    else:
        store.save_phase(gather.key, round_index, gather.to_record())
