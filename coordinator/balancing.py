"""The balancing stage's method as the runtime sees it (FLICKER's coordinator half).

The method table builds it with the runtime's `MethodContext`
(`ursa.coordinator.methods.registry`), as it builds the selection method;
the key epoch runs it between enrolment and the first key epoch, the inbox
hands it downloads and departures, the restart restores and resumes it and
a broker outage extends its deadlines, each through this protocol, so none
of them imports a method.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any, Protocol

from ursa.protocol.messages import ChunkRequest
from ursa.protocol.router import Router

__all__ = ["Balancing"]


class Balancing(Protocol):
    """What the runtime asks of the method that balances the fleet first."""

    def register(self, router: Router) -> None:
        """Route its device messages to it."""
        ...

    def restore(self) -> None:
        """Read its saved run back (the service started: the store is open)."""
        ...

    def extend_deadlines(self, seconds: float) -> None:
        """A broker outage: move every open deadline ``seconds`` later."""
        ...

    def summary(self) -> dict[str, Any]:
        """Its run's figures (status, the demo's report)."""
        ...

    @property
    def is_over(self) -> bool:
        """Whether its run ended (then the first key epoch starts)."""
        ...

    def step(self, now: float, online: Set[str]) -> bool:
        """Act on the online devices and deadlines; True: over."""
        ...

    def resume(self) -> None:
        """After a restart: re-send what the restored run waits on."""
        ...

    def device_left(self, device: str) -> None:
        """A device's last will."""
        ...

    def answers(self, request: ChunkRequest) -> bool:
        """Answer a chunk request of its own; False: not its (a model's)."""
        ...
