"""Does this device's data fit the federation? A pure check, run before it takes part.

A device whose labels lie outside the federation's classes, or whose samples
have another number of features than the federation's model takes, cannot
contribute: Dubhe cannot categorise it and a model step on its data fails.
The client (``edge_sdk/key_epoch.py``, ``edge_sdk/training_rounds.py``) runs
`data_problems` on what it knows:

* at every signed `KeyEpochStart`: the labels against ``num_classes``;
* at every downloaded global model (a training device): the features per
  sample against what the model takes (`ModelTrainer.model_features`), and
  whether the model fits the trainer's own model at all.

A device with a problem logs one ERROR naming it and its remedy, answers the
coordinator with ``ErrorReply(code="data_mismatch")`` (``"model_mismatch"``
when only its model differs from the federation's: the tensor is named) and
sits the key epoch out (it does not register or volunteer); see
``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["DataFacts", "DataProblem", "FederationFacts", "data_problems", "reason_of"]

MAX_REASON_CHARS = 256
"""`ErrorReply.reason` is at most this long (the wire limit)."""


@dataclass(frozen=True)
class DataFacts:
    """What the device knows of its own data (never sent).

    Attributes:
        labels: The distinct class labels of the local samples.
        num_samples: Local samples.
        features: Features per sample (a training device), None when unknown
            (a selection-only device holds labels only).
    """

    labels: frozenset[int]
    num_samples: int
    features: int | None = None

    @classmethod
    def of(cls, labels: NDArray[np.integer], features: int | None = None) -> DataFacts:
        """The facts of a label vector (and, if known, the features per sample)."""
        values = np.unique(np.asarray(labels))
        return cls(frozenset(int(v) for v in values), int(np.size(labels)), features)


@dataclass(frozen=True)
class FederationFacts:
    """What the federation signed or sent (None: not known yet).

    Attributes:
        num_classes: The classes of the key epoch (`KeyEpochStart.num_classes`).
        model_features: Features per sample the federation's model takes.
        model: The wire name and version of that model, for messages.
    """

    num_classes: int | None = None
    model_features: int | None = None
    model: str = "model"


@dataclass(frozen=True)
class DataProblem:
    """One way the device does not fit: what is wrong, and what to do about it."""

    what: str
    remedy: str
    model: bool = False
    """The device's model (not its data) differs: answered ``model_mismatch``."""

    def __str__(self) -> str:
        return f"{self.what} (remedy: {self.remedy})"


def data_problems(data: DataFacts, federation: FederationFacts) -> list[DataProblem]:
    """Every way ``data`` does not fit ``federation`` (empty: it fits).

    Only facts known on both sides are compared.
    """
    problems: list[DataProblem] = []
    if data.num_samples == 0:
        problems.append(
            DataProblem("the device has no labelled samples", "give it local data")
        )
    classes = federation.num_classes
    outside = sorted(v for v in data.labels if classes is not None and v >= classes)
    if classes is not None and outside:
        shown = ", ".join(str(v) for v in outside[:5])
        more = f" (+{len(outside) - 5} more)" if len(outside) > 5 else ""
        problems.append(
            DataProblem(
                f"labels {shown}{more} lie outside the federation's "
                f"{classes} classes 0..{classes - 1}",
                f"relabel the data to 0..{classes - 1} or join a federation "
                f"with num_classes >= {outside[-1] + 1}",
            )
        )
    wanted = federation.model_features
    if wanted is not None and data.features is not None and data.features != wanted:
        problems.append(
            DataProblem(
                f"samples have {data.features} features; the federation's "
                f"{federation.model} takes {wanted}",
                f"give the device data with {wanted} features per sample "
                "or join the federation that trains this data",
            )
        )
    return problems


def reason_of(problems: Sequence[DataProblem]) -> str:
    """The `ErrorReply.reason` for ``problems``: what is wrong, within the limit."""
    reason = "; ".join(p.what for p in problems)
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return reason[: MAX_REASON_CHARS - 3] + "..."
