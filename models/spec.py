"""A model named in a config: a built-in name or an import path, and its tensor spec.

Both configs (the device's and the coordinator's ``[training]``) name the
model the same way: ``architecture`` is a built-in (``"mlp"``, ``"cnn"``) or
an import path ``"package.module:factory"``, and ``model_options`` are the
keyword arguments the factory is called with. A factory returns a
``torch.nn.Module`` (its ``state_dict`` is the model's weights, buffers
included) or, for a torch-free model, the weights themselves: a mapping of
name to NumPy array, or a sequence of arrays named by position (``"0"``,
``"1"``, ...); `ursa.models.reference` builds a named model's weights. No
torch is imported here.

A model's *tensor spec* is the ordered (name, shape, kind) of its weights,
kind ``"float"`` or ``"int"`` (integer counters such as BatchNorm's
``num_batches_tracked``). Two models fit each other when their specs are
equal; `first_mismatch` names the first tensor where they differ, so a
device or coordinator with the wrong model says exactly which tensor is
wrong (`ModelMismatchError`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from ursa.models.weights import FloatArray, WeightsMismatchError

__all__ = [
    "BUILTIN_MODELS",
    "IMPORT_PATH",
    "ModelMismatchError",
    "ModelSpecError",
    "TensorSpec",
    "check_architecture",
    "check_fits",
    "first_mismatch",
    "is_import_path",
    "load_factory",
    "spec_arrays",
    "tensor_spec",
]

BUILTIN_MODELS = ("mlp", "cnn")
"""Short names of the built-in classifiers (`ursa.models.registry`)."""
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH = rf"^{_NAME}(\.{_NAME})*:{_NAME}$"
_IMPORT_PATH = re.compile(IMPORT_PATH)

TensorSpec = tuple[tuple[str, tuple[int, ...], str], ...]
"""Ordered (name, shape, kind) per weight array; kind is "float" or "int"."""


class ModelSpecError(ValueError):
    """A model name that is neither built in nor an importable factory."""


class ModelMismatchError(WeightsMismatchError):
    """Two models' weights differ (names, shapes or dtypes).

    Attributes:
        tensor: The first tensor that differs (its name).
    """

    def __init__(self, tensor: str, detail: str) -> None:
        super().__init__(f"tensor {tensor!r}: {detail}")
        self.tensor = tensor
        self.detail = detail


def is_import_path(name: str) -> bool:
    """Whether ``name`` is a ``package.module:factory`` import path."""
    return bool(_IMPORT_PATH.match(name))


def check_architecture(name: str) -> str:
    """Return ``name`` if it is a built-in or an import path (config validator).

    Raises:
        ValueError: neither.
    """
    if name in BUILTIN_MODELS or is_import_path(name):
        return name
    raise ValueError(
        f"architecture {name!r} is neither built in {list(BUILTIN_MODELS)} "
        "nor an import path 'package.module:factory'"
    )


def load_factory(path: str) -> Callable[..., Any]:
    """Import the factory ``package.module:factory``.

    Raises:
        ModelSpecError: a malformed path, a module that does not import, or
            no callable of that name.
    """
    if not is_import_path(path):
        raise ModelSpecError(f"{path!r} is not an import path 'package.module:factory'")
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelSpecError(f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ModelSpecError(f"{module_name!r} has no callable {attribute!r}")
    return cast("Callable[..., Any]", factory)


def tensor_spec(arrays: Mapping[str, FloatArray]) -> TensorSpec:
    """The ordered (name, shape, kind) of ``arrays``."""
    return tuple(
        (
            name,
            tuple(int(d) for d in np.shape(a)),
            "int" if np.asarray(a).dtype.kind in "iu" else "float",
        )
        for name, a in arrays.items()
    )


def spec_arrays(spec: TensorSpec) -> dict[str, FloatArray]:
    """Read-only arrays of ``spec``'s names, shapes and kinds, holding no memory.

    Each is a zero broadcast to its shape (one value, whatever the shape), so
    a trainer's ``check_arrays`` can judge a signed spec as it judges a
    downloaded model, before any model is downloaded.
    """
    return {
        name: np.broadcast_to(
            np.zeros((), dtype=np.int64 if kind == "int" else np.float32), shape
        )
        for name, shape, kind in spec
    }


def first_mismatch(
    ours: TensorSpec,
    theirs: TensorSpec,
    *,
    ours_name: str = "this model",
    theirs_name: str = "the other model",
) -> ModelMismatchError | None:
    """The first tensor where ``theirs`` differs from ``ours`` (None: they fit)."""
    mine = {name: (shape, kind) for name, shape, kind in ours}
    other = {name: (shape, kind) for name, shape, kind in theirs}
    for name, (shape, kind) in mine.items():
        if name not in other:
            return ModelMismatchError(name, f"in {ours_name}, not in {theirs_name}")
        their_shape, their_kind = other[name]
        if shape != their_shape:
            return ModelMismatchError(
                name, f"shape {shape} in {ours_name}, {their_shape} in {theirs_name}"
            )
        if kind != their_kind:
            return ModelMismatchError(
                name, f"dtype {kind} in {ours_name}, {their_kind} in {theirs_name}"
            )
    for name in other:
        if name not in mine:
            return ModelMismatchError(name, f"in {theirs_name}, not in {ours_name}")
    if [n for n, _, _ in ours] != [n for n, _, _ in theirs]:
        return ModelMismatchError(
            ours[0][0], f"tensors in another order in {theirs_name}"
        )
    return None


def check_fits(
    ours: Mapping[str, FloatArray],
    theirs: Mapping[str, FloatArray],
    *,
    ours_name: str = "this device's model",
    theirs_name: str = "the federation's model",
) -> None:
    """Raise `ModelMismatchError` unless the two sets of weights fit each other."""
    mismatch = first_mismatch(
        tensor_spec(ours),
        tensor_spec(theirs),
        ours_name=ours_name,
        theirs_name=theirs_name,
    )
    if mismatch is not None:
        raise mismatch
