"""`FeddiskTrainer`: a device's two FedDisk phases over its `TorchTrainer`.

Phase ``"made"``: the device trains the federated global MADE (`model` is
``settings.made_model``) on its data flattened, minus a seeded validation
split of ``val_fraction`` (at least one sample, as the simulator's); each
round runs `train_made_local` (Adam) with its own seed (`round_seed`), and
`validation_loss` gives the NLL on the held-out split for the fleet's stop
rule (`ursa.edge_sdk.methods.feddisk`). `switch` then trains the local MADE
from seeded initial weights (`train_local_made`), the density-ratio
classifier and the per-sample weights on all local samples
(`feddisk_sample_weights`: cross-fitted, clipped, mean 1) and hands them to the
classifier's trainer. Phase ``"classifier"``: every call goes to that
trainer (`model` becomes its name), which weights its loss per sample.

The defaults are the simulator's (`ursa.lab.simulate.feddisk`); the
coordinator must build its initial MADE from `FeddiskSettings.made_model_config`.
torch is imported inside the methods only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.methods.feddisk.phased_trainer import Phase
from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.edge_sdk.module_trainer import ModuleTrainer
from ursa.edge_sdk.torch_trainer import TorchTrainer, round_seed
from ursa.edge_sdk.trainer import ClassCounts, LocalDelta, ModelTrainer
from ursa.models.weights import Arrays, spec_of

if TYPE_CHECKING:
    from ursa.edge_sdk.training import TrainConfig

__all__ = ["FeddiskSettings", "FeddiskTrainer"]


class FeddiskTrainer(ModelTrainer):
    """FedDisk on one device: the global MADE's rounds, then the weighted classifier.

    A `ModelTrainer` that holds the classifier's trainer (composed, not
    inherited) and has FedDisk's phases (`PhasedTrainer`, a protocol).

    Args:
        classifier: The phase-2 trainer; its data is the MADE's data too.
        settings: FedDisk's settings (default `FeddiskSettings()`).
        seed: The device's seed (validation split, round seeds, local MADE).
    """

    def __init__(
        self,
        classifier: TorchTrainer | ModuleTrainer,
        *,
        settings: FeddiskSettings | None = None,
        seed: int = 0,
    ) -> None:
        self.classifier = classifier
        self.settings = settings if settings is not None else FeddiskSettings()
        self.seed = seed
        self.phase: Phase = "made"
        self.model = self.settings.made_model
        self.wire_dtype = classifier.wire_dtype
        self._x = classifier.x.reshape(len(classifier.x), -1)
        train, val = _split(len(self._x), self.settings.val_fraction, seed)
        self.x_train, self.x_val = self._x[train], self._x[val]
        self.made_config = self.settings.made_model_config(self._x.shape[1])
        self._made_spec: tuple[tuple[str, tuple[int, ...]], ...] | None = None

    # --- both phases ----------------------------------------------------------

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """One round: a MADE round in phase 1, the classifier's in phase 2."""
        if self.phase == "classifier":
            return self.classifier.train_delta(
                round_index, global_arrays, delta_scale=delta_scale
            )
        from ursa.edge_sdk.training import train_made_local

        config = self._made_train_config(
            self.settings.made_epochs_per_round, round_seed(self.seed, round_index)
        )
        result = train_made_local(
            self.made_config,
            global_arrays,
            self.x_train,
            config=config,
            delta_scale=delta_scale,
        )
        metrics = {
            "mean_train_loss": result.mean_train_loss,
            "num_steps": float(result.num_steps),
        }
        return LocalDelta(result.delta, result.num_examples, metrics)

    def local_loss(self, global_arrays: Arrays) -> float:
        """Mean loss at the global model (MADE: NLL on the training split)."""
        if self.phase == "classifier":
            return self.classifier.local_loss(global_arrays)
        from ursa.edge_sdk.training import made_nll

        return made_nll(self.made_config, global_arrays, self.x_train)

    @property
    def evaluates(self) -> bool:
        """The classifier's evaluation split, in phase 2 (the MADE is not scored)."""
        return self.phase == "classifier" and self.classifier.evaluates

    def class_counts(self, global_arrays: Arrays) -> ClassCounts | None:
        """The classifier's per-class counts in phase 2; None in phase 1."""
        if self.phase != "classifier":
            return None
        return self.classifier.class_counts(global_arrays)

    def onnx(self, arrays: Arrays) -> bytes | None:
        """The classifier's export: the final model is the classifier's."""
        return self.classifier.onnx(arrays)

    def check_arrays(self, global_arrays: Arrays) -> None:
        """Raise ValueError unless the arrays fit the current phase's model."""
        if self.phase == "classifier":
            self.classifier.check_arrays(global_arrays)
        else:
            self._check_made(global_arrays)

    # --- phase 1 --------------------------------------------------------------

    def validation_loss(self, made_arrays: Arrays) -> tuple[float, int]:
        """The MADE's mean NLL on the validation split, and the split's size."""
        from ursa.edge_sdk.training import made_nll

        self._check_made(made_arrays)
        return made_nll(self.made_config, made_arrays, self.x_val), len(self.x_val)

    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        """Train the local MADE and the density-ratio classifier; enter phase 2.

        Returns the local MADE's epochs and
        `ursa.edge_sdk.methods.feddisk.sample_weights.weight_summary`
        prefixed ``weight_``: the share of raw weights at each clip bound
        (``weight_at_low``, ``weight_at_high``) and the weights' spread
        (``weight_min``, ``weight_max``, ``weight_std``, ``weight_p10``,
        ``weight_p90``).

        Raises:
            RuntimeError: already in phase 2.
            ValueError: ``global_made`` does not fit the MADE, or bad data.
        """
        if self.phase != "made":
            raise RuntimeError("FedDisk already switched to phase 2")
        if global_made is None:
            self._enter_phase_two(None)
            return {"local_made_epochs": 0.0}
        self._check_made(global_made)
        from ursa.edge_sdk.methods.feddisk.sample_weights import (
            feddisk_sample_weights,
            train_local_made,
        )
        from ursa.edge_sdk.training import TrainConfig
        from ursa.models.registry import initial_arrays

        settings = self.settings
        local = train_local_made(
            self.made_config,
            initial_arrays("made", self.made_config, seed=self.seed),
            self.x_train,
            self.x_val,
            config=self._made_train_config(
                settings.local_made_epochs_per_check, self.seed
            ),
            max_epochs=settings.local_made_max_epochs,
            patience=settings.local_made_patience,
        )
        result = feddisk_sample_weights(
            self.made_config,
            global_made,
            local.arrays,
            self._x,
            config=TrainConfig(
                epochs=settings.classifier_epochs,
                batch_size=settings.classifier_batch_size,
                lr=settings.classifier_lr,
                seed=self.seed,
            ),
            hidden_size=settings.classifier_hidden,
            clip=settings.clip,
            folds=settings.crossfit_folds,
        )
        self._enter_phase_two(result.weights)
        summary = {f"weight_{k}": v for k, v in result.summary().items()}
        return {"local_made_epochs": float(local.epochs), **summary}

    # --- phase 2 --------------------------------------------------------------

    def restore_weights(self, weights: npt.NDArray[np.float64] | None) -> None:
        """Enter phase 2 with weights persisted earlier (None: uniform).

        Raises:
            ValueError: not one finite non-negative weight per sample.
        """
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (len(self._x),):
                raise ValueError(f"weights of shape {w.shape}, need ({len(self._x)},)")
            if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
                raise ValueError("weights must be finite, non-negative, not all 0")
            weights = w
        self._enter_phase_two(weights)

    @property
    def sample_weights(self) -> npt.NDArray[np.float64] | None:
        """The classifier's sample weights in phase 2 (None before, or uniform)."""
        return self.classifier.sample_weights if self.phase == "classifier" else None

    # --- internals ------------------------------------------------------------

    def _enter_phase_two(self, weights: npt.NDArray[np.float64] | None) -> None:
        self.classifier.sample_weights = weights
        self.phase = "classifier"
        self.model = self.classifier.model

    def _made_train_config(self, epochs: int, seed: int) -> TrainConfig:
        from ursa.edge_sdk.training import TrainConfig

        return TrainConfig(
            epochs=epochs,
            batch_size=self.settings.made_batch_size,
            optimizer="adam",
            lr=self.settings.made_lr,
            seed=seed,
        )

    def _check_made(self, arrays: Arrays) -> None:
        if self._made_spec is None:
            from ursa.models.registry import initial_arrays

            self._made_spec = spec_of(initial_arrays("made", self.made_config, seed=0))
        if spec_of(arrays) != self._made_spec:
            raise ValueError(f"MADE weights do not fit {self.made_config}")


def _split(
    n: int, fraction: float, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(train, validation) indices; one sample is in both only when n == 1."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 1, max(1, round(n * fraction))) if n >= 2 else 0
    return order[n_val:], order[:n_val] if n_val else order[:1]
