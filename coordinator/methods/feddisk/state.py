"""FedDisk's progress on the coordinator, kept in the store's ``method_state``.

What `ursa.coordinator.methods.feddisk.plugin` needs across restarts (phase, MADE
rounds, best and last judged version, the current round's role) as one JSON
value under ``("feddisk", "progress")``, written after every change in the
transaction of the message that caused it. The open loss step and verdict
wait are phase records of their own (`ursa.coordinator.methods.feddisk.judging`).
Its own module so the plugin reads as the phase machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ursa._compat import StrEnum
from ursa.coordinator.store import CoordinatorStore

__all__ = ["FeddiskRoundKind", "FeddiskState", "FeddiskStateError"]

METHOD = "feddisk"
_KEY = "progress"
_FORMAT = 2


class FeddiskStateError(ValueError):
    """Saved progress that cannot be read (the operator must fix or remove it)."""


class FeddiskRoundKind(StrEnum):
    """What the current round does."""

    MADE = "made"
    """Trains the global MADE."""
    LOSS = "loss"
    """Judges the latest MADE version (loss step, then the agent's verdict)."""
    CLASSIFIER = "classifier"
    """Trains the classifier (phase 2)."""


@dataclass
class FeddiskState:
    """FedDisk's progress; `save` after changing a field.

    Without a store (a test's progress, not a service's) it lives in
    memory only.
    """

    made_rounds: int = 0
    best_version: int | None = None
    switch_round: int | None = None
    judged_version: int | None = None
    round: int | None = None
    role: FeddiskRoundKind | None = None
    store: CoordinatorStore | None = field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, store: CoordinatorStore) -> FeddiskState:
        """The saved progress, or a fresh one (phase 1, nothing trained).

        Raises:
            FeddiskStateError: the saved value is not FedDisk's progress.
        """
        try:
            data = store.method_state(METHOD, _KEY)
            if data is None:
                return cls(store=store)
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
            role = data["role"]
            return cls(
                int(data["made_rounds"]),
                _optional_int(data["best_version"]),
                _optional_int(data["switch_round"]),
                _optional_int(data["judged_version"]),
                _optional_int(data["round"]),
                None if role is None else FeddiskRoundKind(role),
                store,
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise FeddiskStateError(f"FedDisk's saved progress: {exc}") from None

    def to_record(self) -> dict[str, Any]:
        """The JSON value saved (``phase`` is for people reading it)."""
        return {
            "format": _FORMAT,
            "phase": "made" if self.switch_round is None else "classifier",
            "made_rounds": self.made_rounds,
            "best_version": self.best_version,
            "switch_round": self.switch_round,
            "judged_version": self.judged_version,
            "round": self.round,
            "role": None if self.role is None else self.role.value,
        }

    def save(self) -> None:
        """Write the progress to the store (if it has one)."""
        if self.store is not None:
            self.store.set_method_state(METHOD, _KEY, self.to_record())

    def enter(self, round_index: int, role: FeddiskRoundKind) -> None:
        """Round ``round_index`` now does ``role``; save."""
        self.round, self.role = round_index, role
        self.save()


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
