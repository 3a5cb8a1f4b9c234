"""Wait: one device's answer (the agent's signed verdict), or a fallback.

A `Wait` takes exactly one message of type ``ReplyT`` from one device until a
deadline. A message from anyone else is refused (``unauthorised``), one after
the wait closed is ``late``; the owner's ``check`` refuses the content (a bad
signature, another version) before it is accepted. At the deadline the wait
closes as `PhaseStatus.FALLBACK` and the owner applies its fallback (FedDisk:
no verdict, train on). No I/O; the record keeps the accepted answer as its
wire bytes, so a restarted coordinator still has it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ursa.coordinator.phase import PhaseRecordError, PhaseStatus, Record, check_record
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import BaseMessage, ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["Wait"]

ReplyT = TypeVar("ReplyT", bound=BaseMessage)

_KIND = "wait"


@dataclass(eq=False)
class Wait(Generic[ReplyT]):
    """Waiting for ``device``'s one answer until ``deadline_at``."""

    key: str
    device: str
    timeout_s: float
    deadline_at: float
    status: PhaseStatus = PhaseStatus.OPEN
    answer: ReplyT | None = None

    def extend(self, seconds: float) -> None:
        """Wait ``seconds`` longer if still open (a broker outage ate them)."""
        if self.is_open and seconds > 0:
            self.deadline_at += seconds

    @classmethod
    def open(
        cls, key: str, device: str, *, now: float, timeout_s: float
    ) -> Wait[ReplyT]:
        """Wait ``timeout_s`` from ``now`` for ``device``."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        return cls(key, device, timeout_s, now + timeout_s)

    @property
    def is_open(self) -> bool:
        """Whether the answer is still taken."""
        return self.status is PhaseStatus.OPEN

    def offer(
        self,
        device: str,
        reply: ReplyT,
        check: Callable[[ReplyT], None] | None = None,
    ) -> None:
        """Accept the awaited device's answer once ``check`` passes.

        Raises:
            RejectedError: the wait is closed (``late``), another device sent
                it (``unauthorised``), or ``check``'s refusal.
        """
        if not self.is_open:
            raise RejectedError(ErrorCode.LATE, f"{self.key} is closed")
        if device != self.device:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"{self.key} waits for {self.device} only"
            )
        if check is not None:
            check(reply)
        self.answer = reply
        self.status = PhaseStatus.DONE

    def poll(self, now: float) -> PhaseStatus:
        """Fall back at the deadline; the status after that."""
        if self.is_open and now >= self.deadline_at:
            self.status = PhaseStatus.FALLBACK
        return self.status

    def restarted(self, now: float) -> None:
        """After a coordinator restart: a fresh deadline (the device may retry)."""
        if self.is_open:
            self.deadline_at = now + self.timeout_s

    def to_record(self) -> Record:
        """The JSON-able record (the answer as hex wire bytes)."""
        return {
            "kind": _KIND,
            "key": self.key,
            "device": self.device,
            "timeout_s": self.timeout_s,
            "deadline_at": self.deadline_at,
            "status": self.status.value,
            "answer": None if self.answer is None else encode(self.answer).hex(),
        }

    @classmethod
    def from_record(cls, record: Record, reply_type: type[ReplyT]) -> Wait[ReplyT]:
        """Rebuild a wait from `to_record` (after ``json.loads``).

        Raises:
            PhaseRecordError: not a wait record, or its answer is no ``reply_type``.
            KeyError, TypeError, ValueError, ProtocolError: a damaged record.
        """
        check_record(record, _KIND)
        answer: ReplyT | None = None
        if record["answer"] is not None:
            message = decode(bytes.fromhex(record["answer"]))
            if not isinstance(message, reply_type):
                raise PhaseRecordError(f"the answer is no {reply_type.__name__}")
            answer = message
        return cls(
            str(record["key"]),
            str(record["device"]),
            float(record["timeout_s"]),
            float(record["deadline_at"]),
            PhaseStatus(record["status"]),
            answer,
        )
