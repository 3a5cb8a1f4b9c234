"""CLIMB dual step: the request, each encrypted `[f_i, lambda_i]`, the sum."""

from __future__ import annotations

from typing import Literal

from ursa.protocol.messages.base import (
    BaseMessage,
    Blob,
    Count,
    Positive,
)


class DualStepRequest(BaseMessage):
    """Coordinator to all: evaluate the loss at this model and send stats."""

    kind: Literal["dual_step_request"] = "dual_step_request"
    epoch: Count
    model_version: Count


class ClimbStats(BaseMessage):
    """Device to coordinator: Enc(loss) and Enc(lambda), packed fixed-point."""

    kind: Literal["climb_stats"] = "climb_stats"
    epoch: Count
    stats: Blob


class ClimbSum(BaseMessage):
    """Coordinator to all: the encrypted sum of every device's stats."""

    kind: Literal["climb_sum"] = "climb_sum"
    epoch: Count
    stats_sum: Blob
    num_parties: Positive
