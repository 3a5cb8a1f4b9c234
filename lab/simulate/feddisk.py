"""FedDisk phase 1 in the simulator: local MADEs, the federated global MADE, weights.

The device side is `ursa.edge_sdk.methods.feddisk.sample_weights` and
`ursa.edge_sdk.training` (torch, one device at a time, exactly as on a
device); the coordinator side is `ursa.coordinator.aggregation` (FedAvg by
sample count, eq. 11) and `ursa.edge_sdk.methods.feddisk.made_stopper.MadeStopper`
(stop when the fleet's validation NLL rises, keep the best model). Each device
holds out ``val_fraction`` of its training data (at least one sample) as its
MADE validation split; the fleet's
validation loss is the sample-weighted mean of the devices' NLLs (the paper
plots one such curve, Fig. 5). MADE rounds use the run's own selector (the
same K participants per round as the classifier rounds) and count as
communication rounds. The weights come from the device's own
`feddisk_sample_weights` (cross-fitted); the summary pools every device's
`weight_summary` (share of raw weights at each clip bound, spread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.aggregation import (
    DeviceDelta,
    Weighting,
    apply_update,
    finalize_aggregation,
    init_aggregation,
)
from ursa.edge_sdk.methods.feddisk.made_stopper import (
    MadeStopper,
    apply_validation_loss,
    weighted_mean_loss,
)
from ursa.edge_sdk.methods.feddisk.sample_weights import (
    SampleWeights,
    feddisk_sample_weights,
    train_local_made,
    weight_summary,
)
from ursa.edge_sdk.methods.feddisk.settings import (
    DEFAULT_CROSSFIT_FOLDS,
    DEFAULT_WEIGHT_CLIP,
)
from ursa.edge_sdk.training import TrainConfig, made_nll, train_made_local
from ursa.models.registry import initial_arrays
from ursa.models.weights import Arrays
from ursa.tools.data.federation import Federation


@dataclass(frozen=True)
class MadePhaseSettings:
    """Phase-1 hyper-parameters (MADE as in the paper: one hidden layer, Adam)."""

    made_hidden: int = 64
    made_lr: float = 1e-2
    made_batch_size: int = 16
    made_epochs_per_round: int = 1
    local_made_epochs_per_check: int = 5
    local_made_max_epochs: int = 500
    local_made_patience: int = 2
    max_made_rounds: int = 200
    made_patience: int = 1
    val_fraction: float = 0.15
    classifier_hidden: int = 100
    classifier_epochs: int = 50
    classifier_lr: float = 0.01
    classifier_batch_size: int = 32
    crossfit_folds: int = DEFAULT_CROSSFIT_FOLDS
    clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP


@dataclass(frozen=True)
class FeddiskPhase:
    """Phase 1's result: per-device sample weights and the rounds it took."""

    weights: list[npt.NDArray[np.float64]]
    made_rounds: int
    summary: dict[str, Any]
    raw: list[npt.NDArray[np.float64]]
    """Per device, the classifier's odds before the clip and normalisation."""


def feddisk_phase_one(
    fed: Federation,
    settings: MadePhaseSettings,
    select: Callable[[int], npt.NDArray[np.int64]],
    rng: np.random.Generator,
) -> FeddiskPhase:
    """Run FedDisk phase 1 over the federation; returns each device's weights."""
    made_config = _made_config(fed.input_dim, settings)
    start = initial_made(fed.input_dim, settings, rng)
    splits = [_split(len(d.y), settings.val_fraction, rng) for d in fed.devices]
    made_train = [d.x[tr] for d, (tr, _) in zip(fed.devices, splits, strict=True)]
    made_val = [d.x[va] for d, (_, va) in zip(fed.devices, splits, strict=True)]
    made_cfg = TrainConfig(
        epochs=settings.made_epochs_per_round,
        batch_size=settings.made_batch_size,
        optimizer="adam",
        lr=settings.made_lr,
    )
    local = [
        train_local_made(
            made_config,
            start,
            xt,
            xv,
            config=made_cfg.model_copy(
                update={"epochs": settings.local_made_epochs_per_check, "seed": i}
            ),
            max_epochs=settings.local_made_max_epochs,
            patience=settings.local_made_patience,
        )
        for i, (xt, xv) in enumerate(zip(made_train, made_val, strict=True))
    ]
    global_made, stopper, curve = _global_made(
        made_config, start, made_train, made_val, made_cfg, settings, select, rng
    )
    clf_cfg = TrainConfig(
        epochs=settings.classifier_epochs,
        batch_size=settings.classifier_batch_size,
        lr=settings.classifier_lr,
    )
    results: list[SampleWeights] = [
        feddisk_sample_weights(
            made_config,
            global_made,
            lm.arrays,
            d.x,
            config=clf_cfg.model_copy(update={"seed": i}),
            hidden_size=settings.classifier_hidden,
            clip=settings.clip,
            folds=settings.crossfit_folds,
        )
        for i, (d, lm) in enumerate(zip(fed.devices, local, strict=True))
    ]
    weights = [r.weights for r in results]
    raw = [r.raw for r in results]
    summary = {
        "made_rounds": stopper.rounds,
        "best_made_round": stopper.best_round,
        "validation_nll": [round(v, 3) for v in curve],
        "local_made_epochs": {
            "mean": float(np.mean([m.epochs for m in local])),
            "max": int(max(m.epochs for m in local)),
        },
        "crossfit_folds": settings.crossfit_folds,
        "weights": weight_summary(
            np.concatenate(raw), np.concatenate(weights), settings.clip
        ),
    }
    return FeddiskPhase(weights, stopper.rounds, summary, raw)


def initial_made(
    input_dim: int, settings: MadePhaseSettings, rng: np.random.Generator
) -> Arrays:
    """The global MADE's version 0: ``rng``'s first draw seeds it.

    The production engine (`ursa.lab.simulate.feddisk_service`) starts from it
    too, so both engines begin phase 1 from the same weights.
    """
    seed = int(rng.integers(2**31))
    return initial_arrays("made", _made_config(input_dim, settings), seed=seed)


def _made_config(input_dim: int, settings: MadePhaseSettings) -> dict[str, Any]:
    return {"input_dim": input_dim, "hidden_sizes": [settings.made_hidden]}


def _global_made(
    made_config: dict[str, Any],
    start: Arrays,
    made_train: list[npt.NDArray[np.float32]],
    made_val: list[npt.NDArray[np.float32]],
    config: TrainConfig,
    settings: MadePhaseSettings,
    select: Callable[[int], npt.NDArray[np.int64]],
    rng: np.random.Generator,
) -> tuple[Arrays, MadeStopper, list[float]]:
    """FedAvg rounds of the global MADE until the fleet's validation NLL rises."""
    stopper = MadeStopper(
        patience=settings.made_patience, max_rounds=settings.max_made_rounds
    )
    arrays, best, curve = start, start, []
    counts = [len(v) for v in made_val]
    while not stopper.stopped:
        state = init_aggregation(arrays, Weighting.FEDAVG)
        for i in select(stopper.rounds):
            cfg = config.model_copy(update={"seed": int(rng.integers(2**31))})
            res = train_made_local(made_config, arrays, made_train[i], config=cfg)
            state, _ = apply_update(
                state, DeviceDelta(f"dev{i}", res.delta, res.num_examples)
            )
        arrays = finalize_aggregation(state, arrays)
        loss = weighted_mean_loss(
            [made_nll(made_config, arrays, v) for v in made_val], counts
        )
        curve.append(loss)
        stopper = apply_validation_loss(stopper, loss)
        if stopper.improved:
            best = arrays
    return best, stopper, curve


def _split(
    n: int, fraction: float, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(train, validation) indices; at least one of each when n >= 2."""
    order = rng.permutation(n)
    n_val = min(n - 1, max(1, round(n * fraction))) if n >= 2 else 0
    return order[n_val:], order[:n_val] if n_val else order[:1]
