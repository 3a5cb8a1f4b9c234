"""The callbacks composition hangs on a federation's rounds (the demo's, telemetry's).

`ursa.tools.compose` fills them; the method table's training builders
(`ursa.coordinator.methods.registry`) hand each model's to its plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ursa.coordinator.training import Evaluator, TrainingRoundReport

__all__ = ["RoundHooks", "TrainingHooks"]


@dataclass(frozen=True)
class RoundHooks:
    """Callbacks on one model's rounds (the demo's evaluation and progress)."""

    evaluate: Evaluator | None = None
    on_round: Callable[[TrainingRoundReport], None] | None = None


@dataclass(frozen=True)
class TrainingHooks:
    """Callbacks for the training plugin: the classifier's, FedDisk's MADE's."""

    classifier: RoundHooks = RoundHooks()
    made: RoundHooks = RoundHooks()
    on_switch: Callable[[int, int], None] | None = None
    """FedDisk: (round, best MADE version) after the switch."""
