"""The federation's weights file loaded into the app's own ``torch.nn.Module``.

A device saves the final global model as ``<state_dir>/final/model.ursw``
(`ursa.edge_sdk.federation_end`), the coordinator as ``model.ursw`` in its
final folder. An app that trained its own module (`ModuleTrainer`) serves
it by building the same module and loading the file::

    from ursa.models.module_weights import load_weights

    model = MyNet()
    load_weights(model, state_dir / "final")      # or the file itself
    model.eval()

Names, shapes and dtypes must match the module's ``state_dict``; a file of
another architecture is refused with `WeightsMismatchError` naming the
tensor, before the module is changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ursa.models.weights import (
    WEIGHTS_FILENAME,
    Arrays,
    WeightsFormatError,
    arrays_from_bytes,
)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["WEIGHTS_FILENAME", "load_weights", "read_weights"]


def read_weights(path: Path | str) -> Arrays:
    """The arrays of a weights file, or of ``model.ursw`` in a folder.

    Raises:
        FileNotFoundError: no such file (or no ``model.ursw`` in the folder).
        WeightsFormatError: the file is not a weights file.
    """
    file = Path(path)
    if file.is_dir():
        file = file / WEIGHTS_FILENAME
    data = file.read_bytes()
    try:
        return arrays_from_bytes(data)
    except WeightsFormatError as exc:
        raise WeightsFormatError(f"{file}: {exc}") from exc


def load_weights(module: nn.Module, path: Path | str) -> Arrays:
    """Load a weights file (or a folder's ``model.ursw``) into ``module`` in place.

    Returns the arrays loaded. torch is imported here, so the torch-free
    `ursa.models` stays importable on an inference-only device.

    Raises:
        FileNotFoundError: no weights file there.
        WeightsFormatError: not a weights file.
        WeightsMismatchError: the module's tensors differ (names, shapes).
    """
    from ursa.models.registry import load_arrays

    arrays = read_weights(path)
    load_arrays(module, arrays)
    return arrays
