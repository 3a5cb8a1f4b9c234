"""Models named by import path, their tensor specs and mismatches (torch-free parts)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from ursa.models.reference import reference_arrays
from ursa.models.spec import (
    ModelMismatchError,
    ModelSpecError,
    check_architecture,
    check_fits,
    is_import_path,
    load_factory,
)

NUMPY_FACTORY = "tests.models.spec_factories:softmax"


def test_architecture_names_are_built_ins_or_import_paths() -> None:
    assert check_architecture("mlp") == "mlp"
    assert check_architecture("pkg.mod:build") == "pkg.mod:build"
    assert is_import_path("a:b") and not is_import_path("a.b")
    for bad in ("resnet", "pkg.mod:", ":build", "pkg/mod:build", "pkg.mod:a.b"):
        with pytest.raises(ValueError, match="neither built in"):
            check_architecture(bad)


def test_a_missing_module_or_factory_is_a_spec_error() -> None:
    with pytest.raises(ModelSpecError, match="cannot import"):
        load_factory("no_such_module_here:build")
    with pytest.raises(ModelSpecError, match="no callable"):
        load_factory("tests.models.spec_factories:nothing")


def test_a_numpy_factory_builds_arrays_without_torch() -> None:
    code = (
        "import sys; from ursa.models.reference import reference_arrays; "
        f"a = reference_arrays({NUMPY_FACTORY!r}, {{'features': 4, 'classes': 3}}); "
        "assert list(a) == ['0', '1'], list(a); "
        "assert a['0'].shape == (4, 3) and a['0'].dtype.name == 'float32'; "
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_mapping_factory_keeps_names_and_integer_counters() -> None:
    arrays = reference_arrays("tests.models.spec_factories:named", {})
    assert list(arrays) == ["w", "steps"]
    assert arrays["steps"].dtype == np.int64


def test_a_factory_that_fails_or_returns_nothing_usable_is_a_spec_error() -> None:
    with pytest.raises(ModelSpecError, match="failed"):
        reference_arrays(NUMPY_FACTORY, {"unknown": 1})
    with pytest.raises(ModelSpecError, match="need a torch"):
        reference_arrays("tests.models.spec_factories:wrong", {})


def test_check_fits_names_the_first_differing_tensor() -> None:
    ours = {"a": np.zeros((2, 3), np.float32), "n": np.zeros((), np.int64)}
    check_fits(ours, {k: v.copy() for k, v in ours.items()})

    cases = [
        ({"a": np.zeros((3, 3), np.float32), "n": ours["n"]}, "a", "shape (2, 3)"),
        ({"a": ours["a"], "n": np.zeros((), np.float32)}, "n", "dtype int"),
        ({"a": ours["a"]}, "n", "not in the federation's model"),
        ({**ours, "extra": ours["a"]}, "extra", "not in this device's model"),
        ({"n": ours["n"], "a": ours["a"]}, "a", "another order"),
    ]
    for theirs, tensor, detail in cases:
        with pytest.raises(ModelMismatchError, match=re.escape(detail)) as caught:
            check_fits(ours, theirs)
        assert caught.value.tensor == tensor
