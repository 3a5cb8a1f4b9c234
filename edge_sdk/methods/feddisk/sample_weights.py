"""FedDisk on the device: local MADE, density-ratio classifier, sample weights.

FedDisk (the FedDisk paper) weights each local sample by ``alpha = p(x) / q_k(x)``,
the global over the local data density, so that the weighted local losses sum
to the loss under the fleet's pooled distribution (eq. 9-10). Phase 1 on a
device:

1. `train_local_made`: a MADE on the local data only, until its loss stops
   improving (§IV-B; held-out NLL when a validation split is given, else the
   training NLL);
2. the federated global MADE: ordinary FedAvg rounds of `train_made_local`
   (weights by sample count, eq. 11) until the fleet's validation NLL rises
   (`ursa.edge_sdk.methods.feddisk.made_stopper.MadeStopper`);
3. `feddisk_sample_weights`: the density-ratio classifier and the weights
   (`SampleWeights`: normalised, raw, and `weight_summary`).

Phase 2 is ordinary rounds of `train_local` with ``sample_weights``.

**Density ratio** (§IV-C, §VI-B.4): a classifier ``h`` tells the fleet's
data (label 1) from the device's (label 0), with equal counts so the prior
ratio is 1 (eq. 14-15); its odds ``h/(1-h)`` at a local sample estimate
``p(x)/q_k(x)``. The device holds no fleet data, so the fleet's side is as
many samples drawn from the *global* MADE as the device holds
(`ursa.edge_sdk.training.made_sample`). The classifier's input is
`ratio_features`: per dimension, the global minus the local MADE's
conditional log-density ``log p(x_d | x_<d)`` (the paper feeds MADE outputs
"as a vector of conditional probabilities"; logs keep them finite, and their
difference sums to the MADEs' own log ratio), standardised with the training
rows' mean and std. ursa used to pair the global and the local MADE's outputs
on the *same* local samples as the two classes; that estimates a ratio
between the two models' outputs, not ``p/q_k`` (its weights' rank
correlation with the exact ratio of a clean/noisy mixture was about 0). The
raw weights are then:

* **cross-fitted** (`crossfit_odds`, ``folds`` parts, default 2): each part's
  samples are scored by a classifier fitted on the other parts only, so no
  sample is weighted by a classifier that saw it. Scored on its own training
  rows, a classifier learns those rows' label 0, which pushes ``h`` towards
  0 and the weights onto the clip floor (an audit found 56-83% there on a
  Dirichlet split of digits);
* **clipped** to ``DEFAULT_WEIGHT_CLIP = (0.1, 10)``: ``h`` near 0 or 1 would
  otherwise give weights of 0 or 1e6 and let one sample own the device's
  gradient; a 100x band keeps every sample in play;
* **normalised to mean 1** over the device's data: the true ratio
  ``p(x)/q_k(x)`` has mean 1 under the device's own distribution ``q_k``
  (``E_q[p/q] = integral of p = 1``), so mean 1 is the scale an estimate
  should have whatever the clip and the classifier's calibration did to it;
  it also keeps the device's share of the FedAvg mean at ``N_k / N``.

`weight_summary` gives what phase 1 reports: the share of raw weights at each
clip bound and the normalised weights' spread (std, p10, p90).

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

from ursa.edge_sdk.methods.feddisk.settings import (
    DEFAULT_CROSSFIT_FOLDS,
    DEFAULT_WEIGHT_CLIP,
)
from ursa.edge_sdk.training import (
    BinaryClassifier,
    TrainConfig,
    TrainingError,
    fit_binary_classifier,
    made_conditional_log_probs,
    made_nll,
    made_sample,
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


def raw_density_ratio(p_global: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Turn ``h = P(global | u)`` into the raw odds ``h/(1-h)`` (before any clip).

    Raises:
        TrainingError: not a non-empty vector.
    """
    p = np.clip(np.asarray(p_global, dtype=np.float64), _PROB_EPS, 1.0 - _PROB_EPS)
    if p.ndim != 1 or p.size == 0:
        raise TrainingError(f"p_global must be a non-empty vector, got shape {p.shape}")
    odds: npt.NDArray[np.float64] = p / (1.0 - p)
    return odds


def clip_and_normalise(
    raw: npt.ArrayLike, *, clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP
) -> npt.NDArray[np.float64]:
    """Clip raw weights to ``clip``, then scale them to mean 1 (module doc: why).

    Raises:
        TrainingError: a bad clip band, or not a non-empty vector.
    """
    lo, hi = _check_clip(clip)
    alpha = np.asarray(raw, dtype=np.float64)
    if alpha.ndim != 1 or alpha.size == 0:
        raise TrainingError(f"weights must be a non-empty vector, got {alpha.shape}")
    clipped: npt.NDArray[np.float64] = np.clip(alpha, lo, hi)
    return clipped / float(clipped.mean())


def density_ratio_weights(
    p_global: npt.ArrayLike, *, clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP
) -> npt.NDArray[np.float64]:
    """Turn ``h = P(global | u)`` into sample weights ``h/(1-h)``, clipped, mean 1.

    Raises:
        TrainingError: a bad clip band, or not a non-empty vector.
    """
    _check_clip(clip)
    return clip_and_normalise(raw_density_ratio(p_global), clip=clip)


@dataclass(frozen=True)
class SampleWeights:
    """A device's FedDisk weights.

    Attributes:
        weights: per sample, clipped and normalised to mean 1 (what trains).
        raw: per sample, the classifier's odds ``h/(1-h)`` before the clip.
        clip: the band ``raw`` was clipped to.
        folds: the cross-fitting parts used (1: too few rows, uniform weights).
    """

    weights: npt.NDArray[np.float64]
    raw: npt.NDArray[np.float64]
    clip: tuple[float, float]
    folds: int

    def summary(self) -> dict[str, float]:
        """`weight_summary` of these weights."""
        return weight_summary(self.raw, self.weights, self.clip)


def weight_summary(
    raw: npt.ArrayLike, weights: npt.ArrayLike, clip: tuple[float, float]
) -> dict[str, float]:
    """What phase 1 reports about weights (one device's, or a fleet's pooled).

    ``at_low`` / ``at_high``: the share of raw weights at or beyond each clip
    bound (a saturated classifier puts most of them there); ``min``, ``max``,
    ``std``, ``p10``, ``p90``: the spread of the normalised weights (all 1 is
    FedAvg).
    """
    lo, hi = clip
    r = np.asarray(raw, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if r.size == 0 or w.size == 0:
        return {}
    p10, p90 = np.percentile(w, [10.0, 90.0])
    return {
        "at_low": float(np.mean(r <= lo)),
        "at_high": float(np.mean(r >= hi)),
        "min": float(w.min()),
        "max": float(w.max()),
        "std": float(w.std()),
        "p10": float(p10),
        "p90": float(p90),
    }


def crossfit_parts(n: int, folds: int, seed: int) -> list[npt.NDArray[np.int64]]:
    """Split ``range(n)`` into ``min(folds, n)`` seeded parts of near-equal size.

    Raises:
        TrainingError: ``folds`` below 2.
    """
    if folds < 2:
        raise TrainingError(f"folds must be >= 2, got {folds}")
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    return [part for part in np.array_split(order, min(folds, n)) if part.size]


def crossfit_odds(
    fleet_rows: npt.ArrayLike,
    local_rows: npt.ArrayLike,
    *,
    config: TrainConfig,
    hidden_size: int = 100,
    folds: int = 2,
) -> npt.NDArray[np.float64]:
    """Raw odds ``h/(1-h)`` per local row, each from a classifier that never saw it.

    Row i of both inputs goes to the same part; part j's local rows are scored
    by a classifier fitted on every other part's fleet (label 1) and local
    (label 0) rows. Fewer than 2 rows: odds of 1 (nothing to fit on).

    Raises:
        TrainingError: ``folds`` below 2, or inputs of different shapes.
    """
    fleet = np.asarray(fleet_rows, dtype=np.float64)
    local = np.asarray(local_rows, dtype=np.float64)
    if fleet.shape != local.shape or local.ndim != 2 or len(local) == 0:
        raise TrainingError(f"rows must pair up (n, d): {fleet.shape}, {local.shape}")
    parts = crossfit_parts(len(local), folds, config.seed)
    odds = np.ones(len(local), dtype=np.float64)
    if len(parts) < 2:
        return odds
    for j, part in enumerate(parts):
        fit = np.concatenate([p for i, p in enumerate(parts) if i != j])
        h = fit_density_ratio(
            fleet[fit],
            local[fit],
            config=config.model_copy(update={"seed": config.seed + j}),
            hidden_size=hidden_size,
        )
        odds[part] = raw_density_ratio(h.prob_global(local[part]))
    return odds


def ratio_features(
    model_config: Mapping[str, Any],
    global_arrays: Mapping[str, FloatArray],
    local_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
) -> npt.NDArray[np.float64]:
    """The classifier's input: ``log p(x_d|x_<d) - log q_k(x_d|x_<d)`` per dimension.

    Global MADE minus local MADE: their sum over d is the MADEs' own log
    ratio, so even a linear classifier can reach it.
    """
    u_global = made_conditional_log_probs(model_config, global_arrays, x)
    u_local = made_conditional_log_probs(model_config, local_arrays, x)
    return u_global - u_local


def feddisk_sample_weights(
    model_config: Mapping[str, Any],
    global_arrays: Mapping[str, FloatArray],
    local_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    *,
    config: TrainConfig,
    hidden_size: int = 100,
    clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP,
    folds: int = DEFAULT_CROSSFIT_FOLDS,
) -> SampleWeights:
    """FedDisk weights for local samples from the global and local MADEs.

    Draws as many samples from the global MADE as the device holds (the
    fleet's side, label 1), contrasts them with the device's own (label 0) on
    `ratio_features`, cross-fitted over ``folds`` parts (`crossfit_odds`);
    then clips and normalises to mean 1. The device and the simulator both
    call this.

    Raises:
        TrainingError: bad ``clip`` or ``folds``, or data that does not fit.
    """
    _check_clip(clip)
    local_x = np.asarray(x, dtype=np.float32)
    local_x = local_x.reshape(len(local_x), -1)
    fleet_x = made_sample(model_config, global_arrays, len(local_x), seed=config.seed)
    raw = crossfit_odds(
        ratio_features(model_config, global_arrays, local_arrays, fleet_x),
        ratio_features(model_config, global_arrays, local_arrays, local_x),
        config=config,
        hidden_size=hidden_size,
        folds=folds,
    )
    used = len(crossfit_parts(len(raw), folds, config.seed))
    return SampleWeights(
        clip_and_normalise(raw, clip=clip), raw, clip, used if used >= 2 else 1
    )


def _check_clip(clip: tuple[float, float]) -> tuple[float, float]:
    lo, hi = clip
    if not 0.0 < lo <= hi or not math.isfinite(hi):
        raise TrainingError(f"clip must satisfy 0 < low <= high < inf, got {clip}")
    return lo, hi


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
