"""The initial weights of a named model (`ursa.models.spec`) as NumPy arrays.

A built-in, or a factory returning a torch module, needs torch (imported
here only then); a factory returning arrays does not. The coordinator uses
this to build or check its version 0 against its ``[training] architecture``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ursa.models.seeding import torch_seeded
from ursa.models.spec import ModelSpecError, is_import_path, load_factory
from ursa.models.weights import Arrays, FloatArray

__all__ = ["arrays_of", "reference_arrays"]


def reference_arrays(
    architecture: str, options: Mapping[str, Any], *, seed: int = 0
) -> Arrays:
    """The (seeded) initial weights of a named model as NumPy arrays.

    A built-in or a factory returning a torch module needs torch; a factory
    returning arrays does not.

    Raises:
        ModelSpecError: unknown name, a factory that fails or returns no model.
    """
    if not is_import_path(architecture):
        from ursa.models.registry import ModelConfigError, initial_arrays

        try:
            return initial_arrays(architecture, options, seed=seed)
        except ModelConfigError as exc:
            raise ModelSpecError(str(exc)) from None
    factory = load_factory(architecture)
    try:
        with _seeded(seed):
            built = factory(**dict(options))
    except Exception as exc:  # the app's code: any failure is a setup error
        raise ModelSpecError(
            f"{architecture}(**{dict(options)}) failed: {exc}"
        ) from None
    return arrays_of(built, architecture)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's RNG around a factory call if the factory's module uses torch.

    torch is never imported here: only when the factory's module already
    did (`load_factory` imported it) is its RNG forked and seeded.
    """
    if "torch" not in sys.modules:
        yield
        return
    with torch_seeded(seed):
        yield


def arrays_of(built: object, architecture: str) -> Arrays:
    """The weights a factory returned: a torch module, a mapping or a sequence.

    Raises:
        ModelSpecError: anything else.
    """
    if hasattr(built, "state_dict") and "torch" in sys.modules:
        from torch import nn

        from ursa.models.registry import state_dict_to_arrays

        if isinstance(built, nn.Module):
            return state_dict_to_arrays(built)
    if isinstance(built, Mapping):
        return {str(k): _array(v, architecture) for k, v in built.items()}
    if isinstance(built, Sequence) and not isinstance(built, str | bytes):
        return {str(i): _array(v, architecture) for i, v in enumerate(built)}
    raise ModelSpecError(
        f"{architecture} returned {type(built).__name__}: need a torch.nn.Module, "
        "a mapping of arrays or a list of arrays"
    )


def _array(value: object, architecture: str) -> FloatArray:
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        return arr.astype(np.float32)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    raise ModelSpecError(f"{architecture}: an array of dtype {arr.dtype}")
