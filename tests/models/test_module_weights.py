"""`load_weights`: the federation's weights file into the app's own module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from ursa.models.module_weights import load_weights, read_weights  # noqa: E402
from ursa.models.registry import state_dict_to_arrays  # noqa: E402
from ursa.models.weights import (  # noqa: E402
    WEIGHTS_FILENAME,
    WeightsFormatError,
    WeightsMismatchError,
    arrays_to_bytes,
)


def _net(hidden: int = 6) -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.Linear(hidden, 3)
    )


def _final_dir(tmp_path: Path, module: nn.Module) -> Path:
    folder = tmp_path / "final"
    folder.mkdir()
    (folder / WEIGHTS_FILENAME).write_bytes(
        arrays_to_bytes(state_dict_to_arrays(module))
    )
    return folder


def test_a_final_folder_loads_into_a_fresh_module_of_the_same_shape(
    tmp_path: Path,
) -> None:
    torch.manual_seed(3)
    trained = _net()
    folder = _final_dir(tmp_path, trained)
    fresh = _net()

    load_weights(fresh, folder)

    want, got = state_dict_to_arrays(trained), state_dict_to_arrays(fresh)
    assert list(got) == list(want)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert list(read_weights(folder / WEIGHTS_FILENAME)) == list(want)


def test_another_architecture_is_refused_before_the_module_changes(
    tmp_path: Path,
) -> None:
    folder = _final_dir(tmp_path, _net(hidden=6))
    other = _net(hidden=7)
    before = state_dict_to_arrays(other)

    with pytest.raises(WeightsMismatchError, match=r"'0.weight': shape \(6, 4\)"):
        load_weights(other, folder)

    after = state_dict_to_arrays(other)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_a_file_that_is_not_a_weights_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / WEIGHTS_FILENAME
    path.write_bytes(b"not weights at all")
    with pytest.raises(WeightsFormatError, match=str(path)):
        load_weights(_net(), path)
    with pytest.raises(FileNotFoundError):
        load_weights(_net(), tmp_path / "missing")
