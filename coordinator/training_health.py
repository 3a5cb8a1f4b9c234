"""Which selected devices keep failing their training, and which sit out for it.

A device that was selected and reported ``training_failed`` (or any other
failure code of its round) twice in a row is *failing*: ``ursa coordinator
status``, the dashboard and ``/metrics`` name it, so an operator learns of a
broken device from the coordinator instead of from the device's log. After
``sit_out_after`` failures in a row it *sits out*: selection skips it, so
its rounds are no longer wasted (the round waits for no one who cannot
train). A round whose sum counts the device's contribution ends its streak.

A device that sits out comes back at the next key epoch, when it registers
again (its own data and model checks passed: a device whose operator fixed
its data or model and restarted it); its streak ends with its first
counted contribution.

The coordinator learns nothing here it did not know: who was selected and
which of them answered a failure code.

Pure state: the runtime calls `failed`, `trained` and `new_epoch` and reads
`failing`; the streaks round-trip through `to_json` for a restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FAILING_AFTER", "HEALTH_KEY", "FailureStreak", "TrainingHealth"]

logger = logging.getLogger("ursa.coordinator")

HEALTH_KEY = "training_health"
"""Store meta key of the devices' failure streaks (`TrainingHealth.to_json`)."""
FAILING_AFTER = 2
"""Failures in a row that make a device *failing* (status, dashboard, metrics)."""


@dataclass(frozen=True)
class FailureStreak:
    """A device's failed rounds in a row: how many, the last round and its code."""

    count: int
    last_round: int
    last_code: str
    sits_out: bool = False


class TrainingHealth:
    """Consecutive training failures per device (see the module docstring).

    Args:
        sit_out_after: failures in a row after which a device sits out
            (0: never; it is still shown as failing).
    """

    def __init__(self, *, sit_out_after: int) -> None:
        if sit_out_after < 0:
            raise ValueError(f"sit_out_after must be >= 0, not {sit_out_after}")
        self._sit_out_after = sit_out_after
        self._streaks: dict[str, FailureStreak] = {}

    def failed(self, device: str, round_index: int, code: str) -> bool:
        """Count a failed round; True when the device must now start sitting out.

        A second report for the same round counts once.
        """
        before = self._streaks.get(device)
        if before is not None and before.last_round == round_index:
            return False
        count = 1 if before is None else before.count + 1
        sits = self._sit_out_after > 0 and count >= self._sit_out_after
        self._streaks[device] = FailureStreak(count, round_index, code, sits)
        return sits and (before is None or not before.sits_out)

    def trained(self, devices: Iterable[str]) -> None:
        """These devices' contributions entered a round's sum: streaks end."""
        for device in devices:
            self._streaks.pop(device, None)

    def new_epoch(self) -> None:
        """A new key epoch takes every device back.

        A streak that goes on after it sits the device out again at its next
        failure.
        """
        self._streaks = {
            d: FailureStreak(s.count, s.last_round, s.last_code)
            for d, s in self._streaks.items()
        }

    def sitting_out(self) -> frozenset[str]:
        """Devices that sit out for their failures."""
        return frozenset(d for d, s in self._streaks.items() if s.sits_out)

    def failing(self) -> Mapping[str, FailureStreak]:
        """Devices failing at least `FAILING_AFTER` rounds in a row, by id."""
        return {
            device: streak
            for device, streak in sorted(self._streaks.items())
            if streak.count >= FAILING_AFTER
        }

    def to_json(self) -> str:
        """The streaks, for the store (a restarted coordinator keeps them)."""
        return json.dumps(
            {
                d: [s.count, s.last_round, s.last_code, s.sits_out]
                for d, s in sorted(self._streaks.items())
            }
        )

    def restore(self, text: str | None) -> None:
        """Take the streaks `to_json` wrote; malformed text restores nothing."""
        self._streaks.clear()
        if not text:
            return
        try:
            data = json.loads(text)
            for device, (count, last_round, code, sits) in data.items():
                self._streaks[str(device)] = FailureStreak(
                    int(count), int(last_round), str(code), bool(sits)
                )
        except (ValueError, TypeError, AttributeError) as exc:
            logger.warning(
                "stored training failures unreadable (%s): starting afresh", exc
            )
            self._streaks.clear()
