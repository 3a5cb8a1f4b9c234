"""`clipped_delta`: the norm a device clips to, computed on its own thread."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ursa.edge_sdk.secure_aggregation.participant import SecAggError
from ursa.edge_sdk.secure_aggregation.rounds import clipped_delta


def _delta(scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "w": (scale * rng.standard_normal((300, 10))).astype(np.float32),
        "b": (scale * rng.standard_normal(10)).astype(np.float32),
        "steps": np.array([7], dtype=np.int64),  # a counter: not in the sum
    }


def test_the_norm_is_the_float_arrays_euclidean_norm() -> None:
    delta = _delta(0.01)
    flat, norm = clipped_delta(delta, clip_norm=100.0)
    expected = np.concatenate([delta["w"].ravel(), delta["b"]]).astype(np.float64)
    assert norm == pytest.approx(float(np.linalg.norm(expected)), rel=1e-12)
    np.testing.assert_array_equal(flat, expected)  # under the clip: unchanged


def test_a_long_delta_is_scaled_to_the_clip_norm() -> None:
    flat, norm = clipped_delta(_delta(1.0), clip_norm=2.0)
    assert norm > 2.0
    assert math.sqrt(float(np.sum(flat * flat))) == pytest.approx(2.0, rel=1e-12)


def test_the_norm_needs_no_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """np.linalg.norm wakes OpenBLAS's threads, which spin on after the call."""

    def refuse(*_: object, **__: object) -> float:
        raise AssertionError("clipped_delta called BLAS")

    monkeypatch.setattr(np.linalg, "norm", refuse)
    monkeypatch.setattr(np, "dot", refuse)
    _, norm = clipped_delta(_delta(1.0), clip_norm=2.0)
    assert norm > 2.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_delta_is_refused(bad: float) -> None:
    delta = _delta(0.01)
    delta["b"][3] = bad
    with pytest.raises(SecAggError, match="NaN or inf"):
        clipped_delta(delta, clip_norm=1.0)
