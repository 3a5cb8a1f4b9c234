"""Does this device's model fit the federation's? A pure check, run before it trains.

The federation's model reaches a device twice: its tensor spec (names,
shapes, dtypes) signed into every `KeyEpochStart` (`ModelSpec`), and each
downloaded version's weights. Both are judged the same way, by the trainer's
own ``check_arrays`` and ``model_features`` (the spec as `spec_arrays`:
zero-size views, nothing allocated), so a device whose model does not fit
sits the key epoch out *before* it registers, with one ERROR naming the
first tensor that differs, instead of being selected and failing
(`ursa.edge_sdk.key_epoch`, ``docs/protocol.md`` "Version 10").

A device with no model to train (a selection-only one), a spec of another
model than its trainer's (FedDisk's MADE phase for the classifier), or a
trainer that cannot say (an `ArrayTrainer` app without ``initial_weights``)
has nothing checked here.
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.data_check import (
    DataFacts,
    DataProblem,
    FederationFacts,
    data_problems,
)
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.models.spec import spec_arrays
from ursa.models.weights import Arrays, WeightsError
from ursa.protocol.messages import ModelSpec

__all__ = ["model_problems", "spec_problems"]

logger = logging.getLogger("ursa.edge_sdk")


def model_problems(
    trainer: ModelTrainer,
    arrays: Arrays,
    labels: NDArray[np.int64],
    model: str,
    *,
    misfit: tuple[type[Exception], ...] = (ValueError,),
) -> tuple[DataProblem, ...]:
    """How the federation's ``model`` at ``arrays`` does not fit this device.

    Its data first (features per sample), then its own model (the first
    tensor that differs); ``model`` names the federation's model in messages.
    ``misfit``: what ``check_arrays`` raises for a model that does not fit
    (other exceptions propagate).
    """
    federation = FederationFacts(
        model_features=trainer.model_features(arrays), model=model
    )
    facts = DataFacts.of(labels, trainer.features)
    problems = tuple(data_problems(facts, federation))
    if problems:
        return problems
    try:
        trainer.check_arrays(arrays)
    except misfit as exc:
        return (
            DataProblem(
                f"the federation's {model} does not fit this device's model: {exc}",
                "give the device the federation's model ([training] "
                "architecture and model_options, or the app's module)",
                model=True,
            ),
        )
    return ()


def spec_problems(
    trainer: ModelTrainer | None,
    spec: ModelSpec | None,
    labels: NDArray[np.int64],
) -> tuple[DataProblem, ...] | None:
    """How the signed ``spec`` does not fit this device (empty: it fits).

    None when there is nothing to judge: no model trained here, no spec
    signed, a spec of another model than the trainer's, or an app trainer
    whose check needs real weights. Only a `WeightsError` (ursa's own
    checks: `ModelMismatchError` names the tensor) counts as a misfit here;
    anything else an app's ``check_arrays`` raises on the spec's read-only
    views (writing into them, say) is logged, and the first download is
    judged instead: a device is never sat out for what its check could not do.
    """
    if trainer is None or spec is None or spec.model != trainer.model:
        return None
    try:
        return model_problems(
            trainer,
            spec_arrays(spec.triples()),
            labels,
            f"model {spec.model}",
            misfit=(WeightsError,),
        )
    except Exception as exc:  # the app's check_arrays or model_features
        logger.warning(
            "the trainer cannot judge the signed spec of model %s (%s: %s); "
            "its model is checked at the first download instead",
            spec.model,
            type(exc).__name__,
            exc,
        )
        return None
