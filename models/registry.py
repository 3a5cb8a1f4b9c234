"""Build models by name and move their weights between torch and numpy.

A model is named by a string (``"mlp"``, ``"cnn"``, ``"made"``, or an import
path ``"package.module:factory"``, `ursa.models.spec`) plus a plain JSON-able
config mapping (a factory's keyword arguments), so the coordinator can
describe the model on the wire without torch; the device builds it here.

A model's weights are its whole ``state_dict``: parameters and buffers.
Float buffers (BatchNorm's running mean and variance) travel and are
averaged like weights; integer buffers (``num_batches_tracked``) travel as
int64 and the coordinator keeps its own value (`ursa.coordinator.aggregation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pydantic
import torch
from torch import nn

from ursa.models.cnn import Cnn, CnnConfig
from ursa.models.made import Made, MadeConfig
from ursa.models.mlp import Mlp, MlpConfig
from ursa.models.seeding import torch_seeded
from ursa.models.spec import ModelSpecError, is_import_path, load_factory
from ursa.models.weights import Arrays, FloatArray, WeightsMismatchError

ModelConfig = MlpConfig | CnnConfig | MadeConfig

_CONFIGS: dict[str, type[MlpConfig] | type[CnnConfig] | type[MadeConfig]] = {
    "mlp": MlpConfig,
    "cnn": CnnConfig,
    "made": MadeConfig,
}
MODEL_NAMES = tuple(_CONFIGS)


class ModelConfigError(ValueError):
    """Unknown model name or a config the model rejects."""


def parse_config(name: str, config: Mapping[str, Any]) -> ModelConfig:
    """Validate ``config`` for the model ``name`` into its frozen config class.

    Raises:
        ModelConfigError: unknown name or invalid config.
    """
    if name not in _CONFIGS:
        raise ModelConfigError(f"unknown model {name!r}; known: {list(MODEL_NAMES)}")
    try:
        return _CONFIGS[name].model_validate(dict(config))
    except pydantic.ValidationError as exc:
        raise ModelConfigError(f"invalid config for {name!r}: {exc}") from exc


def build_model(
    name: str, config: Mapping[str, Any] | ModelConfig, *, seed: int | None = None
) -> nn.Module:
    """Build the model ``name`` from its config (a mapping or config object).

    Args:
        name: ``"mlp"``, ``"cnn"``, ``"made"`` or ``"package.module:factory"``.
        config: the model's config fields, e.g. ``{"input_dim": 64,
            "num_classes": 10}`` (a factory's keyword arguments).
        seed: seeds the initial weights (without touching torch's global RNG);
            ``None`` uses torch's current global RNG.

    Raises:
        ModelConfigError: unknown name or invalid config, or a factory that
            fails or builds no ``nn.Module``.
    """
    if is_import_path(name) and not isinstance(
        config, MlpConfig | CnnConfig | MadeConfig
    ):
        return _from_factory(name, config, seed)
    if isinstance(config, MlpConfig | CnnConfig | MadeConfig):
        if _CONFIGS.get(name) is not type(config):
            raise ModelConfigError(f"{type(config).__name__} is not a {name!r} config")
        parsed: ModelConfig = config
    else:
        parsed = parse_config(name, config)
    if seed is None:
        return _construct(parsed)
    with torch_seeded(seed):
        return _construct(parsed)


def _from_factory(path: str, config: Mapping[str, Any], seed: int | None) -> nn.Module:
    try:
        factory = load_factory(path)
    except ModelSpecError as exc:
        raise ModelConfigError(str(exc)) from None
    try:
        if seed is None:
            built = factory(**dict(config))
        else:
            with torch_seeded(seed):
                built = factory(**dict(config))
    except Exception as exc:  # the app's code: any failure is a config error
        raise ModelConfigError(f"{path}(**{dict(config)}) failed: {exc}") from None
    if not isinstance(built, nn.Module):
        raise ModelConfigError(f"{path} built a {type(built).__name__}, no nn.Module")
    return built


def _construct(config: ModelConfig) -> nn.Module:
    if isinstance(config, MlpConfig):
        return Mlp(config)
    if isinstance(config, CnnConfig):
        return Cnn(config)
    return Made(config)


def input_shape_of(name: str, config: Mapping[str, Any]) -> tuple[int, ...]:
    """Return the shape of one input sample (without the batch dimension)."""
    return parse_config(name, config).input_shape


def initial_arrays(name: str, config: Mapping[str, Any], *, seed: int) -> Arrays:
    """Return the seeded initial weights of a model as numpy arrays."""
    return state_dict_to_arrays(build_model(name, config, seed=seed))


def state_dict_to_arrays(model: nn.Module) -> Arrays:
    """Copy a model's ``state_dict`` into ordered numpy arrays.

    Float tensors become float32, integer ones (``num_batches_tracked``) int64.

    Raises:
        WeightsMismatchError: a tensor that is neither (bool, complex).
    """
    out: Arrays = {}
    for key, tensor in model.state_dict().items():
        value = tensor.detach().cpu()
        if torch.is_floating_point(value):
            out[key] = value.numpy().astype(np.float32, copy=True)
        elif not value.is_complex() and value.dtype != torch.bool:
            out[key] = value.numpy().astype(np.int64, copy=True)
        else:
            raise WeightsMismatchError(f"state entry {key!r} has dtype {value.dtype}")
    return out


def load_arrays(model: nn.Module, arrays: Mapping[str, FloatArray]) -> None:
    """Load numpy arrays into a model in place (names and shapes must match).

    Raises:
        WeightsMismatchError: missing, unexpected or mis-shaped arrays.
    """
    state = model.state_dict()
    if state.keys() != arrays.keys():
        diff = sorted(set(state) ^ set(arrays))
        raise WeightsMismatchError(f"weights do not fit the model; differing: {diff}")
    new_state: dict[str, torch.Tensor] = {}
    for key, current in state.items():
        arr = np.asarray(arrays[key])
        if tuple(arr.shape) != tuple(current.shape):
            raise WeightsMismatchError(
                f"{key!r}: shape {tuple(arr.shape)}, model has {tuple(current.shape)}"
            )
        if torch.is_floating_point(current):
            new_state[key] = torch.from_numpy(np.array(arr, dtype=np.float32))
        else:
            new_state[key] = torch.from_numpy(np.array(arr, dtype=np.int64)).to(
                current.dtype
            )
    model.load_state_dict(new_state)
