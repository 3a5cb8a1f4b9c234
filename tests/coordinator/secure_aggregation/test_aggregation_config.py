"""``[aggregation]``: the rule must fit the mode, and the bounds must be numbers."""

from __future__ import annotations

import pydantic
import pytest

from ursa.coordinator.secure_aggregation.config import (
    DEFAULT_TRIM_FRACTION,
    AggregationConfig,
)


@pytest.mark.parametrize("rule", ["trimmed_mean", "median"])
def test_secure_mode_refuses_a_rule_it_cannot_compute_from_a_sum(rule: str) -> None:
    with pytest.raises(pydantic.ValidationError, match='supports "mean" only'):
        AggregationConfig(aggregation_rule=rule)
    plain = AggregationConfig(mode="plain", aggregation_rule=rule)
    assert plain.aggregation_rule == rule
    assert plain.trim_fraction == DEFAULT_TRIM_FRACTION


@pytest.mark.parametrize(
    "bad",
    [
        {"clip_norm": float("inf")},
        {"clip_norm": float("nan")},
        {"clip_norm": 0.0},
        {"max_examples": 0},
        {"trim_fraction": 0.5},
        {"trim_fraction": -0.1},
        {"aggregation_rule": "krum"},
    ],
)
def test_unusable_bounds_are_refused_at_load(bad: dict[str, object]) -> None:
    with pytest.raises(pydantic.ValidationError):
        AggregationConfig(mode="plain", **bad)  # type: ignore[arg-type]
