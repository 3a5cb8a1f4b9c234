"""One hostile device's model update against the real coordinator and devices.

The issue's rows: ``num_examples = 2**62`` with delta = target - global, and
float32-max / inf / NaN deltas. Three devices on the in-memory bus, all
selected, one of them (``d00``) hostile; the honest run is the same fleet with
``d00``'s training failing (its update never counts). Every test asserts the
honest fleet's outcome: the model finite and within the bound
docs/bounded_influence.md states ("Model updates") of the honest run.

Secure mode: the coordinator never sees one vector, so the hostile device is
an SDK whose encoding step is replaced (`forge`): it skips the clip and
writes what it likes into the uint32 ring.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from ursa.coordinator.aggregation import delta_norm
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.training import TrainingConfig, TrainingPlugin, round_figures
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.secure_aggregation.rounds import Contribution, MaskingRounds
from ursa.edge_sdk.trainer import LocalDelta
from ursa.models.weights import Arrays
from ursa.protocol.messages import SecAggSetup
from ursa.protocol.secure_aggregation import (
    MODEL_SEGMENT,
    WEIGHT_SEGMENT,
    contribution_layout,
)
from ursa.tests.coordinator.conftest import Federation
from ursa.tests.coordinator.test_training import (
    INITIAL,
    FailingTrainer,
    LinearTrainer,
    start_training,
)

ATTACKER = "d00"
CLIP = 1.0
MAX_EXAMPLES = 50
TARGET = 100.0
"""The attacker's target weights (every value): far outside one clipped step."""
TOP = float(np.finfo(np.float32).max)

Prepare = Callable[[EdgeClient], None]


def flat(arrays: Arrays) -> NDArray[np.float64]:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in INITIAL])


def aggregation(mode: str = "secure", rule: str = "mean") -> AggregationConfig:
    return AggregationConfig(
        mode=mode,  # type: ignore[arg-type]
        aggregation_rule=rule,  # type: ignore[arg-type]
        clip_norm=CLIP,
        max_examples=MAX_EXAMPLES,
    )


def run_fleet(
    tmp_path: Path, config: AggregationConfig, prepare: Prepare, *, rounds: int = 1
) -> tuple[TrainingPlugin, Federation]:
    """Three devices, all selected each round; ``prepare`` makes d00 hostile."""
    fed = Federation(tmp_path, num_devices=3, k=3, tries=1, rounds=rounds)
    try:
        plugin = start_training(
            fed, tmp_path, TrainingConfig(aggregation=config), prepare=prepare
        )
    finally:
        fed.close()
    assert fed.bus.handler_errors == 0
    assert fed.coordinator.is_done
    return plugin, fed


def failing(client: EdgeClient) -> None:
    """The honest run: the attacker's training fails, its update never counts."""
    if client.device_id == ATTACKER:
        client.data.trainer = FailingTrainer(0)  # type: ignore[attr-defined]


class HostileTrainer(LinearTrainer):
    """A plain-mode attacker: any delta, any num_examples (the wire allows both)."""

    def __init__(self, delta: Callable[[Arrays], Arrays], num_examples: int) -> None:
        super().__init__(0)
        self._make = delta
        self.num_examples = num_examples

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        return LocalDelta(self._make(global_arrays), self.num_examples)


def hostile(delta: Callable[[Arrays], Arrays], num_examples: int) -> Prepare:
    def prepare(client: EdgeClient) -> None:
        if client.device_id == ATTACKER:
            client.data.trainer = HostileTrainer(delta, num_examples)  # type: ignore[attr-defined]

    return prepare


def to_target(arrays: Arrays) -> Arrays:
    return {k: (np.float32(TARGET) - v).astype(np.float32) for k, v in arrays.items()}


def filled(value: float) -> Callable[[Arrays], Arrays]:
    return lambda arrays: {
        k: np.full(np.shape(v), value, np.float32) for k, v in arrays.items()
    }


ROWS: dict[str, tuple[Callable[[Arrays], Arrays], int]] = {
    "2**62 examples, target - global": (to_target, 2**62),
    "float32-max": (filled(TOP), 10),
    "inf": (filled(np.inf), 10),
    "nan": (filled(np.nan), 10),
}


def honest_deltas() -> NDArray[np.float64]:
    """The honest devices' (d01, d02) round-1 deltas, clipped as the rule sees them."""
    rows = []
    for index in (1, 2):
        delta = LinearTrainer(index).delta(INITIAL)
        norm = delta_norm(delta)
        scale = min(1.0, CLIP / norm) if norm else 1.0
        rows.append(flat(delta) * scale)
    return np.stack(rows)


def mean_bound(honest_step: NDArray[np.float64]) -> float:
    """Plain mean: the attacker's weight share times its clipped delta's distance.

    ``|new - honest| <= a (C + |h|) / (W_h + a)`` with ``a = max_examples``.
    """
    weights = sum(min(LinearTrainer(i).num_examples, MAX_EXAMPLES) for i in (1, 2))
    return (
        MAX_EXAMPLES
        * (CLIP + float(np.linalg.norm(honest_step)))
        / (weights + MAX_EXAMPLES)
    )


def assert_within_bound(
    rule: str, model: NDArray[np.float64], honest: NDArray[np.float64]
) -> None:
    """The documented plain-mode bound of one hostile update against the honest run.

    mean: `mean_bound`; trimmed mean (one of three trimmed per side) and
    median: every coordinate of the step inside the honest clipped deltas' range.
    """
    base = flat(INITIAL)
    if rule == "mean":
        distance = float(np.linalg.norm(model - honest))
        assert distance <= mean_bound(honest - base) * (1 + 1e-5)
        return
    rows = honest_deltas()
    assert np.all(model - base >= rows.min(axis=0) - 1e-6)
    assert np.all(model - base <= rows.max(axis=0) + 1e-6)


# --- plain mode: the coordinator clips; mean, trimmed mean, median -------------


@pytest.fixture(scope="module")
def honest_plain() -> dict[str, NDArray[np.float64]]:
    """Each rule's honest model after one round (the attacker's update missing)."""
    out = {}
    for rule in ("mean", "trimmed_mean", "median"):
        with tempfile.TemporaryDirectory() as folder:
            plugin, _ = run_fleet(Path(folder), aggregation("plain", rule), failing)
            out[rule] = flat(plugin.global_arrays)
    return out


@pytest.mark.parametrize("rule", ["mean", "trimmed_mean", "median"])
@pytest.mark.parametrize("row", list(ROWS))
def test_one_hostile_plain_update_stays_within_the_rules_bound(
    tmp_path: Path,
    honest_plain: dict[str, NDArray[np.float64]],
    rule: str,
    row: str,
) -> None:
    delta, examples = ROWS[row]
    plugin, fed = run_fleet(
        tmp_path, aggregation("plain", rule), hostile(delta, examples)
    )

    model = flat(plugin.global_arrays)
    honest = honest_plain[rule]
    assert np.all(np.isfinite(model)) and plugin.version == 1
    record = plugin.history[0]
    if row in ("inf", "nan"):  # refused as malformed: the honest pair's round
        assert ATTACKER not in record.contributed
        assert (record.failed, record.dropped) == ((ATTACKER,), ())
        assert [m.code for m in fed.errors_to(ATTACKER)] == ["malformed"]
        np.testing.assert_array_equal(model, honest)
        return
    assert ATTACKER in record.contributed
    assert_within_bound(rule, model, honest)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    value=st.floats(-TOP, TOP, allow_nan=False, width=32),
    spread=st.floats(-1.0, 1.0),
    examples=st.integers(1, 2**62),
    rule=st.sampled_from(["mean", "trimmed_mean", "median"]),
)
def test_any_hostile_plain_delta_and_weight_stays_within_the_bound(
    honest_plain: dict[str, NDArray[np.float64]],
    value: float,
    spread: float,
    examples: int,
    rule: str,
) -> None:
    def delta(arrays: Arrays) -> Arrays:
        return {
            k: (np.float32(value) * (1 + spread * np.arange(np.size(v))))
            .astype(np.float32)
            .reshape(np.shape(v))
            for k, v in arrays.items()
        }

    with tempfile.TemporaryDirectory() as folder:
        plugin, _ = run_fleet(
            Path(folder), aggregation("plain", rule), hostile(delta, examples)
        )
    model = flat(plugin.global_arrays)
    assert np.all(np.isfinite(model))
    assert_within_bound(rule, model, honest_plain[rule])


# --- secure mode: the device forges its ring vector; the coordinator checks the sum --

Forge = Callable[[SecAggSetup, Contribution, int], NDArray[np.int64]]
"""``forge(setup, contribution, model_values) -> the ring vector as int32 values``."""


@contextmanager
def forging(forge: Forge, rounds: set[int]) -> Iterator[None]:
    """The attacker's SDK: its encoding step replaced in ``rounds`` (others honest)."""
    honest = MaskingRounds.masked_vector

    def masked_vector(
        self: MaskingRounds, round_index: int, contribution: Contribution
    ) -> bytes:
        if self.device_id != ATTACKER or round_index not in rounds:
            return honest(self, round_index, contribution)
        work = self._rounds[round_index]
        values = sum(
            int(np.size(contribution.delta[n])) for n in contribution.names or ()
        )
        layout = contribution_layout(work.setup, values)
        vector = forge(work.setup, contribution, values).astype(np.uint32)
        return layout.to_bytes(work.participant.mask(vector))

    MaskingRounds.masked_vector = masked_vector  # type: ignore[method-assign]
    try:
        yield
    finally:
        MaskingRounds.masked_vector = honest  # type: ignore[method-assign]


def _encoded(setup: SecAggSetup, values: int, parts: dict[str, Any]) -> Any:
    layout = contribution_layout(setup, values)
    parts.setdefault("reporting", [1.0])  # the metric slots as an honest device's
    for segment in layout.segments:
        parts.setdefault(segment.name, np.zeros(segment.length))
    vector = layout.encode(parts, np.random.default_rng(0))
    return vector.view(np.int32).astype(np.int64)


def skip_clip(setup: SecAggSetup, c: Contribution, values: int) -> NDArray[np.int64]:
    """The 2**62 row: its weight at the codec's cap, a * (target - global) unclipped."""
    a = float(setup.max_examples)
    parts = {MODEL_SEGMENT: a * TARGET * np.ones(values), WEIGHT_SEGMENT: [a]}
    return _encoded(setup, values, parts)  # type: ignore[no-any-return]


def ring_extremes(
    setup: SecAggSetup, c: Contribution, values: int
) -> NDArray[np.int64]:
    """The float32-max / inf / NaN rows: the ring's largest value in every model slot,
    the most negative weight (what float32-max encodes to, and beyond)."""
    vector = _encoded(setup, values, {})
    vector[:values] = 2**31 - 1
    vector[values] = -(2**31)
    return vector  # type: ignore[no-any-return]


def in_bounds(setup: SecAggSetup, c: Contribution, values: int) -> NDArray[np.int64]:
    """The strongest attacker the check lets through: weight max_examples, its
    model slot as long as it may be towards the target (the honest weights
    are at least 1 each, so ``(a + n - 1) * C``)."""
    a = float(setup.max_examples)
    n = len(setup.participants)
    direction = np.ones(values) / np.sqrt(values)
    model = (a + n - 1) * setup.clip_norm * direction * (1 - 1e-6)
    return _encoded(setup, values, {MODEL_SEGMENT: model, WEIGHT_SEGMENT: [a]})  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def honest_secure() -> NDArray[np.float64]:
    """The honest pair's secure model after one round."""
    with tempfile.TemporaryDirectory() as folder:
        plugin, _ = run_fleet(Path(folder), aggregation(), failing)
        assert plugin.version == 1
        return flat(plugin.global_arrays)


@pytest.mark.parametrize("forge", [skip_clip, ring_extremes], ids=lambda f: f.__name__)
def test_a_forged_secure_sum_keeps_the_version_and_the_next_round_trains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, forge: Forge
) -> None:
    caplog.set_level(logging.ERROR, logger="ursa.coordinator.training")
    with forging(forge, rounds={1}):
        plugin, _ = run_fleet(tmp_path, aggregation(), lambda c: None, rounds=2)

    first, second = plugin.history
    assert (first.version, first.contributed) == (0, ())
    assert "out of bounds" in first.refused
    assert first.metrics["secure_aggregation"]["out_of_bounds"]
    assert round_figures(first)["refused"] == first.refused  # status shows it
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "round 1" in line and "d00, d01, d02" in line
    # the next round (the attacker honest again) trains from the kept version 0
    assert (second.version, len(second.contributed)) == (1, 3)
    model = flat(plugin.global_arrays)
    assert np.all(np.isfinite(model))
    assert np.linalg.norm(model - flat(INITIAL)) <= CLIP * (1 + 1e-5)


def test_the_strongest_secure_attacker_moves_the_model_at_most_c_plus_h(
    tmp_path: Path, honest_secure: NDArray[np.float64]
) -> None:
    with forging(in_bounds, rounds={1}):
        plugin, _ = run_fleet(tmp_path, aggregation(), lambda c: None)

    assert plugin.version == 1 and plugin.history[0].refused == ""
    model, base = flat(plugin.global_arrays), flat(INITIAL)
    assert np.all(np.isfinite(model))
    step = float(np.linalg.norm(model - base))
    honest_step = float(np.linalg.norm(honest_secure - base))
    assert step <= CLIP * (1 + 1e-4)  # the check: the mean step is C long at most
    moved = float(np.linalg.norm(model - honest_secure))
    assert moved <= (CLIP + honest_step) * (1 + 1e-4)
    assert moved > 0.5 * CLIP  # the attack is real: not a test that cannot fail
