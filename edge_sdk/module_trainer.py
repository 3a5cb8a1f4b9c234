"""`ModuleTrainer`: a device app trains its own ``torch.nn.Module``.

The app builds its model (any architecture; BatchNorm/GroupNorm included)
and hands it over with its data and, optionally, its loss, optimiser and
batch settings::

    trainer = ModuleTrainer(
        MyCnn(), x, y,
        loss=torch.nn.CrossEntropyLoss(reduction="none"),
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
        train={"epochs": 2, "batch_size": 32},
    )
    client = EdgeClient(config, y, trainer=trainer)

Each round loads the downloaded global weights into the module (its whole
``state_dict``: parameters and buffers), trains with
`ursa.edge_sdk.training.train_module` (FedDisk's per-sample weights and
CLIMB's delta scale included) and returns the delta. The coordinator's model
must be the same architecture: name it in its ``[training] architecture`` as
an import path (``"package.module:factory"``), or give initial weights made
from it. A downloaded model whose tensors differ (names, shapes, dtypes) is
refused with a `ModelMismatchError` naming the tensor, and the device sits
the key epoch out (``model_mismatch``). torch is imported on first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.torch_trainer import round_seed
from ursa.edge_sdk.trainer import ClassCounts, LocalDelta, ModelTrainer
from ursa.models.spec import check_fits
from ursa.models.weights import Arrays

if TYPE_CHECKING:
    from torch import nn

    from ursa.edge_sdk.training import (
        Evaluation,
        OptimizerFactory,
        OutputLoss,
        TrainConfig,
    )

__all__ = ["ModuleTrainer"]


class ModuleTrainer(ModelTrainer):
    """Local training of the app's own torch module on its data.

    Args:
        module: The model; its ``state_dict`` is what the federation averages.
        x: Local samples, batch first, in the shape the module takes.
        y: Targets: class indices (integers) or floats for the app's loss.
        loss: ``loss(outputs, targets)`` with one loss per sample
            (``reduction="none"``); default cross-entropy.
        optimizer: ``optimizer(parameters)`` builds each round's optimiser;
            default from ``train`` (``optimizer``, ``lr``, ``momentum``).
        train: `TrainConfig` or its fields (``epochs``, ``batch_size``,
            ``fedvc_samples``, ...); the seed is set per round.
        model: The wire name of the model (`ModelAvailable.model`).
        sample_weights: Per-sample weights (FedDisk), or None.
        wire_dtype: Upload precision.
        seed: The device's seed; round seeds derive from it.
        eval_x: The local evaluation split's samples (federated evaluation;
            `ursa.edge_sdk.fleet_eval.split_for_evaluation`), or None.
        eval_y: Its class labels.
        onnx_example: One sample (or a batch) in the shape the module takes;
            given, the final model is also saved as ONNX (``model.onnx``,
            input ``"x"`` of that shape with a dynamic batch) for
            onnxruntime devices. None: weights only, since an arbitrary
            module may not export.
    """

    proximal = True
    """FedProx's term is added to the loss (`train_proximal`)."""

    def __init__(
        self,
        module: nn.Module,
        x: npt.ArrayLike,
        y: npt.ArrayLike,
        *,
        loss: OutputLoss | None = None,
        optimizer: OptimizerFactory | None = None,
        train: TrainConfig | Mapping[str, Any] | None = None,
        model: str = "classifier",
        sample_weights: npt.ArrayLike | None = None,
        wire_dtype: Literal["float32", "float16"] = "float32",
        seed: int = 0,
        eval_x: npt.ArrayLike | None = None,
        eval_y: npt.ArrayLike | None = None,
        onnx_example: npt.ArrayLike | None = None,
    ) -> None:
        from ursa.edge_sdk.training import TrainConfig

        self.module = module
        self.x, self.y = _data(x, y)
        self.loss = loss
        self.optimizer = optimizer
        self._train = (
            train
            if isinstance(train, TrainConfig)
            else TrainConfig.model_validate(dict(train or {}))
        )
        self.model = model
        self.sample_weights = (
            None if sample_weights is None else np.asarray(sample_weights, np.float64)
        )
        self.wire_dtype = wire_dtype
        self.seed = seed
        self._own: Arrays | None = None
        self._eval: tuple[npt.NDArray[np.float32], npt.NDArray[Any]] | None = None
        if (eval_x is None) != (eval_y is None):
            raise ValueError("give eval_x and eval_y together")
        if eval_x is not None and eval_y is not None:
            self._eval = _data(eval_x, eval_y)
        self._onnx_shape = _sample_shape(onnx_example, self.x)

    @property
    def labels(self) -> npt.NDArray[np.int64]:
        """The class labels (integer targets) for Dubhe's registry.

        Raises:
            ValueError: float targets (give the client its labels yourself).
        """
        if self.y.dtype.kind not in "iu":
            raise ValueError("float targets: pass the device's labels to EdgeClient")
        return self.y.astype(np.int64)

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Train on ``x``, ``y`` from now on (FLICKER's resampled data)."""
        self.x, self.y = _data(x, y)

    @property
    def num_examples(self) -> int:
        """Local training samples."""
        return len(self.y)

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """`train_module` from ``global_arrays``; the delta times ``delta_scale``."""
        return self.train_proximal(
            round_index, global_arrays, delta_scale=delta_scale, mu=0.0
        )

    def train_proximal(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float, mu: float
    ) -> LocalDelta:
        """`train_delta` with FedProx's term: ``proximal_mu`` of `train_module`."""
        from ursa.edge_sdk.training import train_module

        result = train_module(
            self.module,
            global_arrays,
            self.x,
            self.y,
            config=self._train.model_copy(
                update={"seed": round_seed(self.seed, round_index)}
            ),
            loss=self.loss,
            optimizer=self.optimizer,
            sample_weights=self.sample_weights,
            delta_scale=delta_scale,
            proximal_mu=mu,
        )
        metrics = {
            "mean_train_loss": result.mean_train_loss,
            "num_steps": float(result.num_steps),
        }
        return LocalDelta(result.delta, result.num_examples, metrics)

    def evaluate(self, global_arrays: Arrays) -> Evaluation:
        """Loss (and accuracy for class targets) of the model on the local data."""
        from ursa.edge_sdk.training import evaluate_module

        return evaluate_module(
            self.module, global_arrays, self.x, self.y, loss=self.loss
        )

    @property
    def evaluates(self) -> bool:
        """Whether the device holds out an evaluation split of class labels."""
        return self._eval is not None and self._eval[1].dtype.kind in "iu"

    def class_counts(self, global_arrays: Arrays) -> ClassCounts | None:
        """Per-class correct and total counts on the evaluation split."""
        if self._eval is None or not self.evaluates:
            return None
        from ursa.edge_sdk.training import evaluate_module

        x, y = self._eval
        result = evaluate_module(self.module, global_arrays, x, y, loss=self.loss)
        return result.class_counts()

    def local_loss(self, global_arrays: Arrays) -> float:
        """CLIMB's ``f_i``: the mean per-sample loss at the global model."""
        return self.evaluate(global_arrays).mean_loss

    @property
    def features(self) -> int:
        """Features per local sample (``x`` flattened per sample)."""
        return int(np.prod(self.x.shape[1:], dtype=np.int64))

    def onnx(self, arrays: Arrays) -> bytes | None:
        """A copy of the module at ``arrays`` as ONNX, if ``onnx_example`` was given.

        The app's module itself is left as it was (a copy is exported).
        """
        if self._onnx_shape is None:
            return None
        import copy

        from ursa.models.onnx_export import export_onnx
        from ursa.models.registry import load_arrays

        module = copy.deepcopy(self.module)
        load_arrays(module, arrays)
        return export_onnx(module, self._onnx_shape)

    def check_arrays(self, global_arrays: Arrays) -> None:
        """Raise `ModelMismatchError` unless the weights fit the module's tensors."""
        if self._own is None:
            from ursa.models.registry import state_dict_to_arrays

            self._own = state_dict_to_arrays(self.module)
        check_fits(self._own, global_arrays)


def _sample_shape(
    example: npt.ArrayLike | None, x: npt.NDArray[np.float32]
) -> tuple[int, ...] | None:
    """One sample's shape from ``example`` (a sample or a batch of them).

    Raises:
        ValueError: the example's shape is not the local samples' shape.
    """
    if example is None:
        return None
    shape = np.shape(example)
    sample = tuple(int(d) for d in x.shape[1:])
    if shape == sample or (len(shape) == len(sample) + 1 and shape[1:] == sample):
        return sample
    raise ValueError(
        f"onnx_example has shape {shape}; the local samples have shape {sample}"
    )


def _data(
    x: npt.ArrayLike, y: npt.ArrayLike
) -> tuple[npt.NDArray[np.float32], npt.NDArray[Any]]:
    xs, ys = np.asarray(x, dtype=np.float32), np.asarray(y)
    if ys.ndim < 1 or len(xs) != len(ys) or len(ys) == 0:
        raise ValueError("need the same non-zero number of samples and targets")
    if ys.dtype.kind in "iu":
        return xs, ys.astype(np.int64)
    return xs, ys.astype(np.float32)
