from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.coordinator.aggregation import (
    AggregationError,
    AggregationPolicy,
    AggregationRule,
    DeviceDelta,
    EmptyRoundError,
    UpdateMismatchError,
    UpdateOutcome,
    Weighting,
    aggregate,
    apply_update,
    delta_norm,
    finalize_aggregation,
    init_aggregation,
    trim_count,
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
        DeviceDelta("a", _delta(1.0), 10),
        DeviceDelta("b", _delta(4.0), 30),
    ]

    new = aggregate(g, updates, Weighting.FEDAVG)

    mean = (10 * 1.0 + 30 * 4.0) / 40  # 3.25
    np.testing.assert_allclose(new["w"], g["w"] + mean)
    np.testing.assert_allclose(new["b"], g["b"] + np.array([mean, 2 * mean]))
    assert new["w"].dtype == np.float32


def test_equal_and_climb_weights_ignore_num_examples() -> None:
    g = _global()
    updates = [DeviceDelta("a", _delta(1.0), 10), DeviceDelta("b", _delta(4.0), 30)]

    equal = aggregate(g, updates, "equal")
    climb = aggregate(g, updates, Weighting.CLIMB)

    np.testing.assert_allclose(equal["w"], g["w"] + 2.5)
    np.testing.assert_array_equal(equal["w"], climb["w"])


def test_climb_averages_already_scaled_deltas_over_participants() -> None:
    g = _global()
    # devices scaled their deltas by w_i = 1 + lambda_i - mean(lambda)
    w = np.array([1.5, 0.5, 1.0])
    raw = [1.0, 2.0, -3.0]
    updates = [DeviceDelta(f"d{i}", _delta(float(w[i] * raw[i])), 7) for i in range(3)]

    new = aggregate(g, updates, Weighting.CLIMB, server_lr=2.0)

    expected = 2.0 * float(np.mean(w * np.array(raw)))
    np.testing.assert_allclose(new["w"], g["w"] + expected, rtol=1e-6)


def test_duplicate_device_update_is_ignored_first_wins() -> None:
    g = _global()
    state = init_aggregation(g, Weighting.FEDAVG)
    state, first = apply_update(state, DeviceDelta("a", _delta(1.0), 5))
    again, second = apply_update(state, DeviceDelta("a", _delta(100.0), 5))

    assert (first, second) == (UpdateOutcome.ACCEPTED, UpdateOutcome.DUPLICATE)
    assert again is state
    np.testing.assert_allclose(finalize_aggregation(again, g)["w"], g["w"] + 1.0)


def test_state_is_immutable_and_a_running_sum() -> None:
    g = _global()
    start = init_aggregation(g, Weighting.FEDAVG)
    one, _ = apply_update(start, DeviceDelta("a", _delta(1.0), 2))
    two, _ = apply_update(one, DeviceDelta("b", _delta(3.0), 2))

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
        apply_update(state, DeviceDelta("a", delta, 1))


def test_bad_weights_and_settings_raise() -> None:
    g = _global()
    state = init_aggregation(g, Weighting.FEDAVG)
    with pytest.raises(AggregationError, match="num_examples"):
        apply_update(state, DeviceDelta("a", _delta(1.0), 0))
    with pytest.raises(AggregationError, match="unknown weighting"):
        init_aggregation(g, "median")
    with pytest.raises(EmptyRoundError):
        finalize_aggregation(state, g)
    state, _ = apply_update(state, DeviceDelta("a", _delta(1.0), 1))
    with pytest.raises(AggregationError, match="server_lr"):
        finalize_aggregation(state, g, server_lr=0.0)
    with pytest.raises(UpdateMismatchError):
        finalize_aggregation(state, {"w": g["w"]})


def test_equal_weights_accept_zero_examples() -> None:
    g = _global()
    new = aggregate(g, [DeviceDelta("a", _delta(2.0), 0)], Weighting.EQUAL)
    np.testing.assert_allclose(new["w"], g["w"] + 2.0)


def test_integer_counters_keep_the_coordinators_value() -> None:
    base: dict[str, np.ndarray] = {
        "w": np.zeros(2, np.float32),
        "n": np.array(4, np.int64),
    }
    updates = [
        DeviceDelta("a", {"w": np.ones(2, np.float32), "n": np.array(10)}, 1),
        DeviceDelta("b", {"w": np.full(2, 3.0, np.float32), "n": np.array(30)}, 1),
    ]

    new = aggregate(base, updates, Weighting.EQUAL)

    np.testing.assert_allclose(new["w"], 2.0)
    assert new["n"].dtype == np.int64 and int(new["n"]) == 4


# --- bounded influence: the coordinator's clip and the robust rules (plain mode) ---


def _step(new: dict[str, np.ndarray], g: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([(new[k].astype(np.float64) - g[k]).ravel() for k in g])


def test_the_coordinator_clips_each_delta_and_caps_each_weight() -> None:
    g = _global()
    policy = AggregationPolicy(clip_norm=1.0, max_examples=20)
    huge = DeviceDelta("x", _delta(1e30), 2**62)
    honest = DeviceDelta("a", _delta(0.01), 20)
    new = aggregate(g, [huge, honest], Weighting.FEDAVG, policy=policy)
    step = _step(new, g)
    # the attacker: norm 1 at weight 20 of 40; the honest delta: its own norm
    assert np.linalg.norm(step) <= 0.5 * 1.0 + 0.5 * delta_norm(_delta(0.01)) + 1e-6
    assert np.all(np.isfinite(step))


def test_float32_max_deltas_do_not_overflow_the_norm() -> None:
    top = float(np.finfo(np.float32).max)
    assert delta_norm(_delta(top / 2)) == pytest.approx(top / 2 * np.sqrt(6 + 1 + 4))


def test_trim_count_drops_ceil_of_the_fraction_and_keeps_one() -> None:
    assert [trim_count(k, 0.1) for k in (1, 2, 3, 10, 11, 30)] == [0, 0, 1, 1, 2, 3]
    assert trim_count(5, 0.49) == 2 and trim_count(4, 0.0) == 0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [(AggregationRule.MEDIAN, 2.0), (AggregationRule.TRIMMED_MEAN, 7 / 3)],
)
def test_robust_rules_ignore_an_outlier(rule: AggregationRule, expected: float) -> None:
    g = _global()
    policy = AggregationPolicy(rule, clip_norm=1e9, trim_fraction=0.2)  # 1 per side
    updates = [DeviceDelta(f"d{i}", _delta(v), 1) for i, v in enumerate([1, 2, 3])]
    updates.append(DeviceDelta("x", _delta(1e6), 2**40))
    updates.append(DeviceDelta("y", _delta(2.0), 1))
    new = aggregate(g, updates, Weighting.FEDAVG, policy=policy)
    np.testing.assert_allclose(new["w"], g["w"] + expected, rtol=1e-6)


def test_a_robust_round_keeps_its_rows_through_a_restart(tmp_path: Path) -> None:
    from ursa.coordinator.model_store import ModelStore

    g = _global()
    policy = AggregationPolicy(AggregationRule.MEDIAN, clip_norm=50.0, max_examples=9)
    state = init_aggregation(g, Weighting.FEDAVG, policy)
    for i, v in enumerate([1.0, 3.0]):
        state, _ = apply_update(state, DeviceDelta(f"d{i}", _delta(v), 100))
    store = ModelStore(tmp_path, "m")
    store.save_partial(4, 0, state)
    loaded = store.load_partial(4, 0)
    assert loaded is not None and loaded.policy == policy
    state, _ = apply_update(loaded, DeviceDelta("d2", _delta(2.0), 1))
    np.testing.assert_allclose(finalize_aggregation(state, g)["b"], g["b"] + [2, 4])


_TOP = float(np.finfo(np.float32).max)
_VALUES = st.floats(-_TOP, _TOP, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    honest=st.lists(st.lists(_VALUES, min_size=8, max_size=8), min_size=2, max_size=6),
    attacker=st.lists(_VALUES, min_size=8, max_size=8),
    weight=st.integers(1, 2**62),
    rule=st.sampled_from(list(AggregationRule)),
)
def test_one_attacker_moves_a_plain_round_within_its_bound(
    honest: list[list[float]],
    attacker: list[float],
    weight: int,
    rule: AggregationRule,
) -> None:
    """Whatever one device sends, the round stays within the documented bound.

    mean: ``2 C a / (W_h + a)`` of the honest mean (a = max_examples);
    median and trimmed mean with at least two honest devices and one trimmed
    per side: every coordinate within the honest clipped values' range.
    """
    clip, cap = 1.0, 50
    g = {"w": np.zeros(8, np.float32)}
    policy = AggregationPolicy(rule, clip_norm=clip, max_examples=cap)
    sizes = [10 + 7 * i for i in range(len(honest))]
    updates = [
        DeviceDelta(f"d{i}", {"w": np.array(h, np.float32)}, n)
        for i, (h, n) in enumerate(zip(honest, sizes, strict=True))
    ]
    hostile = DeviceDelta("x", {"w": np.array(attacker, np.float32)}, weight)
    both = aggregate(g, [*updates, hostile], Weighting.FEDAVG, policy=policy)["w"]
    alone = aggregate(g, updates, Weighting.FEDAVG, policy=policy)["w"]
    assert np.all(np.isfinite(both))
    if rule is AggregationRule.MEAN:
        bound = 2 * clip * cap / (sum(min(n, cap) for n in sizes) + cap)
        assert np.linalg.norm(both - alone) <= bound * (1 + 1e-5) + 1e-6
        return
    clipped = np.stack([_clipped(np.array(h, np.float32), clip) for h in honest])
    slack = 1e-6
    assert np.all(both >= clipped.min(axis=0) - slack)
    assert np.all(both <= clipped.max(axis=0) + slack)


def _clipped(delta: np.ndarray, clip: float) -> np.ndarray:
    norm = delta_norm({"w": delta})
    out = delta.astype(np.float64)
    return out * (clip / norm) if norm > clip else out
