"""FedDisk's phase 1 on the wire: the agent's verdict and the switch.

The encrypted MADE validation loss is a `ursa.protocol.messages.secure_mean`
mean of purpose ``feddisk.made_loss``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from ursa.protocol.messages.base import (
    PHASE,
    BaseMessage,
    Count,
    Name,
)

__all__ = [
    "MADE_LOSS",
    "MADE_LOSS_CIPHERTEXTS",
    "MADE_LOSS_LENGTH",
    "FeddiskSwitch",
    "MadeVerdict",
]

MADE_LOSS = "feddisk.made_loss"
"""The ``purpose`` of FedDisk's loss step: a mean of ``[nll_i * n_i, n_i]``."""
MADE_LOSS_LENGTH = 2
"""Values per loss report: ``[nll_i * n_i, n_i]``."""
MADE_LOSS_CIPHERTEXTS = 1
"""Ciphertexts per loss report (two slots: as `CLIMB_DUAL_CIPHERTEXTS`)."""


class MadeVerdict(BaseMessage):
    """Agent to coordinator: whether the MADE phase stops, and its best version."""

    kind: Literal["made_verdict"] = "made_verdict"
    epoch: Count
    model_version: Count
    stop: bool
    best_version: Count


class FeddiskSwitch(BaseMessage):
    """Coordinator to all (retained): phase 2 trains ``model`` from now on.

    Devices weight their samples with the global MADE ``made_version``.
    """

    kind: Literal["feddisk_switch"] = "feddisk_switch"
    topic: ClassVar[str] = PHASE
    retained: ClassVar[bool] = True
    made_model: Name
    made_version: Count
    model: Name
