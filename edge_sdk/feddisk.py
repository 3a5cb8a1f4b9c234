"""FedDisk on the device: local MADE, density-ratio classifier, sample weights.

FedDisk (papers/004) weights each local sample by ``alpha = p(x) / q_k(x)``,
the global over the local data density, so that the weighted local losses sum
to the loss under the fleet's pooled distribution (eq. 9-10). Phase 1 on a
device:

1. `train_local_made`: a MADE on the local data only, until its loss stops
   improving (§IV-B; held-out NLL when a validation split is given, else the
   training NLL);
2. the federated global MADE: ordinary FedAvg rounds of `train_made_local`
   (weights by sample count, eq. 11) until the fleet's validation NLL rises
   (`ursa.edge_sdk.made_stop.MadeStopper`);
3. `feddisk_sample_weights`: the density-ratio classifier and the weights.

Phase 2 is ordinary rounds of `train_local` with ``sample_weights``.

**Density ratio** (§IV-C, §VI-B.4): the classifier's input ``u`` is the vector
of per-dimension conditional log-densities ``log p(x_d | x_<d)`` from a MADE
(the paper keeps "the output as a vector of conditional probabilities"; logs
keep it finite), standardised with the training rows' mean and std. Training
pairs: ``u`` from the *global* MADE on each local sample (label 1) and from the
*local* MADE on the same sample (label 0), equal counts so the prior ratio is 1
(eq. 14-15). A sample's weight is ``h/(1-h)`` with ``h`` the classifier on the
local MADE's ``u`` (the paper's summary), then:

* **clipped** to ``DEFAULT_WEIGHT_CLIP = (0.1, 10)``: ``h`` near 0 or 1 (a
  classifier that separates the two sources perfectly, common with a handful
  of samples) would otherwise give weights of 0 or 1e6 and let one sample own
  the device's gradient; a 100x band keeps every sample in play;
* **normalised to mean 1** over the device's data, so the weights move
  emphasis *within* a device and do not change its share of the FedAvg mean
  (which stays ``N_k / N``).

The classifier is one 100-unit ReLU hidden layer and a sigmoid output
(``hidden_size=0`` gives logistic regression), trained by
`ursa.edge_sdk.training.fit_binary_classifier`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.feddisk_settings import DEFAULT_WEIGHT_CLIP
from ursa.edge_sdk.training import (
    BinaryClassifier,
    TrainConfig,
    TrainingError,
    fit_binary_classifier,
    made_conditional_log_probs,
    made_nll,
    train_made_local,
)
from ursa.models.weights import Arrays, FloatArray, add_scaled

DEFAULT_MADE_MAX_EPOCHS = 500
"""The paper's cap on MADE training iterations."""
_PROB_EPS = 1e-6


class DensityRatioClassifier:
    """Classifier ``h(u) = P(u comes from the global MADE)`` (FedDisk §IV-C)."""

    def __init__(self, classifier: BinaryClassifier) -> None:
        self._classifier = classifier

    def prob_global(self, u: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Return ``P(l = 1 | u)`` per row of ``u``."""
        return self._classifier.prob_positive(u)


@dataclass(frozen=True)
class LocalMade:
    """A device's trained local MADE.

    Attributes:
        arrays: the MADE's weights at the best checked epoch.
        epochs: epochs trained up to that point.
        nll: the NLL used to stop (validation if given, else training).
    """

    arrays: Arrays
    epochs: int
    nll: float


def fit_density_ratio(
    u_global: npt.ArrayLike,
    u_local: npt.ArrayLike,
    *,
    config: TrainConfig,
    hidden_size: int = 100,
) -> DensityRatioClassifier:
    """Train `DensityRatioClassifier` on global (label 1) vs local (label 0) rows."""
    classifier = fit_binary_classifier(
        u_global, u_local, config=config, hidden_size=hidden_size
    )
    return DensityRatioClassifier(classifier)


def density_ratio_weights(
    p_global: npt.ArrayLike, *, clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP
) -> npt.NDArray[np.float64]:
    """Turn ``h = P(global | u)`` into sample weights ``h/(1-h)``, clipped, mean 1.

    Raises:
        TrainingError: a bad clip band, or not a non-empty vector.
    """
    lo, hi = clip
    if not 0.0 < lo <= hi or not math.isfinite(hi):
        raise TrainingError(f"clip must satisfy 0 < low <= high < inf, got {clip}")
    p = np.clip(np.asarray(p_global, dtype=np.float64), _PROB_EPS, 1.0 - _PROB_EPS)
    if p.ndim != 1 or p.size == 0:
        raise TrainingError(f"p_global must be a non-empty vector, got shape {p.shape}")
    alpha: npt.NDArray[np.float64] = np.clip(p / (1.0 - p), lo, hi)
    return alpha / float(alpha.mean())


def feddisk_sample_weights(
    model_config: Mapping[str, Any],
    global_arrays: Mapping[str, FloatArray],
    local_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    *,
    config: TrainConfig,
    hidden_size: int = 100,
    clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP,
) -> npt.NDArray[np.float64]:
    """Compute FedDisk weights for local samples from the global and local MADEs."""
    u_global = made_conditional_log_probs(model_config, global_arrays, x)
    u_local = made_conditional_log_probs(model_config, local_arrays, x)
    h = fit_density_ratio(u_global, u_local, config=config, hidden_size=hidden_size)
    return density_ratio_weights(h.prob_global(u_local), clip=clip)


def train_local_made(
    model_config: Mapping[str, Any],
    start_arrays: Mapping[str, FloatArray],
    x_train: npt.ArrayLike,
    x_val: npt.ArrayLike | None = None,
    *,
    config: TrainConfig,
    max_epochs: int = DEFAULT_MADE_MAX_EPOCHS,
    patience: int = 1,
) -> LocalMade:
    """Train the local MADE until its loss stops improving (FedDisk §IV-B).

    Trains ``config.epochs`` epochs per check (the optimiser restarts at each
    check) and keeps the best checked weights; stops after ``patience`` checks
    without improvement or at ``max_epochs``. The loss checked is the NLL on
    ``x_val`` when given, else on ``x_train``.

    Raises:
        TrainingError: ``max_epochs`` or ``patience`` below 1, or bad data.
    """
    if max_epochs < 1 or patience < 1:
        raise TrainingError(
            f"need max_epochs >= 1 and patience >= 1, got {max_epochs}, {patience}"
        )
    check = x_train if x_val is None else x_val
    current: Arrays = {
        k: np.asarray(v, dtype=np.float32) for k, v in start_arrays.items()
    }
    best = LocalMade(current, 0, made_nll(model_config, current, check))
    epochs, bad = 0, 0
    while epochs < max_epochs and bad < patience:
        chunk = config.model_copy(
            update={
                "epochs": min(config.epochs, max_epochs - epochs),
                "seed": config.seed + epochs,
            }
        )
        current = add_scaled(
            current,
            train_made_local(model_config, current, x_train, config=chunk).delta,
            1.0,
        )
        epochs += chunk.epochs
        nll = made_nll(model_config, current, check)
        if math.isfinite(nll) and nll < best.nll:
            best, bad = LocalMade(current, epochs, nll), 0
        else:
            bad += 1
    return best
