"""`TorchTrainer`: the device's `ModelTrainer` over `ursa.edge_sdk.training` (torch).

It holds the device's local data (never sent) and trains the named model
(``mlp`` / ``cnn``) from each downloaded global version with
`ursa.edge_sdk.training.train_local`: the configured epochs, batch size,
optimiser and FedVC sample count, optional per-sample weights (FedDisk) and
``delta_scale`` (CLIMB's ``w_i``: the method's `TrainPlan`, from the
``[[methods]]`` table). Each round uses its
own seed (`round_seed`: the device seed and the round), so a run is
reproducible. CLIMB's ``f_i`` is `evaluate_loss` over the local data at the
global model. torch is imported on first use, not with this module.

The client uploads the delta as float32, or float16 with
``wire_dtype="float16"`` (half the bytes; deltas are small, so the rounding,
about 1e-3 relative, is far below the SGD noise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.trainer import ClassCounts, LocalDelta, ModelTrainer
from ursa.models.spec import ModelMismatchError, check_fits
from ursa.models.weights import Arrays

if TYPE_CHECKING:
    from ursa.edge_sdk.training import TrainConfig

__all__ = ["TorchTrainer", "round_seed"]


def round_seed(device_seed: int, round_index: int) -> int:
    """A per-round training seed (non-negative, < 2**31)."""
    state = np.random.SeedSequence([device_seed, round_index]).generate_state(1)
    return int(state[0]) & 0x7FFFFFFF


class TorchTrainer(ModelTrainer):
    """Local training of a classifier on this device's data (torch, CPU).

    Args:
        x: Local samples, ``(n, *input_shape)`` or flattened.
        y: Local labels (class indices).
        architecture: ``"mlp"`` or ``"cnn"`` (`ursa.models.registry`).
        model_config: The architecture's config, e.g. ``{"input_dim": 64,
            "num_classes": 10}``; must match the coordinator's weights.
        train: Local training hyper-parameters (`TrainConfig`; default if None).
        model: The wire name of the model (`ModelAvailable.model`).
        sample_weights: Per-sample weights (FedDisk), or None.
        wire_dtype: Upload precision.
        seed: The device's seed; round seeds derive from it.
        eval_x: The local evaluation split's samples (federated evaluation;
            `ursa.edge_sdk.fleet_eval.split_for_evaluation`), or None.
        eval_y: Its labels.
    """

    proximal = True
    """FedProx's term is added to the loss (`train_proximal`)."""

    def __init__(
        self,
        x: npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        architecture: str = "mlp",
        model_config: Mapping[str, Any],
        train: TrainConfig | None = None,
        model: str = "classifier",
        sample_weights: npt.ArrayLike | None = None,
        wire_dtype: Literal["float32", "float16"] = "float32",
        seed: int = 0,
        eval_x: npt.ArrayLike | None = None,
        eval_y: npt.ArrayLike | None = None,
    ) -> None:
        self.x = np.asarray(x, dtype=np.float32)
        self.y = np.asarray(y, dtype=np.int64)
        if self.y.ndim != 1 or len(self.x) != len(self.y) or len(self.y) == 0:
            raise ValueError("need the same non-zero number of samples and labels")
        self.architecture = architecture
        self.model_config = dict(model_config)
        self._train = train
        self.model = model
        self.sample_weights = (
            None if sample_weights is None else np.asarray(sample_weights, np.float64)
        )
        self.wire_dtype = wire_dtype
        self.seed = seed
        self.eval_x: npt.NDArray[np.float32] | None = None
        self.eval_y: npt.NDArray[np.int64] | None = None
        if (eval_x is None) != (eval_y is None):
            raise ValueError("give eval_x and eval_y together")
        if eval_x is not None and eval_y is not None:
            self.eval_x = np.asarray(eval_x, dtype=np.float32)
            self.eval_y = np.asarray(eval_y, dtype=np.int64)
            if self.eval_y.ndim != 1 or len(self.eval_x) != len(self.eval_y):
                raise ValueError(
                    "need the same number of evaluation samples and labels"
                )
        self._own: Arrays | None = None

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Train on ``x``, ``y`` from now on (FLICKER's resampled data)."""
        x, y = np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)
        if y.ndim != 1 or len(x) != len(y) or len(y) == 0:
            raise ValueError("need the same non-zero number of samples and labels")
        self.x, self.y = x, y

    @property
    def num_examples(self) -> int:
        """Local training samples."""
        return len(self.y)

    def _config(self, round_index: int) -> TrainConfig:
        from ursa.edge_sdk.training import TrainConfig

        base = self._train if self._train is not None else TrainConfig()
        return base.model_copy(update={"seed": round_seed(self.seed, round_index)})

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """`train_local` from ``global_arrays``; the delta times ``delta_scale``."""
        return self.train_proximal(
            round_index, global_arrays, delta_scale=delta_scale, mu=0.0
        )

    def train_proximal(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float, mu: float
    ) -> LocalDelta:
        """`train_delta` with FedProx's term: ``proximal_mu`` of `train_local`."""
        from ursa.edge_sdk.training import train_local

        result = train_local(
            self.architecture,
            self.model_config,
            global_arrays,
            self.x,
            self.y,
            config=self._config(round_index),
            sample_weights=self.sample_weights,
            delta_scale=delta_scale,
            proximal_mu=mu,
        )
        metrics = {
            "mean_train_loss": result.mean_train_loss,
            "num_steps": float(result.num_steps),
        }
        return LocalDelta(result.delta, result.num_examples, metrics)

    def local_loss(self, global_arrays: Arrays) -> float:
        """Mean cross-entropy (nats per sample) of the local data at the model."""
        from ursa.edge_sdk.training import evaluate_loss

        return evaluate_loss(
            self.architecture, self.model_config, global_arrays, self.x, self.y
        )

    @property
    def evaluates(self) -> bool:
        """Whether the device holds out an evaluation split."""
        return self.eval_y is not None and len(self.eval_y) > 0

    def class_counts(self, global_arrays: Arrays) -> ClassCounts | None:
        """Per-class correct and total counts on the evaluation split."""
        if self.eval_x is None or self.eval_y is None or not len(self.eval_y):
            return None
        from ursa.edge_sdk.training import evaluate

        result = evaluate(
            self.architecture,
            self.model_config,
            global_arrays,
            self.eval_x,
            self.eval_y,
        )
        return result.class_counts()

    @property
    def features(self) -> int:
        """Features per local sample (``x`` flattened per sample)."""
        return int(np.prod(self.x.shape[1:], dtype=np.int64))

    def model_features(self, global_arrays: Arrays) -> int | None:
        """Features per sample the global model takes.

        An MLP's are its first weight matrix's columns, whatever the device's
        own ``model_config`` says; other architectures take their configured
        input shape when the arrays fit it (None when they do not).
        """
        if self.architecture == "mlp":
            first = next((a for a in global_arrays.values() if a.ndim == 2), None)
            return None if first is None else int(first.shape[1])
        try:
            self.check_arrays(global_arrays)
        except ValueError:
            return None
        from ursa.models.registry import input_shape_of

        shape = input_shape_of(self.architecture, self.model_config)
        return int(np.prod(shape, dtype=np.int64))

    def onnx(self, arrays: Arrays) -> bytes:
        """The built-in architecture at ``arrays`` as ONNX (`export_arrays_to_onnx`)."""
        from ursa.models.onnx_export import export_arrays_to_onnx

        return export_arrays_to_onnx(self.architecture, self.model_config, arrays)

    def check_arrays(self, global_arrays: Arrays) -> None:
        """Raise `ModelMismatchError` (naming the tensor) unless the arrays fit.

        Names, shapes and dtypes (float or integer) must equal the model's.
        """
        if self._own is None:
            from ursa.models.registry import initial_arrays

            self._own = initial_arrays(self.architecture, self.model_config, seed=0)
        try:
            check_fits(self._own, global_arrays)
        except ModelMismatchError as exc:
            raise ModelMismatchError(
                exc.tensor,
                f"{exc.detail} (global weights do not fit "
                f"{self.architecture} {self.model_config})",
            ) from None
