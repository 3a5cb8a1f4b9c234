"""FedDisk's phase 1 on the wire: encrypted MADE validation loss, verdict, switch."""

from __future__ import annotations

from typing import ClassVar, Literal

from ursa.protocol.messages.base import (
    PHASE,
    BaseMessage,
    Blob,
    Count,
    Name,
    Positive,
    Signature,
)


class MadeLossRequest(BaseMessage):
    """Coordinator to all: the global MADE's validation NLL at this version, please."""

    kind: Literal["made_loss_request"] = "made_loss_request"
    epoch: Count
    model: Name
    model_version: Count


class MadeLoss(BaseMessage):
    """Device to coordinator: Enc([NLL summed over its validation split, its size])."""

    kind: Literal["made_loss"] = "made_loss"
    epoch: Count
    model_version: Count
    loss: Blob


class MadeLossSum(BaseMessage):
    """Coordinator to all: the encrypted sum of every device's `MadeLoss`."""

    kind: Literal["made_loss_sum"] = "made_loss_sum"
    epoch: Count
    model_version: Count
    loss_sum: Blob
    num_parties: Positive


class MadeVerdict(BaseMessage):
    """Agent to coordinator: whether the MADE phase stops, and its best version."""

    kind: Literal["made_verdict"] = "made_verdict"
    epoch: Count
    model_version: Count
    stop: bool
    best_version: Count
    signature: Signature = b""


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
