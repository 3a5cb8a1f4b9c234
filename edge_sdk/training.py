"""Local training on a device (torch, CPU): classifier rounds, MADE, binary classifier.

Every round starts from the global weights (numpy arrays), trains a fresh
model and returns the *delta* ``(local - global) * delta_scale`` as float32
arrays; the coordinator adds a weighted mean of deltas to the global model.

Conventions (they matter for the algorithms on top):

* **Per-sample weights** (FedDisk): normalised to mean 1 over the whole local
  data set given to the call, then each batch's loss is ``mean(w_i * l_i)``.
  The normalisation is global, not per batch, so a batch of low-weight
  samples moves the model less (per-batch normalisation would undo the
  weighting between batches). With full-batch training, zero weights on some
  samples give exactly the gradient of the mean loss over the others.
* **FedVC** (Dubhe §4.1): with ``fedvc_samples = k`` the round draws ``k``
  indices once (without replacement when the device has at least ``k``
  samples, with replacement otherwise) and every epoch passes over them.
  ``num_examples`` is then ``k`` for every device, so weighting by
  ``num_examples`` *is* FedVC's equal weighting; without FedVC it is the
  local data size (FedAvg).
* **Loss units**: ``mean_train_loss`` and `evaluate_loss` are mean per-sample
  losses (cross-entropy in nats; for MADE the NLL summed over dimensions).
* **Determinism**: shuffling and FedVC draws use ``numpy.random.default_rng(
  config.seed)``; dropout and initialisation use torch's RNG seeded with
  ``config.seed`` inside ``torch.random.fork_rng`` (the caller's global RNG is
  left untouched). Give every device and round its own seed. Training calls
  ``torch.set_num_threads(config.num_threads)`` (process-wide; 1 by default).
* **Your own module** (`train_module`, `evaluate_module`): any
  ``nn.Module`` with an optional loss ``loss(outputs, targets)`` returning
  per-sample losses (``reduction="none"``; a scalar loss is accepted only
  without per-sample weights) and an optional optimiser factory
  ``optimizer(parameters)``. Its whole ``state_dict`` is the model: float
  buffers move and are averaged like weights, integer ones (BatchNorm's
  ``num_batches_tracked``) travel as the batches counted (never scaled) and
  the coordinator keeps its own value. Targets are integers (classes:
  accuracy is reported) or floats (any loss).
* **Binary classifier** (`fit_binary_classifier`): inputs standardised with
  the training rows' mean and std, one ReLU hidden layer (``hidden_size=0``
  gives logistic regression) and a sigmoid output, trained with the weighted
  BCE. FedDisk's density-ratio classifier
  (`ursa.edge_sdk.methods.feddisk.sample_weights`) is one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from ursa.edge_sdk.trainer import ClassCounts
from ursa.models.cnn import CnnConfig
from ursa.models.made import Made, MadeConfig
from ursa.models.mlp import MlpConfig
from ursa.models.registry import build_model, load_arrays, parse_config
from ursa.models.registry import state_dict_to_arrays as _to_arrays
from ursa.models.seeding import torch_seeded
from ursa.models.weights import Arrays, FloatArray, WeightsMismatchError, subtract

_EVAL_BATCH = 1024

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
OutputLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(outputs, targets)``: per-sample losses, shape ``(n,)`` (or a mean)."""
OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]
"""``optimizer(model.parameters())``: a fresh optimiser for one round."""


class TrainingError(ValueError):
    """Training inputs that do not fit together (shapes, labels, weights)."""


class TrainConfig(BaseModel):
    """Hyper-parameters of one local training call (one round on a device)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: PositiveInt = 1
    batch_size: PositiveInt = 16
    lr: float = Field(default=0.05, gt=0.0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    fedvc_samples: PositiveInt | None = None
    seed: int = Field(default=0, ge=0)
    loss: Literal["ce", "focal"] = "ce"
    focal_gamma: float = Field(default=2.0, ge=0.0)
    num_threads: PositiveInt = 1


@dataclass(frozen=True)
class LocalResult:
    """What a device reports after a local training call.

    Attributes:
        delta: ``(local - global) * delta_scale`` per weight array (float32).
        num_examples: the aggregation weight: ``fedvc_samples`` or local size.
        mean_train_loss: mean (weighted) per-sample loss over all steps.
        num_samples_seen: samples processed over all epochs.
        num_steps: optimiser steps taken.
    """

    delta: Arrays
    num_examples: int
    mean_train_loss: float
    num_samples_seen: int
    num_steps: int


@dataclass(frozen=True)
class Evaluation:
    """Accuracy of a classifier on a labelled set.

    ``per_class_accuracy[c]`` is NaN for a class with no samples.
    """

    accuracy: float
    mean_loss: float
    per_class_accuracy: tuple[float, ...]
    per_class_count: tuple[int, ...]
    per_class_correct: tuple[int, ...] = ()

    def class_counts(self) -> ClassCounts:
        """The counts federated evaluation reports (`ursa.edge_sdk.fleet_eval`)."""
        return ClassCounts(
            np.asarray(self.per_class_correct, np.int64),
            np.asarray(self.per_class_count, np.int64),
        )


def train_local(
    model_name: str,
    model_config: Mapping[str, Any],
    global_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    config: TrainConfig,
    sample_weights: npt.ArrayLike | None = None,
    delta_scale: float = 1.0,
    proximal_mu: float = 0.0,
) -> LocalResult:
    """Train a classifier from the global weights on local data; return its delta.

    Args:
        model_name: ``"mlp"`` or ``"cnn"``.
        model_config: the model's config mapping (see `ursa.models.registry`).
        global_arrays: the global weights the round starts from.
        x: samples, ``(n, *input_shape)`` or flattened ``(n, input_dim)``.
        y: integer labels in ``[0, num_classes)``, shape ``(n,)``.
        config: training hyper-parameters.
        sample_weights: optional non-negative per-sample weights (FedDisk).
        delta_scale: multiplies the delta (CLIMB's ``w_i``).
        proximal_mu: FedProx's ``mu``: each step's loss gains
            ``(mu / 2) * ||w - w_global||^2`` (0: none, FedAvg's training).

    Raises:
        TrainingError: inconsistent shapes, labels or weights.
    """
    xt, yt = _dataset(_classifier_config(model_name, model_config), x, y)
    weights = _normalised_weights(sample_weights, len(xt))
    loss_fn = _focal_loss(config.focal_gamma) if config.loss == "focal" else _ce_loss
    model = _model_at(model_name, model_config, global_arrays)
    return _train_delta(
        model, global_arrays, xt, yt, weights, loss_fn,
        config=config, delta_scale=delta_scale, proximal_mu=proximal_mu,
    )  # fmt: skip


def train_module(
    model: nn.Module,
    global_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    config: TrainConfig,
    loss: OutputLoss | None = None,
    optimizer: OptimizerFactory | None = None,
    sample_weights: npt.ArrayLike | None = None,
    delta_scale: float = 1.0,
    proximal_mu: float = 0.0,
) -> LocalResult:
    """Train the app's own ``model`` from the global weights; return its delta.

    Args:
        model: any ``nn.Module``; the global weights are loaded into it first
            (its ``state_dict`` names and shapes must match them).
        global_arrays: the global weights the round starts from.
        x: samples in the shape the model takes (batch first).
        y: targets: class indices (integers) or float targets.
        config: epochs, batch size, FedVC, seed (and lr, optimiser when no
            ``optimizer`` is given).
        loss: ``loss(outputs, targets)`` per sample; default cross-entropy
            (``config.loss = "focal"``: the focal loss).
        optimizer: builds the round's optimiser from the parameters.
        sample_weights: optional non-negative per-sample weights (FedDisk).
        delta_scale: multiplies the delta (CLIMB's ``w_i``).
        proximal_mu: FedProx's ``mu`` (as for `train_local`).

    Raises:
        TrainingError: inconsistent shapes or weights, or weights that do not
            fit the model.
    """
    xt, yt = _module_dataset(x, y)
    weights = _normalised_weights(sample_weights, len(xt))
    if loss is None:
        loss_fn = (
            _focal_loss(config.focal_gamma) if config.loss == "focal" else _ce_loss
        )
    else:
        loss_fn = _output_loss(loss, weighted=sample_weights is not None)
    _load(model, global_arrays)
    return _train_delta(
        model, global_arrays, xt, yt, weights, loss_fn,
        config=config, delta_scale=delta_scale, optimizer=optimizer,
        proximal_mu=proximal_mu,
    )  # fmt: skip


def evaluate_module(
    model: nn.Module,
    arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    loss: OutputLoss | None = None,
) -> Evaluation:
    """Mean loss (and, for integer targets, accuracy) of ``model`` at ``arrays``.

    Accuracy and the per-class figures are NaN/empty for float targets.
    """
    xt, yt = _module_dataset(x, y)
    if len(yt) == 0:
        raise TrainingError("cannot evaluate on an empty set")
    _load(model, arrays)
    outputs = _batched(model, xt, lambda m, xb: m(xb))
    if loss is None:
        mean_loss = float(F.cross_entropy(outputs, yt).item())
    else:
        mean_loss = float(loss(outputs, yt).mean().item())
    if yt.dtype != torch.int64 or outputs.ndim != 2:
        return Evaluation(float("nan"), mean_loss, (), ())
    return _classification(outputs, yt, outputs.shape[1], mean_loss)


def evaluate_loss(
    model_name: str,
    model_config: Mapping[str, Any],
    arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
) -> float:
    """Return the mean cross-entropy (nats per sample) of the model at ``arrays``.

    CLIMB's dual step uses this as the device's ``f_i`` at the global model.
    """
    return evaluate(model_name, model_config, arrays, x, y).mean_loss


def evaluate(
    model_name: str,
    model_config: Mapping[str, Any],
    arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    y: npt.ArrayLike,
) -> Evaluation:
    """Return accuracy, per-class accuracy and mean cross-entropy at ``arrays``."""
    parsed = _classifier_config(model_name, model_config)
    num_classes = parsed.num_classes
    xt, yt = _dataset(parsed, x, y)
    if len(yt) == 0:
        raise TrainingError("cannot evaluate on an empty set")
    model = _model_at(model_name, model_config, arrays)
    logits = _batched(model, xt, lambda m, xb: m(xb))
    loss = float(F.cross_entropy(logits, yt).item())
    return _classification(logits, yt, num_classes, loss)


def _classification(
    logits: torch.Tensor, yt: torch.Tensor, num_classes: int, loss: float
) -> Evaluation:
    correct = (logits.argmax(dim=1) == yt).numpy()
    labels = yt.numpy()
    counts = np.bincount(labels, minlength=num_classes)
    hits = np.bincount(
        labels, weights=correct.astype(np.float64), minlength=num_classes
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = hits / counts
    return Evaluation(
        accuracy=float(correct.mean()),
        mean_loss=loss,
        per_class_accuracy=tuple(float(a) for a in per_class),
        per_class_count=tuple(int(c) for c in counts),
        per_class_correct=tuple(int(h) for h in hits),
    )


def train_made_local(
    model_config: Mapping[str, Any],
    global_arrays: Mapping[str, FloatArray],
    x: npt.ArrayLike,
    *,
    config: TrainConfig,
    delta_scale: float = 1.0,
) -> LocalResult:
    """Train a MADE from ``global_arrays`` on local samples; return its delta.

    The same call serves the local MADE (start from `initial_arrays` and add
    the delta) and the federated global MADE rounds. The loss is the NLL per
    sample; Adam suits it better than plain SGD.
    """
    xt = _features(x, _made_config(model_config).input_shape)
    weights = torch.ones(len(xt))
    model = _model_at("made", model_config, global_arrays)
    return _train_delta(
        model, global_arrays, xt, torch.zeros(len(xt)), weights,
        _made_loss, config=config, delta_scale=delta_scale,
    )  # fmt: skip


def made_nll(
    model_config: Mapping[str, Any], arrays: Mapping[str, FloatArray], x: npt.ArrayLike
) -> float:
    """Return the MADE's mean negative log-likelihood per sample (validation loss)."""
    return float(-made_conditional_log_probs(model_config, arrays, x).sum(1).mean())


def made_conditional_log_probs(
    model_config: Mapping[str, Any], arrays: Mapping[str, FloatArray], x: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """Return ``log p(x_d | x_<d)`` per sample and dimension, shape ``(n, D)``."""
    model = _model_at("made", model_config, arrays)
    xt = _features(x, _made_config(model_config).input_shape)
    out: npt.NDArray[np.float64] = _batched(model, xt, _made_conditionals).numpy()
    return out.astype(np.float64)


def made_sample(
    model_config: Mapping[str, Any],
    arrays: Mapping[str, FloatArray],
    n: int,
    *,
    seed: int,
) -> npt.NDArray[np.float32]:
    """Draw ``n`` samples from the MADE (flattened, shape ``(n, D)``), seeded."""
    model = _model_at("made", model_config, arrays)
    assert isinstance(model, Made)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    out: npt.NDArray[np.float32] = model.sample(n, generator).numpy()
    return out.astype(np.float32)


class BinaryClassifier:
    """A trained binary classifier ``h(u) = P(positive | u)`` (torch inside)."""

    def __init__(self, net: nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        self._net, self._mean, self._std = net, mean, std

    def prob_positive(self, u: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Return ``P(positive | u)`` per row of ``u``."""
        ut = (_features(u) - self._mean) / self._std
        self._net.eval()
        with torch.no_grad():
            probs: npt.NDArray[np.float64] = torch.sigmoid(self._net(ut)[:, 0]).numpy()
        return probs.astype(np.float64)


def fit_binary_classifier(
    positive: npt.ArrayLike,
    negative: npt.ArrayLike,
    *,
    config: TrainConfig,
    hidden_size: int = 100,
) -> BinaryClassifier:
    """Train a `BinaryClassifier`: ``positive`` rows (label 1) vs ``negative`` (0).

    Raises:
        TrainingError: empty inputs, or rows of different widths.
    """
    pos, neg = _features(positive), _features(negative)
    if (
        pos.ndim != 2
        or pos.shape[1:] != neg.shape[1:]
        or len(pos) == 0
        or len(neg) == 0
    ):
        raise TrainingError(f"rows must be non-empty (n, d): {pos.shape}, {neg.shape}")
    if hidden_size < 0:
        raise TrainingError(f"hidden_size must be >= 0, got {hidden_size}")
    u = torch.cat([pos, neg])
    labels = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))])
    mean, std = u.mean(dim=0), u.std(dim=0).clamp_min(1e-6)
    dim = u.shape[1]
    torch.set_num_threads(config.num_threads)
    with torch_seeded(config.seed):
        if hidden_size > 0:
            net: nn.Module = nn.Sequential(
                nn.Linear(dim, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 1)
            )
        else:
            net = nn.Linear(dim, 1)
        _fit(net, (u - mean) / std, labels, torch.ones(len(u)), _bce_loss, config)
    return BinaryClassifier(net, mean, std)


# -- internals -----------------------------------------------------------------


def _train_delta(
    model: nn.Module,
    global_arrays: Mapping[str, FloatArray],
    xt: torch.Tensor,
    yt: torch.Tensor,
    weights: torch.Tensor,
    loss_fn: LossFn,
    *,
    config: TrainConfig,
    delta_scale: float,
    optimizer: OptimizerFactory | None = None,
    proximal_mu: float = 0.0,
) -> LocalResult:
    """Train ``model`` (the global weights loaded) and return the scaled delta.

    Integer buffers are not scaled: their delta is the batches counted.
    """
    if not np.isfinite(delta_scale):
        raise TrainingError(f"delta_scale must be finite, got {delta_scale}")
    if not np.isfinite(proximal_mu) or proximal_mu < 0.0:
        raise TrainingError(f"proximal_mu must be finite and >= 0, got {proximal_mu}")
    if len(xt) == 0:
        raise TrainingError("cannot train on an empty data set")
    torch.set_num_threads(config.num_threads)
    with torch_seeded(config.seed):
        loss, seen, steps = _fit(
            model, xt, yt, weights, loss_fn, config, optimizer, proximal_mu
        )
    start = {k: _native(v) for k, v in global_arrays.items()}
    delta = subtract(_to_arrays(model), start)
    if delta_scale != 1.0:
        delta = {
            k: v if v.dtype.kind in "iu" else v * np.float32(delta_scale)
            for k, v in delta.items()
        }
    num_examples = config.fedvc_samples or len(xt)
    return LocalResult(delta, num_examples, loss, seen, steps)


def _fit(
    model: nn.Module,
    xt: torch.Tensor,
    yt: torch.Tensor,
    weights: torch.Tensor,
    loss_fn: LossFn,
    config: TrainConfig,
    optimizer: OptimizerFactory | None = None,
    proximal_mu: float = 0.0,
) -> tuple[float, int, int]:
    """Run the epochs; return (mean weighted loss, samples seen, steps).

    With ``proximal_mu`` > 0 each step minimises the loss plus FedProx's
    ``(mu / 2) * ||w - w_start||^2`` over the trainable parameters, ``w_start``
    the weights the round began from; the reported loss is the data's alone.
    """
    proximal = _proximal_term(model, proximal_mu)
    rng = np.random.default_rng(config.seed)
    n = len(xt)
    if config.fedvc_samples is None:
        chosen = np.arange(n)
    else:
        k = config.fedvc_samples
        chosen = rng.choice(n, size=k, replace=n < k)
    if optimizer is None:
        optimiser = _optimiser(model, config)
    else:
        optimiser = optimizer(model.parameters())
    model.train()
    total, seen, steps = 0.0, 0, 0
    for _ in range(config.epochs):
        order = rng.permutation(chosen)
        for start in range(0, len(order), config.batch_size):
            idx = torch.from_numpy(order[start : start + config.batch_size])
            per_sample = loss_fn(model, xt[idx], yt[idx]) * weights[idx]
            loss = per_sample.mean()
            if proximal is not None:
                loss = loss + proximal()
            optimiser.zero_grad()
            torch.autograd.backward(loss)
            optimiser.step()
            total += float(per_sample.detach().sum())
            seen += len(idx)
            steps += 1
    return total / seen, seen, steps


def _proximal_term(model: nn.Module, mu: float) -> Callable[[], torch.Tensor] | None:
    """FedProx's ``(mu / 2) * ||w - w_start||^2`` now (None when mu is 0)."""
    if mu == 0.0:
        return None
    pairs = [(p, p.detach().clone()) for p in model.parameters() if p.requires_grad]

    def term() -> torch.Tensor:
        total = torch.zeros(())
        for p, start in pairs:
            total = total + ((p - start) ** 2).sum()
        return total * (mu / 2.0)

    return term


def _optimiser(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(
            model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
    return torch.optim.SGD(
        model.parameters(),
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )


def _ce_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(xb), yb, reduction="none")


def _focal_loss(gamma: float) -> LossFn:
    def loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        log_pt = F.log_softmax(model(xb), dim=1).gather(1, yb[:, None])[:, 0]
        return -((1.0 - log_pt.exp()) ** gamma) * log_pt

    return loss


def _made_loss(model: nn.Module, xb: torch.Tensor, _yb: torch.Tensor) -> torch.Tensor:
    return -_made_conditionals(model, xb).sum(dim=1)


def _made_conditionals(model: nn.Module, xb: torch.Tensor) -> torch.Tensor:
    assert isinstance(model, Made)
    return model.conditional_log_probs(xb)


def _bce_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(xb)[:, 0], yb, reduction="none")


def _model_at(
    name: str, config: Mapping[str, Any], arrays: Mapping[str, FloatArray]
) -> nn.Module:
    model = build_model(name, config, seed=0)
    load_arrays(model, arrays)
    return model


def _load(model: nn.Module, arrays: Mapping[str, FloatArray]) -> None:
    try:
        load_arrays(model, arrays)
    except WeightsMismatchError as exc:
        raise TrainingError(f"the weights do not fit the model: {exc}") from None


def _native(value: FloatArray) -> FloatArray:
    arr = np.asarray(value)
    return arr.astype(np.int64 if arr.dtype.kind in "iu" else np.float32)


def _output_loss(loss: OutputLoss, *, weighted: bool) -> LossFn:
    """The app's ``loss(outputs, targets)`` as a per-sample `LossFn`."""

    def per_sample(
        model: nn.Module, xb: torch.Tensor, yb: torch.Tensor
    ) -> torch.Tensor:
        out = loss(model(xb), yb)
        if out.ndim == 0 and not weighted:
            return out.expand(len(yb))
        if out.shape != (len(yb),):
            raise TrainingError(
                f"the loss returned shape {tuple(out.shape)}: per-sample weights "
                f"need one loss per sample, ({len(yb)},) (reduction='none')"
            )
        return out

    return per_sample


def _module_dataset(
    x: npt.ArrayLike, y: npt.ArrayLike
) -> tuple[torch.Tensor, torch.Tensor]:
    xt, targets = _features(x), np.asarray(y)
    if len(xt) != len(targets):
        raise TrainingError(f"x has {len(xt)} samples but y has {len(targets)}")
    if np.issubdtype(targets.dtype, np.integer):
        return xt, torch.from_numpy(targets.astype(np.int64))
    if not np.issubdtype(targets.dtype, np.floating):
        raise TrainingError(f"y must be integers or floats, got {targets.dtype}")
    return xt, torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float32))


def _batched(
    model: nn.Module,
    xt: torch.Tensor,
    fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        parts = [
            fn(model, xt[i : i + _EVAL_BATCH]) for i in range(0, len(xt), _EVAL_BATCH)
        ]
    return torch.cat(parts) if parts else torch.zeros(0)


def _classifier_config(
    model_name: str, model_config: Mapping[str, Any]
) -> MlpConfig | CnnConfig:
    parsed = parse_config(model_name, model_config)
    if isinstance(parsed, MadeConfig):
        raise TrainingError("MADE is a density model: use train_made_local")
    return parsed


def _made_config(model_config: Mapping[str, Any]) -> MadeConfig:
    parsed = parse_config("made", model_config)
    assert isinstance(parsed, MadeConfig)
    return parsed


def _features(
    x: npt.ArrayLike, sample_shape: tuple[int, ...] | None = None
) -> torch.Tensor:
    arr = np.asarray(x, dtype=np.float32)
    if arr.ndim < 1:
        raise TrainingError("x must have a sample dimension")
    if sample_shape is not None and (
        arr.ndim < 2 or int(np.prod(arr.shape[1:])) != int(np.prod(sample_shape))
    ):
        raise TrainingError(
            f"x of shape {arr.shape} does not hold samples of {sample_shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise TrainingError("x contains NaN or infinite values")
    return torch.from_numpy(np.ascontiguousarray(arr))


def _dataset(
    parsed: MlpConfig | CnnConfig, x: npt.ArrayLike, y: npt.ArrayLike
) -> tuple[torch.Tensor, torch.Tensor]:
    xt, labels = _features(x, parsed.input_shape), np.asarray(y)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise TrainingError(
            f"y must be 1-D integers, got {labels.dtype} {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= parsed.num_classes):
        raise TrainingError(f"labels must lie in [0, {parsed.num_classes})")
    if len(xt) != len(labels):
        raise TrainingError(f"x has {len(xt)} samples but y has {len(labels)}")
    return xt, torch.from_numpy(labels.astype(np.int64))


def _normalised_weights(weights: npt.ArrayLike | None, n: int) -> torch.Tensor:
    if weights is None:
        return torch.ones(n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise TrainingError(f"sample_weights has shape {w.shape}, expected ({n},)")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise TrainingError("sample_weights must be finite and non-negative")
    if w.sum() <= 0:
        raise TrainingError("sample_weights are all zero")
    return torch.from_numpy((w / w.mean()).astype(np.float32))
