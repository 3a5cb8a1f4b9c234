from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.aggregation import (
    AggregationError,
    EmptyRoundError,
    ModelUpdate,
    UpdateMismatchError,
    UpdateOutcome,
    Weighting,
    aggregate,
    apply_update,
    finalize_aggregation,
    init_aggregation,
)


def _global() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1.0, -1.0], dtype=np.float32),
    }


def _delta(value: float) -> dict[str, np.ndarray]:
    return {
        "w": np.full((2, 3), value, dtype=np.float32),
        "b": np.array([value, 2 * value], dtype=np.float32),
    }


def test_fedavg_is_the_sample_weighted_mean_of_deltas() -> None:
    g = _global()
    updates = [
        ModelUpdate("a", _delta(1.0), 10),
        ModelUpdate("b", _delta(4.0), 30),
    ]

    new = aggregate(g, updates, Weighting.FEDAVG)

    mean = (10 * 1.0 + 30 * 4.0) / 40  # 3.25
    np.testing.assert_allclose(new["w"], g["w"] + mean)
    np.testing.assert_allclose(new["b"], g["b"] + np.array([mean, 2 * mean]))
    assert new["w"].dtype == np.float32


def test_equal_and_climb_weights_ignore_num_examples() -> None:
    g = _global()
    updates = [ModelUpdate("a", _delta(1.0), 10), ModelUpdate("b", _delta(4.0), 30)]

    equal = aggregate(g, updates, "equal")
    climb = aggregate(g, updates, Weighting.CLIMB)

    np.testing.assert_allclose(equal["w"], g["w"] + 2.5)
    np.testing.assert_array_equal(equal["w"], climb["w"])


def test_climb_averages_already_scaled_deltas_over_participants() -> None:
    g = _global()
    # devices scaled their deltas by w_i = 1 + lambda_i - mean(lambda)
    w = np.array([1.5, 0.5, 1.0])
    raw = [1.0, 2.0, -3.0]
    updates = [ModelUpdate(f"d{i}", _delta(float(w[i] * raw[i])), 7) for i in range(3)]

    new = aggregate(g, updates, Weighting.CLIMB, server_lr=2.0)

    expected = 2.0 * float(np.mean(w * np.array(raw)))
    np.testing.assert_allclose(new["w"], g["w"] + expected, rtol=1e-6)


def test_duplicate_device_update_is_ignored_first_wins() -> None:
    g = _global()
    state = init_aggregation(g, Weighting.FEDAVG)
    state, first = apply_update(state, ModelUpdate("a", _delta(1.0), 5))
    again, second = apply_update(state, ModelUpdate("a", _delta(100.0), 5))

    assert (first, second) == (UpdateOutcome.ACCEPTED, UpdateOutcome.DUPLICATE)
    assert again is state
    np.testing.assert_allclose(finalize_aggregation(again, g)["w"], g["w"] + 1.0)


def test_state_is_immutable_and_a_running_sum() -> None:
    g = _global()
    start = init_aggregation(g, Weighting.FEDAVG)
    one, _ = apply_update(start, ModelUpdate("a", _delta(1.0), 2))
    two, _ = apply_update(one, ModelUpdate("b", _delta(3.0), 2))

    assert start.num_updates == 0 and start.total_weight == 0.0
    assert not np.any(start.weighted_sum["w"])
    np.testing.assert_allclose(one.weighted_sum["w"], 2.0)
    np.testing.assert_allclose(two.weighted_sum["w"], 8.0)
    assert two.total_weight == 4.0
    assert two.weighted_sum["w"].dtype == np.float64


@pytest.mark.parametrize(
    "delta",
    [
        {"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, np.float32)},
        {"w": np.zeros((2, 3), np.float32)},
        {"w": np.zeros((2, 3), np.float32), "b": np.zeros(2), "c": np.zeros(1)},
        {"w": np.full((2, 3), np.nan, np.float32), "b": np.zeros(2, np.float32)},
    ],
)
def test_mismatched_or_non_finite_update_raises(delta: dict[str, np.ndarray]) -> None:
    state = init_aggregation(_global(), Weighting.FEDAVG)
    with pytest.raises(UpdateMismatchError):
        apply_update(state, ModelUpdate("a", delta, 1))


def test_bad_weights_and_settings_raise() -> None:
    g = _global()
    state = init_aggregation(g, Weighting.FEDAVG)
    with pytest.raises(AggregationError, match="num_examples"):
        apply_update(state, ModelUpdate("a", _delta(1.0), 0))
    with pytest.raises(AggregationError, match="unknown weighting"):
        init_aggregation(g, "median")
    with pytest.raises(EmptyRoundError):
        finalize_aggregation(state, g)
    state, _ = apply_update(state, ModelUpdate("a", _delta(1.0), 1))
    with pytest.raises(AggregationError, match="server_lr"):
        finalize_aggregation(state, g, server_lr=0.0)
    with pytest.raises(UpdateMismatchError):
        finalize_aggregation(state, {"w": g["w"]})


def test_equal_weights_accept_zero_examples() -> None:
    g = _global()
    new = aggregate(g, [ModelUpdate("a", _delta(2.0), 0)], Weighting.EQUAL)
    np.testing.assert_allclose(new["w"], g["w"] + 2.0)


def test_integer_counters_keep_the_coordinators_value() -> None:
    base = {"w": np.zeros(2, np.float32), "n": np.array(4, np.int64)}
    updates = [
        ModelUpdate("a", {"w": np.ones(2, np.float32), "n": np.array(10)}, 1),
        ModelUpdate("b", {"w": np.full(2, 3.0, np.float32), "n": np.array(30)}, 1),
    ]

    new = aggregate(base, updates, Weighting.EQUAL)

    np.testing.assert_allclose(new["w"], 2.0)
    assert new["n"].dtype == np.int64 and int(new["n"]) == 4
