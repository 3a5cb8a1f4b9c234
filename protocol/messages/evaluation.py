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

An honest report holds integers with ``0 <= correct_c <= total_c <=
MAX_EVAL_COUNT`` and ``evaluated`` 1 exactly when some ``total_c > 0``; so an
honest sum over ``K`` parties keeps ``correct_c <= total_c <= evaluated *
MAX_EVAL_COUNT``, ``evaluated <= K`` and ``sum_c total_c >= evaluated``.
`eval_totals_problem` names the first rule a sum (or an agent's result)
breaks: devices refuse such a sum, the coordinator such a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.crypto.encoding import FixedPoint
from ursa.protocol.messages.base import CONTROL, Positive
from ursa.protocol.messages.secure_mean import MeanHeader

__all__ = [
    "FLEET_EVAL",
    "FLEET_EVAL_CODEC",
    "MAX_EVAL_COUNT",
    "MeanResult",
    "eval_totals_problem",
    "fleet_eval_ciphertexts",
    "fleet_eval_length",
]

FLEET_EVAL = "eval.classes"
"""The ``purpose`` of federated evaluation: per-class correct and total counts."""

MAX_EVAL_COUNT = 1 << 20
"""Largest count one device reports per class (its evaluation split is cut to it)."""

_MAX_VALUES = 2 * 4096 + 1
"""Two counts per class, at most `KeyEpochStart.num_classes` (4096) classes,
and the evaluating-device count."""


FLEET_EVAL_CODEC = FixedPoint(bound=float(MAX_EVAL_COUNT), scale_bits=0)
"""Every evaluation count's fixed point: integers, exact at 0 fraction bits."""


def fleet_eval_length(num_classes: int) -> int:
    """Values per evaluation report: C correct counts, C totals, ``evaluated``."""
    return 2 * num_classes + 1


def fleet_eval_ciphertexts(num_classes: int, max_parties: int, key_bits: int) -> int:
    """Ciphertexts per evaluation report (`FLEET_EVAL_CODEC`, ``max_parties``)."""
    layout = FLEET_EVAL_CODEC.layout(max_parties, key_bits)
    return layout.num_plaintexts(fleet_eval_length(num_classes))


def eval_totals_problem(values: Sequence[float], num_parties: int) -> str | None:
    """Why no honest fleet of ``num_parties`` sums to ``values``; None: it can.

    ``values`` are ``[correct.., total.., evaluated]`` (module doc: the rules).
    """
    if len(values) % 2 != 1:
        return f"{len(values)} values: not two counts per class and one device count"
    if any(not math.isfinite(v) or v != round(v) or v < 0 for v in values):
        return "counts must be non-negative integers"
    classes = (len(values) - 1) // 2
    correct, total = values[:classes], values[classes : 2 * classes]
    evaluated = values[-1]
    if evaluated > num_parties:
        return f"{evaluated:.0f} evaluating devices among {num_parties} parties"
    if sum(total) < evaluated:
        return f"{evaluated:.0f} evaluating devices but {sum(total):.0f} samples"
    for c, (right, seen) in enumerate(zip(correct, total, strict=True)):
        if right > seen:
            return f"class {c}: {right:.0f} correct of {seen:.0f} samples"
        if seen > evaluated * MAX_EVAL_COUNT:
            return (
                f"class {c}: {seen:.0f} samples from {evaluated:.0f} evaluating "
                f"devices (at most {MAX_EVAL_COUNT} each)"
            )
    return None


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

    @_model_validator(mode="after")
    def _shape(self) -> Self:
        if self.purpose == FLEET_EVAL and len(self.values) % 2 != 1:
            raise ValueError(
                "an evaluation result has two counts per class and one device count"
            )
        return self
