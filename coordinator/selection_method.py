"""The contract of a coordinator selection method: who takes part in a round.

A federation has exactly one selection method (``[[methods]]``). Dubhe's
encrypted self-selection is still the runtime's own stage flow
(``roundflow.py``: VOLUNTEERING, DISTRIBUTIONS, AGENT); every other selection
method implements `SelectionMethod` and lives in ``coordinator/methods/<m>/``,
registered in `ursa.coordinator.methods`. The runtime opens the round (the
stored, retained `RoundAnnounce`), then calls `SelectionMethod.select` at
every tick of its SELECTING stage until it names the participants; the
runtime signs and publishes the `SelectionResult`, persists it with the
round, and hands the round to the training method. A method that cannot
decide by the stage's deadline is asked again under a fresh deadline (a
round never starts with fewer than K).

`select` gets a frozen `SelectionRequest` and returns ids: no I/O, no clock,
so a method is a pure function of what the runtime saw, and a restart before
the result was published simply asks again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = ["SelectionMethod", "SelectionRequest"]


@dataclass(frozen=True)
class SelectionRequest:
    """What a selection method may base a round's participants on.

    Attributes:
        round: The round being selected.
        epoch: The key epoch the round runs in.
        k: How many participants the round needs (exactly).
        eligible: Devices registered in this key epoch (they hold its key, which
            CLIMB's and FedDisk's encrypted means need) and online now.
        rng: The coordinator's seeded generator (reproducible draws).
    """

    round: int
    epoch: int
    k: int
    eligible: frozenset[str]
    rng: np.random.Generator


class SelectionMethod(ABC):
    """Chooses a round's participants; the runtime signs and publishes them."""

    name: ClassVar[str]
    """The method's ``[[methods]]`` kind (signed into each key epoch)."""

    @abstractmethod
    def select(self, request: SelectionRequest) -> tuple[str, ...] | None:
        """Exactly ``request.k`` distinct eligible ids, or None to wait a tick."""
