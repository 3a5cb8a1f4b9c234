"""The unmasked sum's bounds: honest sums pass (with DP too), forged ones do not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from ursa.coordinator.secure_aggregation.sum_bounds import (
    SumBounds,
    SumOutOfBoundsError,
)
from ursa.crypto.fixed_point import VectorLayout
from ursa.edge_sdk.secure_aggregation.rounds import Contribution, encode_contribution
from ursa.protocol.messages import COORDINATOR, SecAggSetup
from ursa.protocol.secure_aggregation import MODEL_SEGMENT, WEIGHT_SEGMENT

VALUES = 40


def setup_of(k: int = 3, **overrides: Any) -> SecAggSetup:
    fields: dict[str, Any] = {
        "federation": "fed",
        "round": 1,
        "sender": COORDINATOR,
        "model": "classifier",
        "model_version": 0,
        "participants": tuple(f"d{i:02d}" for i in range(k)),
        "threshold": k,
        "degree": max(1, k - 1),
        "weighting": "fedavg",
        "max_examples": 100,
        "clip_norm": 2.0,
    }
    fields.update(overrides)
    return SecAggSetup(**fields)


def honest_sum(
    setup: SecAggSetup,
    deltas: list[NDArray[np.float64]],
    examples: list[int],
    seed: int = 0,
) -> tuple[VectorLayout, NDArray[np.uint32]]:
    """The ring sum of honest devices' encodings (the masks cancel: left out)."""
    rng = np.random.default_rng(seed)
    total = None
    layout = None
    for delta, n in zip(deltas, examples, strict=True):
        encoded = encode_contribution(
            setup, Contribution({"w": delta}, n, loss=0.5, train_s=1.0), rng
        )
        layout = encoded.layout
        total = encoded.vector if total is None else total + encoded.vector
    assert layout is not None and total is not None
    return layout, total.astype(np.uint32)


def check(setup: SecAggSetup, layout: VectorLayout, total: Any, n: int) -> Any:
    return SumBounds.of(setup, layout, n).check(layout.decode(total))


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(2, 6),
    scale=st.floats(1e-3, 1e3),
    examples=st.lists(st.integers(1, 10_000), min_size=6, max_size=6),
    noise=st.sampled_from([0.0, 1.0]),
    weighting=st.sampled_from(["fedavg", "equal"]),
    seed=st.integers(0, 2**16),
)
def test_every_honest_sum_passes_and_its_mean_step_is_at_most_clip_norm(
    k: int,
    scale: float,
    examples: list[int],
    noise: float,
    weighting: str,
    seed: int,
) -> None:
    setup = setup_of(k, noise_multiplier=noise, weighting=weighting)
    rng = np.random.default_rng(seed)
    deltas = [rng.normal(size=VALUES) * scale for _ in range(k)]  # clipped or not
    layout, total = honest_sum(setup, deltas, examples[:k], seed)
    checked = check(setup, layout, total, k)
    assert k <= checked.weight <= k * setup.max_examples
    assert checked.norm <= checked.norm_bound
    step = np.linalg.norm(layout.decode(total)[MODEL_SEGMENT] / checked.weight)
    assert step <= checked.norm_bound / checked.weight
    if noise == 0:  # rounding only: the mean step is clip_norm long at most
        assert step <= setup.clip_norm * (1 + 1e-3)


def forged(
    setup: SecAggSetup, layout: VectorLayout, total: NDArray[np.uint32], edit: Any
) -> NDArray[np.uint32]:
    """``total`` plus one device's honest ring vector with ``edit`` applied (int32)."""
    rng = np.random.default_rng(2)
    encoded = encode_contribution(setup, Contribution({"w": np.zeros(VALUES)}, 50), rng)
    attacker = encoded.vector.view(np.int32).astype(np.int64)
    edit(attacker)
    return (total + attacker.astype(np.uint32)).astype(np.uint32)


@pytest.mark.parametrize(
    ("name", "edit", "why"),
    [
        ("huge model", lambda v: v.__setitem__(slice(0, VALUES), 2**31 - 1), "model"),
        ("weight wraps low", lambda v: v.__setitem__(VALUES, -(2**31)), "weight"),
        ("weight above cap", lambda v: v.__setitem__(VALUES, 2**30), "weight"),
        ("one slot", lambda v: v.__setitem__(0, 2**29), "norm"),
        ("reporting", lambda v: v.__setitem__(-1, 2**20), "reported"),
    ],
)
def test_a_forged_contribution_is_refused(name: str, edit: Any, why: str) -> None:
    setup = setup_of(3)
    rng = np.random.default_rng(1)
    deltas = [rng.normal(size=VALUES) for _ in range(2)]
    layout, total = honest_sum(setup, deltas, [30, 40])
    assert check(setup, layout, total, 2).weight == 70  # the honest pair passes
    assert check(setup, layout, forged(setup, layout, total, id), 3).weight == 120
    with pytest.raises(SumOutOfBoundsError, match=why):
        check(setup, layout, forged(setup, layout, total, edit), 3)


def test_the_weight_must_be_the_survivor_count_without_fedavg() -> None:
    setup = setup_of(3, weighting="equal")
    layout, total = honest_sum(setup, [np.ones(VALUES) * 0.1] * 3, [5, 5, 5])
    assert check(setup, layout, total, 3).weight == 3
    with pytest.raises(SumOutOfBoundsError, match="weight"):
        check(setup, layout, total, 2)  # three weights, two survivors


def test_a_missing_or_non_finite_segment_is_refused() -> None:
    setup = setup_of(2)
    layout, total = honest_sum(setup, [np.ones(VALUES) * 0.1] * 2, [5, 5])
    sums = layout.decode(total)
    bounds = SumBounds.of(setup, layout, 2)
    with pytest.raises(SumOutOfBoundsError, match="missing"):
        bounds.check({k: v for k, v in sums.items() if k != WEIGHT_SEGMENT})
    sums[MODEL_SEGMENT][3] = np.nan
    with pytest.raises(SumOutOfBoundsError, match="NaN"):
        bounds.check(sums)
