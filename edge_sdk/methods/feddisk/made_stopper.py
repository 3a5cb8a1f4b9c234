"""FedDisk phase 1's stop rule: when to stop the federated global MADE.

The global MADE is trained by ordinary FedAvg rounds (weights by sample
count, FedDisk eq. 11); after each round the devices measure the new model's
NLL on their validation split and the fleet's sample-weighted mean decides:
"the steps are repeated until the validation loss starts increasing" (§IV-B,
Fig. 5). `MadeStopper` is that rule as a pure state machine; ``patience``
rises in a row (default 1, the paper's rule) stop the phase, and the model
kept is the one with the lowest validation loss (the round before the rise).
Every MADE round counts as a communication round (the paper's effective
communication rounds, §VI-C.2).

It lives on the device side because over the wire only devices learn the
fleet's loss (they decrypt its Paillier sum); the epoch's agent applies the
rule and tells the coordinator one stop bit and the best version
(`ursa.edge_sdk.methods.feddisk`). The simulator uses it in-process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_MAX_MADE_ROUNDS = 500


class MadeStopError(ValueError):
    """A validation loss that is not a finite number, or a bad setting."""


@dataclass(frozen=True)
class MadeStopper:
    """Early stopping of the global MADE on the fleet's validation NLL.

    Attributes:
        patience: rises (rounds without a new best) in a row that stop the phase.
        max_rounds: stop after this many rounds whatever the loss does.
        rounds: validation losses seen (one per MADE round).
        best_round: 1-based round with the lowest loss (0 before any).
        best_loss: that loss.
        since_best: rounds since the best.
    """

    patience: int = 1
    max_rounds: int = DEFAULT_MAX_MADE_ROUNDS
    rounds: int = 0
    best_round: int = 0
    best_loss: float = math.inf
    since_best: int = 0

    def __post_init__(self) -> None:
        if self.patience < 1 or self.max_rounds < 1:
            raise MadeStopError(
                f"patience and max_rounds must be >= 1, got {self.patience}, "
                f"{self.max_rounds}"
            )

    @property
    def improved(self) -> bool:
        """Whether the last round set a new best (keep its model)."""
        return self.rounds > 0 and self.best_round == self.rounds

    @property
    def stopped(self) -> bool:
        """Whether the MADE phase is over."""
        return self.since_best >= self.patience or self.rounds >= self.max_rounds


def apply_validation_loss(stopper: MadeStopper, loss: float) -> MadeStopper:
    """Record one round's fleet validation NLL.

    Raises:
        MadeStopError: ``loss`` is NaN or infinite, or the phase already stopped.
    """
    if not math.isfinite(loss):
        raise MadeStopError(f"validation loss must be finite, got {loss}")
    if stopper.stopped:
        raise MadeStopError("the MADE phase has already stopped")
    rounds = stopper.rounds + 1
    if loss < stopper.best_loss:
        return replace(
            stopper, rounds=rounds, best_round=rounds, best_loss=loss, since_best=0
        )
    return replace(stopper, rounds=rounds, since_best=stopper.since_best + 1)


def weighted_mean_loss(losses: list[float], counts: list[int]) -> float:
    """The fleet's validation loss: the sample-weighted mean of device NLLs.

    Raises:
        MadeStopError: mismatched lengths, no samples, or a negative count.
    """
    if len(losses) != len(counts) or not counts or any(c < 0 for c in counts):
        raise MadeStopError("need one non-negative count per loss")
    total = sum(counts)
    if total == 0:
        raise MadeStopError("no validation samples")
    return sum(loss * count for loss, count in zip(losses, counts, strict=True)) / total
