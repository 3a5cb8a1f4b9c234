"""The L2 norm that stays off BLAS."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ursa.crypto.discrete_gaussian import round_conditionally
from ursa.crypto.vector_norm import l2_norm


def test_equals_numpys_norm_on_random_vectors() -> None:
    rng = np.random.default_rng(3)
    for size in (0, 1, 7, 10_000):
        values = rng.normal(size=size).astype(np.float32)
        expected = float(np.linalg.norm(values.astype(np.float64)))
        assert l2_norm(values) == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_integers_and_non_finite_inputs() -> None:
    assert l2_norm(np.array([3, 4], dtype=np.int64)) == 5.0
    assert math.isinf(l2_norm(np.array([1.0, np.inf])))
    assert math.isnan(l2_norm(np.array([1.0, np.nan])))


def test_conditional_rounding_calls_no_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> float:
        raise AssertionError("np.linalg.norm called")

    monkeypatch.setattr(np.linalg, "norm", refuse)
    values = np.random.default_rng(1).normal(size=100)
    values *= 5.0 / l2_norm(values)
    rounded = round_conditionally(values, 5.0, np.random.default_rng(2), beta=0.1)
    assert rounded.values.shape == (100,)
