"""FedDisk's progress on the coordinator, kept in ``<state_dir>/feddisk.json``.

What `ursa.coordinator.feddisk_plugin` needs across restarts (phase, MADE
rounds, best and last judged version, the current round's role and its open
loss step as a `ursa.coordinator.feddisk_steps.MadeLossStep` record), written
atomically after every change; its own module so the plugin reads as the
phase machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ursa._compat import StrEnum
from ursa.coordinator.models import write_atomic

__all__ = ["STATE_FILE", "FeddiskState", "FeddiskStateError", "Role"]

STATE_FILE = "feddisk.json"
_FORMAT = 1


class FeddiskStateError(ValueError):
    """A ``feddisk.json`` that cannot be read (the operator must fix or remove it)."""


class Role(StrEnum):
    """What the current round does."""

    MADE = "made"
    """Trains the global MADE."""
    LOSS = "loss"
    """Judges the latest MADE version (loss step, then the agent's verdict)."""
    CLASSIFIER = "classifier"
    """Trains the classifier (phase 2)."""


@dataclass
class FeddiskState:
    """FedDisk's progress on the coordinator; `save` after changing a field."""

    state_dir: Path
    made_rounds: int = 0
    best_version: int | None = None
    switch_round: int | None = None
    judged_version: int | None = None
    round: int | None = None
    role: Role | None = None
    loss_step: dict[str, Any] | None = None

    @classmethod
    def load(cls, state_dir: Path) -> FeddiskState:
        """The saved state, or a fresh one (phase 1, nothing trained).

        Raises:
            FeddiskStateError: the file is unreadable or not a FedDisk state.
        """
        path = state_dir / STATE_FILE
        if not path.exists():
            return cls(state_dir)
        try:
            data = json.loads(path.read_text())
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
            role = data["role"]
            return cls(
                state_dir,
                int(data["made_rounds"]),
                _optional_int(data["best_version"]),
                _optional_int(data["switch_round"]),
                _optional_int(data["judged_version"]),
                _optional_int(data["round"]),
                None if role is None else Role(role),
                data["loss_step"],
            )
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise FeddiskStateError(f"{path} is unusable: {exc}") from None

    def to_record(self) -> dict[str, Any]:
        """The JSON document saved (``phase`` is for people reading it)."""
        return {
            "format": _FORMAT,
            "phase": "made" if self.switch_round is None else "classifier",
            "made_rounds": self.made_rounds,
            "best_version": self.best_version,
            "switch_round": self.switch_round,
            "judged_version": self.judged_version,
            "round": self.round,
            "role": None if self.role is None else self.role.value,
            "loss_step": self.loss_step,
        }

    def save(self) -> None:
        """Write the state atomically."""
        data = json.dumps(self.to_record(), indent=1).encode()
        write_atomic(self.state_dir / STATE_FILE, data)

    def enter(
        self, round_index: int, role: Role, loss_step: dict[str, Any] | None
    ) -> None:
        """Round ``round_index`` now does ``role`` (with its open loss step); save."""
        self.round, self.role, self.loss_step = round_index, role, loss_step
        self.save()

    def save_step(self, loss_step: dict[str, Any]) -> None:
        """Checkpoint the open loss step (after each accepted report)."""
        self.loss_step = loss_step
        self.save()


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
