"""The typed message router both runtimes dispatch through.

A handler is registered for one message class and receives that class, so a
handler for the wrong type is a mypy error and dispatch needs no casts. Each
kind has one owner (the runtime, or the method that defines the kind); a
second registration names both owners, which is how two methods claiming the
same kind are caught at start-up instead of one silently shadowing the other.
A kind that several methods share, told apart by its ``purpose`` field (the
secure mean's `MeanReport`), is routed by purpose instead: each purpose has
one owner, and a message of a purpose nobody registered is unhandled.

Handlers signal two outcomes besides success:

- `NotReadyError`: the message needs state that has not arrived yet (messages
  cross topics in any order). The router parks it, the newest per kind, and
  `retry_parked` runs it again after the next state change.
- `RejectedError(code, reason)`: the message is refused. The router lets it
  propagate, because only the runtime knows how to answer (the coordinator
  sends an `ErrorReply`; a device logs it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ursa._compat import StrEnum
from ursa.protocol.messages import BaseMessage

__all__ = ["Dispatch", "NotReadyError", "RejectedError", "Router"]

logger = logging.getLogger("ursa.protocol.router")

M = TypeVar("M", bound=BaseMessage)

MAX_RETRY_PASSES = 64
"""Bound on retry passes: each pass must consume a parked message to go on."""


class NotReadyError(Exception):
    """The handler needs something not known yet: park the message, retry later."""


class RejectedError(Exception):
    """A refused message: an error code (usually an `ErrorCode`) and a reason."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class Dispatch(StrEnum):
    """What `Router.dispatch` did with a message."""

    HANDLED = "handled"
    PARKED = "parked"
    UNHANDLED = "unhandled"


@dataclass(frozen=True)
class _Route:
    owner: str
    call: Callable[[BaseMessage], None]


def _bind(
    message_type: type[M], handler: Callable[[M], None]
) -> Callable[[BaseMessage], None]:
    def call(message: BaseMessage) -> None:
        if not isinstance(message, message_type):  # the table is keyed by type
            raise TypeError(f"{type(message).__name__} routed to {message_type}")
        handler(message)

    return call


_Key = tuple[type[BaseMessage], str | None]


class Router:
    """Message class (and purpose) -> handler, with parking of early messages.

    Args:
        name: Who dispatches (a device id or "coordinator"), for log lines.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._routes: dict[_Key, _Route] = {}
        self._by_purpose: set[type[BaseMessage]] = set()
        self._parked: dict[_Key, BaseMessage] = {}

    def register(
        self,
        message_type: type[M],
        handler: Callable[[M], None],
        *,
        owner: str,
        purpose: str | None = None,
    ) -> None:
        """Route `message_type` (of one ``purpose``) to `handler`; one owner each.

        Raises:
            ValueError: the kind (or the kind's purpose) is already registered,
                or the kind is routed both whole and by purpose (the error
                names both owners).
        """
        key: _Key = (message_type, purpose)
        existing = self._routes.get(key) or self._routes.get(
            (message_type, None) if purpose is not None else key
        )
        if existing is None and purpose is None and message_type in self._by_purpose:
            existing = next(
                route
                for (kind, _), route in self._routes.items()
                if kind is message_type
            )
        if existing is not None:
            what = message_type.__name__
            if purpose is not None:
                what += f" of purpose {purpose!r}"
            raise ValueError(
                f"{what} is handled by {existing.owner!r}; "
                f"{owner!r} cannot register it too"
            )
        if purpose is not None:
            self._by_purpose.add(message_type)
        self._routes[key] = _Route(owner, _bind(message_type, handler))

    def handles(self, message_type: type[BaseMessage]) -> bool:
        """Whether a handler is registered for `message_type` (of any purpose)."""
        return any(kind is message_type for kind, _ in self._routes)

    def owner(
        self, message_type: type[BaseMessage], purpose: str | None = None
    ) -> str | None:
        """Who registered `message_type` (of ``purpose``), if anyone."""
        route = self._routes.get((message_type, purpose))
        return None if route is None else route.owner

    def is_parked(self, message_type: type[BaseMessage]) -> bool:
        """Whether a message of `message_type` waits for a state change."""
        return any(kind is message_type for kind, _ in self._parked)

    def _key(self, message: BaseMessage) -> _Key:
        kind = type(message)
        if kind not in self._by_purpose:
            return (kind, None)
        purpose = getattr(message, "purpose", None)
        return (kind, purpose if isinstance(purpose, str) else None)

    def dispatch(self, message: BaseMessage) -> Dispatch:
        """Run the handler of `message`'s class.

        Returns HANDLED, PARKED (the handler raised `NotReadyError`; a newer message
        of the same kind and purpose replaces a parked one) or UNHANDLED (no handler).
        `RejectedError` and any other exception propagate to the runtime.
        """
        key = self._key(message)
        route = self._routes.get(key)
        if route is None:
            return Dispatch.UNHANDLED
        try:
            route.call(message)
        except NotReadyError:
            self._parked[key] = message
            return Dispatch.PARKED
        return Dispatch.HANDLED

    def retry_parked(self, on_error: Callable[[BaseMessage, Exception], None]) -> int:
        """Retry parked messages until a pass consumes none; returns how many ran.

        `on_error` gets a retried message's `RejectedError` or other exception
        (the message is dropped: retrying it would fail the same way).
        """
        handled = 0
        for _ in range(MAX_RETRY_PASSES):
            progress = False
            for key, message in list(self._parked.items()):
                del self._parked[key]
                try:
                    outcome = self.dispatch(message)
                except Exception as exc:  # reported to the runtime, which logs it
                    on_error(message, exc)
                    progress = True
                    continue
                if outcome is Dispatch.HANDLED:
                    handled += 1
                    progress = True
            if not progress or not self._parked:
                break
        return handled

    def clear_parked(self) -> None:
        """Forget every parked message (e.g. when a device stops)."""
        self._parked.clear()
