"""Federated evaluation on the wire: a secure mean of per-class counts, disclosed once.

Every ``eval_every`` rounds the coordinator asks a secure mean of purpose
``eval.classes`` (`secure_mean`): each registered device reports
``Enc([correct_0 .. correct_{C-1}, total_0 .. total_{C-1}, evaluated])`` over
its local evaluation split at the round's model version (``evaluated`` is 1
for a device that evaluated any sample, 0 for one without a split, so the
agent can count the devices behind a sum, not only the reports). The
coordinator multiplies the reports and cannot read them; every device
decrypts the sum, and the key epoch's agent, the one device the coordinator
hears it from, answers the decrypted totals in a `MeanResult`. The
coordinator so learns the fleet's per-class accuracy, never a device's counts.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import CONTROL, Positive, Signature
from ursa.protocol.messages.secure_mean import MeanHeader

__all__ = [
    "FLEET_EVAL",
    "MAX_EVAL_COUNT",
    "MeanResult",
    "fleet_eval_length",
]

FLEET_EVAL = "eval.classes"
"""The ``purpose`` of federated evaluation: per-class correct and total counts."""

MAX_EVAL_COUNT = 1 << 20
"""Largest count one device reports per class (its evaluation split is cut to it)."""

_MAX_VALUES = 2 * 4096 + 1
"""Two counts per class, at most `KeyEpochStart.num_classes` (4096) classes,
and the evaluating-device count."""


def fleet_eval_length(num_classes: int) -> int:
    """Values per evaluation report: C correct counts, C totals, ``evaluated``."""
    return 2 * num_classes + 1


class MeanResult(MeanHeader):
    """Agent to coordinator: a decrypted sum the coordinator may learn, signed.

    Only purposes whose sums are meant for the coordinator are answered
    (federated evaluation's ``eval.classes``); the agent answers at most once
    per key epoch and round, and only a sum over at least its configured
    number of devices that evaluated (the sum's last value). ``signature`` is
    the agent's Ed25519 signature.
    """

    kind: Literal["mean_result"] = "mean_result"
    topic: ClassVar[str] = CONTROL
    values: Annotated[
        tuple[Annotated[float, Field(ge=0.0)], ...],
        Field(min_length=1, max_length=_MAX_VALUES),
    ]
    num_parties: Positive
    signature: Signature = b""

    @_model_validator(mode="after")
    def _shape(self) -> Self:
        if self.purpose == FLEET_EVAL and len(self.values) % 2 != 1:
            raise ValueError(
                "an evaluation result has two counts per class and one device count"
            )
        return self
