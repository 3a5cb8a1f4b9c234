"""Model aggregation on the coordinator: a running weighted sum of device deltas.

Devices send *deltas* (``local - global``, see `ursa.edge_sdk.training`). One
round's aggregation is a small state machine over numpy arrays (no torch)::

    state = init_aggregation(global_arrays, Weighting.FEDAVG)
    state, outcome = apply_update(state, update)       # once per device reply
    new_global = finalize_aggregation(state, global_arrays)

The state holds one float64 running sum and the total weight, never a list of
updates, so memory is one model whatever the fleet size. ``new_global =
global + server_lr * sum_i(a_i * delta_i) / sum_i(a_i)`` with ``a_i``:

* `Weighting.FEDAVG`: ``num_examples`` from the device's reply (McMahan et al.;
  FedDisk eq. 11 and 16 weight by ``N_k / N``).
* `Weighting.EQUAL`: 1 per participant. Dubhe's FedVC (§4.1, eq. 1): every
  virtual client trains on the same number of samples, so all weigh the same.
* `Weighting.CLIMB`: 1 per participant, over deltas the devices already scaled
  by their CLIMB weight ``w_i = 1 + lambda_i - mean(lambda)`` (SPEC §5,
  `ursa.edge_sdk.climb`). Numerically the same as EQUAL; it is its own member so
  that a round records which rule it used, and because the coordinator must
  *not* rescale: it never learns ``w_i``.

Integer arrays (a model's counters, e.g. BatchNorm's ``num_batches_tracked``)
are not averaged: a mean of counters is no counter, and the sum of the
devices' batches would count each round K times. The global model keeps the
coordinator's value (its initial model's), whatever the devices send; the
devices' float buffers (running means and variances) are averaged like
weights. ``num_batches_tracked`` only matters to a BatchNorm built with
``momentum=None`` (a cumulative average), which a federated model should
not use (docs/sdk.md).

Rules: a device's second update in a round is ignored (first wins; `apply_update`
reports it), an update whose array names or shapes differ from the global
model's, or that holds NaN/inf, raises `UpdateMismatchError`, and a bad weight
raises `AggregationError`. The state is immutable: `apply_update` returns a new
state, so a caller can checkpoint any state it has seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ursa._compat import StrEnum
from ursa.models.weights import Arrays, FloatArray, spec_of


class AggregationError(ValueError):
    """An aggregation request that cannot be served (bad weight, empty round)."""


class UpdateMismatchError(AggregationError):
    """An update whose arrays do not fit the global model (names, shapes, NaN)."""


class EmptyRoundError(AggregationError):
    """`finalize_aggregation` was called before any update was accepted."""


class Weighting(StrEnum):
    """How each accepted update is weighted in the average."""

    FEDAVG = "fedavg"
    EQUAL = "equal"
    CLIMB = "climb"


class UpdateOutcome(StrEnum):
    """What `apply_update` did with an update."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class ModelUpdate:
    """One device's reply for a round.

    Attributes:
        device_id: the sender; the key for duplicate detection.
        delta: ``local - global`` per array (already scaled by ``w_i`` for CLIMB).
        num_examples: the FedAvg weight (FedVC: the fixed sample count).
    """

    device_id: str
    delta: Mapping[str, FloatArray]
    num_examples: int


@dataclass(frozen=True)
class AggregationState:
    """A round's running weighted sum (float64) and who has contributed."""

    weighting: Weighting
    weighted_sum: Mapping[str, FloatArray]
    total_weight: float
    device_ids: frozenset[str]

    @property
    def num_updates(self) -> int:
        """How many updates were accepted."""
        return len(self.device_ids)


def init_aggregation(
    global_arrays: Mapping[str, FloatArray], weighting: Weighting | str
) -> AggregationState:
    """Start a round: a zero float64 sum shaped like the global model."""
    rule = _weighting(weighting)
    zeros = {
        name: np.zeros(np.shape(a), dtype=np.float64)
        for name, a in global_arrays.items()
    }
    return AggregationState(rule, zeros, 0.0, frozenset())


def update_weight(weighting: Weighting | str, num_examples: int) -> float:
    """The weight ``a_i`` an update gets under ``weighting``.

    Raises:
        AggregationError: FedAvg with ``num_examples < 1``.
    """
    rule = _weighting(weighting)
    if rule is Weighting.FEDAVG:
        if isinstance(num_examples, bool) or not isinstance(
            num_examples, int | np.integer
        ):
            raise AggregationError(f"num_examples must be an int, got {num_examples!r}")
        if num_examples < 1:
            raise AggregationError(f"num_examples must be >= 1, got {num_examples}")
        return float(num_examples)
    return 1.0


def apply_update(
    state: AggregationState, update: ModelUpdate
) -> tuple[AggregationState, UpdateOutcome]:
    """Add one device's delta to the running sum; a repeat from a device is ignored.

    Raises:
        UpdateMismatchError: names or shapes differ from the global model, or the
            delta holds NaN or infinite values.
        AggregationError: an invalid weight (see `update_weight`).
    """
    if update.device_id in state.device_ids:
        return state, UpdateOutcome.DUPLICATE
    _check_delta(state.weighted_sum, update.delta)
    weight = update_weight(state.weighting, update.num_examples)
    summed = {
        name: acc + weight * np.asarray(update.delta[name], dtype=np.float64)
        for name, acc in state.weighted_sum.items()
    }
    new_state = AggregationState(
        state.weighting,
        summed,
        state.total_weight + weight,
        state.device_ids | {update.device_id},
    )
    return new_state, UpdateOutcome.ACCEPTED


def finalize_aggregation(
    state: AggregationState,
    global_arrays: Mapping[str, FloatArray],
    *,
    server_lr: float = 1.0,
) -> Arrays:
    """Return ``global + server_lr * weighted mean delta`` in the global dtypes.

    Integer arrays keep their global value (see the module docstring).

    Raises:
        EmptyRoundError: no update was accepted.
        UpdateMismatchError: ``global_arrays`` is not the model the round began with.
        AggregationError: ``server_lr`` is not finite and positive.
    """
    if state.num_updates == 0 or state.total_weight <= 0:
        raise EmptyRoundError("no update was accepted this round")
    if not (np.isfinite(server_lr) and server_lr > 0):
        raise AggregationError(f"server_lr must be finite and > 0, got {server_lr}")
    if spec_of(global_arrays) != spec_of(state.weighted_sum):
        raise UpdateMismatchError("the global model does not match the round's state")
    scale = server_lr / state.total_weight
    out: Arrays = {}
    for name, base in global_arrays.items():
        arr = np.asarray(base)
        if arr.dtype.kind in "iu":
            out[name] = arr.copy()
            continue
        new = arr.astype(np.float64) + scale * state.weighted_sum[name]
        out[name] = new.astype(arr.dtype if arr.dtype.kind == "f" else np.float32)
    return out


def aggregate(
    global_arrays: Mapping[str, FloatArray],
    updates: Iterable[ModelUpdate],
    weighting: Weighting | str,
    *,
    server_lr: float = 1.0,
) -> Arrays:
    """Init, apply a stream of updates (duplicates ignored), finalize."""
    state = init_aggregation(global_arrays, weighting)
    for update in updates:
        state, _ = apply_update(state, update)
    return finalize_aggregation(state, global_arrays, server_lr=server_lr)


def _weighting(value: Weighting | str) -> Weighting:
    try:
        return Weighting(value)
    except ValueError:
        known = [w.value for w in Weighting]
        raise AggregationError(f"unknown weighting {value!r}; known: {known}") from None


def _check_delta(
    reference: Mapping[str, FloatArray], delta: Mapping[str, FloatArray]
) -> None:
    if reference.keys() != delta.keys():
        differing = sorted(set(reference) ^ set(delta))
        raise UpdateMismatchError(f"update arrays differ from the model: {differing}")
    for name, ref in reference.items():
        arr = np.asarray(delta[name])
        if arr.shape != np.shape(ref):
            raise UpdateMismatchError(
                f"array {name!r}: shape {arr.shape}, model has {np.shape(ref)}"
            )
        if arr.dtype.kind not in "fiu" or not np.all(np.isfinite(arr)):
            raise UpdateMismatchError(f"array {name!r} holds NaN, inf or non-numbers")
