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
  by their CLIMB weight ``w_i = 1 + lambda_i - mean(lambda)`` (docs/methods.md;
  `ursa.edge_sdk.methods.climb.dual`). Numerically the same as EQUAL; it is its own
  member so that a round records which rule it used, and because the
  coordinator must *not* rescale: it never learns ``w_i``.

Integer arrays (a model's counters, e.g. BatchNorm's ``num_batches_tracked``)
are not averaged: a mean of counters is no counter, and the sum of the
devices' batches would count each round K times. The global model keeps the
coordinator's value (its initial model's), whatever the devices send; the
devices' float buffers (running means and variances) are averaged like
weights. ``num_batches_tracked`` only matters to a BatchNorm built with
``momentum=None`` (a cumulative average), which a federated model should
not use (docs/sdk.md).

Bounded influence (plain mode, `AggregationPolicy`): the coordinator clips
each delta's float arrays to the L2 norm ``clip_norm`` and each weight to
``max_examples`` before it counts, exactly as devices do before they mask
(`ursa.edge_sdk.secure_aggregation.rounds.clipped_delta`), and combines by
`AggregationRule`:

* ``mean``: the weighted running sum above (one model of memory).
* ``trimmed_mean``: per coordinate, the clipped deltas sorted, ``t =
  ceil(trim_fraction * K)`` dropped at each end (at most ``(K - 1) // 2``),
  the rest averaged; ``median``: per coordinate, the median. Both keep the K
  clipped deltas (K models of memory) and weigh every device the same: a
  weighted median would give the weight back to whoever claims most examples.

Rules: a device's second update in a round is ignored (first wins; `apply_update`
reports it), an update whose array names or shapes differ from the global
model's, or that holds NaN/inf, raises `UpdateMismatchError`, and a bad weight
raises `AggregationError`. The state is immutable: `apply_update` returns a new
state, so a caller can checkpoint any state it has seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


class AggregationRule(StrEnum):
    """How a round combines its (clipped) updates."""

    MEAN = "mean"
    TRIMMED_MEAN = "trimmed_mean"
    MEDIAN = "median"


@dataclass(frozen=True)
class AggregationPolicy:
    """What the coordinator bounds each update to, and how it combines them.

    ``clip_norm`` / ``max_examples`` None: no bound (secure mode's devices
    clip before masking; a direct caller of `aggregate` may not want one).
    """

    rule: AggregationRule = AggregationRule.MEAN
    clip_norm: float | None = None
    max_examples: int | None = None
    trim_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.clip_norm is not None and not (
            math.isfinite(self.clip_norm) and self.clip_norm > 0
        ):
            raise AggregationError(
                f"clip_norm must be finite and > 0: {self.clip_norm}"
            )
        if self.max_examples is not None and self.max_examples < 1:
            raise AggregationError(f"max_examples must be >= 1: {self.max_examples}")
        if not 0.0 <= self.trim_fraction < 0.5:
            raise AggregationError(
                f"trim_fraction must be in [0, 0.5): {self.trim_fraction}"
            )


class UpdateOutcome(StrEnum):
    """What `apply_update` did with an update."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class DeviceDelta:
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
    policy: AggregationPolicy = field(default_factory=AggregationPolicy)
    rows: tuple[Mapping[str, FloatArray], ...] = ()
    """The clipped deltas, one per device (robust rules only; mean: empty)."""

    @property
    def num_updates(self) -> int:
        """How many updates were accepted."""
        return len(self.device_ids)


def init_aggregation(
    global_arrays: Mapping[str, FloatArray],
    weighting: Weighting | str,
    policy: AggregationPolicy | None = None,
) -> AggregationState:
    """Start a round: a zero float64 sum shaped like the global model."""
    rule = _weighting(weighting)
    zeros = {
        name: np.zeros(np.shape(a), dtype=np.float64)
        for name, a in global_arrays.items()
    }
    return AggregationState(
        rule, zeros, 0.0, frozenset(), policy or AggregationPolicy()
    )


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
    state: AggregationState, update: DeviceDelta
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
    policy = state.policy
    weight = update_weight(state.weighting, update.num_examples)
    if policy.max_examples is not None:
        weight = min(weight, float(policy.max_examples))
    delta = clip_delta(update.delta, policy.clip_norm)
    summed = state.weighted_sum
    rows = state.rows
    if policy.rule is AggregationRule.MEAN:
        summed = {name: acc + weight * delta[name] for name, acc in summed.items()}
    else:
        rows = (*rows, delta)
    new_state = AggregationState(
        state.weighting,
        summed,
        state.total_weight + weight,
        state.device_ids | {update.device_id},
        policy,
        rows,
    )
    return new_state, UpdateOutcome.ACCEPTED


def delta_norm(delta: Mapping[str, FloatArray]) -> float:
    """The L2 norm of a delta's float arrays (integer counters do not count)."""
    floats = [
        np.asarray(a, dtype=np.float64).ravel()
        for a in delta.values()
        if np.asarray(a).dtype.kind == "f"
    ]
    return vector_norm(np.concatenate(floats)) if floats else 0.0


def vector_norm(values: FloatArray) -> float:
    """The L2 norm of ``values`` in float64, scaled first so it cannot overflow."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    top = float(np.max(np.abs(flat))) if flat.size else 0.0
    return 0.0 if top == 0.0 else top * float(np.linalg.norm(flat / top))


def clip_delta(
    delta: Mapping[str, FloatArray], clip_norm: float | None
) -> dict[str, FloatArray]:
    """The delta in float64, its float arrays scaled to L2 norm <= ``clip_norm``.

    The same clip a device applies before it masks its delta (None: as is).
    """
    out = {name: np.asarray(a, dtype=np.float64) for name, a in delta.items()}
    if clip_norm is None:
        return out
    norm = delta_norm(delta)
    if norm <= clip_norm:
        return out
    scale = clip_norm / norm
    return {
        name: a * scale if np.asarray(delta[name]).dtype.kind == "f" else a
        for name, a in out.items()
    }


def trim_count(k: int, fraction: float) -> int:
    """Values a trimmed mean of ``k`` drops at each end: ``ceil(fraction k)``.

    At most ``(k - 1) // 2``, so at least one value stays.
    """
    wanted = math.ceil(round(fraction * k, 9))
    return max(0, min(wanted, (k - 1) // 2))


def robust_combine(
    stacked: FloatArray, rule: AggregationRule, trim_fraction: float
) -> FloatArray:
    """Coordinate-wise median or trimmed mean over axis 0 (one row per device)."""
    if rule is AggregationRule.MEDIAN:
        return np.asarray(np.median(stacked, axis=0), dtype=np.float64)
    cut = trim_count(stacked.shape[0], trim_fraction)
    ordered = np.sort(stacked, axis=0)
    kept = ordered[cut : stacked.shape[0] - cut]
    return np.asarray(kept.mean(axis=0), dtype=np.float64)


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
    policy = state.policy
    robust = policy.rule is not AggregationRule.MEAN
    if not (np.isfinite(server_lr) and server_lr > 0):
        raise AggregationError(f"server_lr must be finite and > 0, got {server_lr}")
    if spec_of(global_arrays) != spec_of(state.weighted_sum):
        raise UpdateMismatchError("the global model does not match the round's state")
    if robust and len(state.rows) != state.num_updates:
        raise AggregationError("the round's state lost some of its updates")
    scale = server_lr / state.total_weight
    out: Arrays = {}
    for name, base in global_arrays.items():
        arr = np.asarray(base)
        if arr.dtype.kind in "iu":
            out[name] = arr.copy()
            continue
        if robust:
            stacked = np.stack([row[name] for row in state.rows])
            step = server_lr * robust_combine(
                stacked, policy.rule, policy.trim_fraction
            )
        else:
            step = scale * state.weighted_sum[name]
        new = arr.astype(np.float64) + step
        out[name] = new.astype(arr.dtype if arr.dtype.kind == "f" else np.float32)
    return out


def aggregate(
    global_arrays: Mapping[str, FloatArray],
    updates: Iterable[DeviceDelta],
    weighting: Weighting | str,
    *,
    server_lr: float = 1.0,
    policy: AggregationPolicy | None = None,
) -> Arrays:
    """Init, apply a stream of updates (duplicates ignored), finalize."""
    state = init_aggregation(global_arrays, weighting, policy)
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
