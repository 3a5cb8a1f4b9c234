"""FLICKER on a device: local imbalance, the resampling step and its encrypted messages.

A device (the FLICKER paper, §2-§3) only ever encrypts and computes under the
coordinator's CKKS public context:

* ring hop: `encrypt_counts` (first device) or `add_counts` (the others);
* localisation: `similarity_reply`, a masked product of ``Enc(GD/||GD||)``
  with the device's unit count vector; the coordinator learns the cosine only;
* update: `update_global` adds ``new - old`` counts to ``Enc(GD)`` (§2.1.4).

When chosen as the dominant device it makes one `resample_step` per FLICKER
iteration while its local imbalance ``LI = min/max`` (eq. 1) is below
``nabla_client``. Steps alternate, starting with under-sampling (§3: "over-
sampling is typically not a favoured option"; Table 6, client 1 confirms the
order: 4000 -> 3793 first, then 10 + round(3793/10) = 389):

* under-sampling removes redundant samples of the majority class
  (`Resampler.undersample`: at most ``theta`` of the class per step);
* over-sampling adds ``round(1/LI)`` re-oriented copies to the minority class.

The data work sits behind the `Resampler` protocol: `CountResampler` models it
at the count level (simulations of the paper's tables), and
`ursa.edge_sdk.methods.flicker.resampling.DataResampler` does it on images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from ursa._compat import StrEnum
from ursa.crypto.ckks import unit_vector

if TYPE_CHECKING:
    from ursa.crypto.ckks import CkksPublicContext

__all__ = [
    "DEFAULT_MAX_STEPS",
    "DEFAULT_NABLA_CLIENT",
    "DEFAULT_REDUNDANT_FRACTION",
    "DEFAULT_THETA",
    "CountResampler",
    "DeviceState",
    "Method",
    "Resampler",
    "ResamplingError",
    "SaturationReason",
    "StepReport",
    "add_counts",
    "encrypt_counts",
    "init_device",
    "local_imbalance",
    "oversample_amount",
    "resample_step",
    "round_half_up",
    "similarity_reply",
    "undersample_candidates",
    "update_global",
]

DEFAULT_NABLA_CLIENT = 0.05
"""Target local imbalance of a resampling device (the FLICKER paper, §4.1)."""
DEFAULT_THETA = 0.10
"""Fraction of the majority class tested for redundancy per step (§4.1: 10%)."""
DEFAULT_REDUNDANT_FRACTION = 0.5
"""Count-level model only: share of the tested samples the global test removes.

Not a paper parameter. The paper's removals are 52% (207 of 400, Table 6
client 1), 59% (176 of 300, client 2) and 38%-57% in Table 5, D1."""
DEFAULT_MAX_STEPS = 200
"""Safety cap on resampling steps per device (each step changes LI by > 0)."""

IntArray = npt.NDArray[np.int64]


class ResamplingError(ValueError):
    """Bad input to a device-side FLICKER step (the message says which)."""


class Method(StrEnum):
    """A resampling method."""

    UNDER = "under"
    OVER = "over"


class SaturationReason(StrEnum):
    """Why a device stopped resampling."""

    THRESHOLD = "threshold"  # LI >= nabla_client
    MISSING_CLASS = "missing_class"  # a class has no samples: LI stays 0
    STALLED = "stalled"  # two steps in a row changed nothing
    MAX_STEPS = "max_steps"


def round_half_up(value: float) -> int:
    """Nearest integer, halves rounded up (the paper's ``⌈x⌋``)."""
    return math.floor(value + 0.5)


def _counts(values: npt.ArrayLike) -> IntArray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size < 2:
        raise ResamplingError("counts must be a 1-D vector of >= 2 classes")
    if not np.issubdtype(array.dtype, np.integer) or (array.size and array.min() < 0):
        raise ResamplingError(f"counts must be non-negative integers, got {array}")
    return array.astype(np.int64)


def local_imbalance(counts: npt.ArrayLike) -> float:
    """Return ``LI = min(LD) / max(LD)`` (the FLICKER paper, eq. 1).

    Raises:
        ResamplingError: counts are not non-negative integers or all zero.
    """
    array = _counts(counts)
    top = int(array.max())
    if top == 0:
        raise ResamplingError("the device holds no samples")
    return int(array.min()) / top


def oversample_amount(counts: npt.ArrayLike) -> int:
    """Return ``round(1 / LI)``, the number of samples one over-sampling step adds.

    Raises:
        ResamplingError: a class is empty (``LI = 0``).
    """
    li = local_imbalance(counts)
    if li == 0.0:
        raise ResamplingError("cannot over-sample a class with no samples")
    return round_half_up(1.0 / li)


def undersample_candidates(class_count: int, theta: float) -> int:
    """Return how many samples of a class the local redundancy test buffers."""
    if not 0.0 < theta <= 1.0:
        raise ResamplingError(f"theta must be in (0, 1], got {theta}")
    return max(1, round_half_up(theta * class_count)) if class_count > 0 else 0


class Resampler(Protocol):
    """The data work of one resampling step on a device."""

    def undersample(self, counts: IntArray, label: int) -> int:
        """Remove redundant samples of class ``label``; return how many."""
        ...

    def oversample(self, counts: IntArray, label: int, amount: int) -> int:
        """Add ``amount`` re-oriented samples of class ``label``; return how many."""
        ...


@dataclass(frozen=True)
class CountResampler:
    """Count-level model of the data work, for simulating the paper's tables.

    Under-sampling removes ``round(redundant_fraction * candidates)`` where
    ``candidates = round(theta * count)`` is what the local test buffers; the
    fraction stands in for the global test's outcome, which needs the data.
    Over-sampling adds exactly ``amount`` (a class with samples can always be
    re-oriented).
    """

    theta: float = DEFAULT_THETA
    redundant_fraction: float = DEFAULT_REDUNDANT_FRACTION

    def __post_init__(self) -> None:
        if not 0.0 < self.theta <= 1.0:
            raise ResamplingError(f"theta must be in (0, 1], got {self.theta}")
        if not 0.0 <= self.redundant_fraction <= 1.0:
            raise ResamplingError(
                f"redundant_fraction must be in [0, 1], got {self.redundant_fraction}"
            )

    def undersample(self, counts: IntArray, label: int) -> int:
        """Return the modelled number of redundant samples removed."""
        candidates = undersample_candidates(int(counts[label]), self.theta)
        return round_half_up(self.redundant_fraction * candidates)

    def oversample(self, counts: IntArray, label: int, amount: int) -> int:
        """Return ``amount`` (0 for an empty class: nothing to re-orient)."""
        return amount if counts[label] > 0 else 0


@dataclass(frozen=True)
class DeviceState:
    """A device's FLICKER progress (immutable; `resample_step` returns a new one).

    Attributes:
        counts: current class counts of the training data.
        initial_counts: the counts before FLICKER.
        next_method: the method of the next step.
        alternate: flip the method after each step (FLICKER); False repeats
            ``next_method`` (the local over-/under-sampling baselines, §4.2).
        steps: resampling steps made.
        idle_steps: consecutive steps that changed nothing.
        added: samples added so far (over-sampling).
        removed: samples removed so far (under-sampling).
        saturation: why the device stopped, None while it can still resample.
    """

    counts: tuple[int, ...]
    initial_counts: tuple[int, ...]
    next_method: Method = Method.UNDER
    alternate: bool = True
    steps: int = 0
    idle_steps: int = 0
    added: int = 0
    removed: int = 0
    saturation: SaturationReason | None = None

    @property
    def saturated(self) -> bool:
        """True once the device has reached its maximum local balance."""
        return self.saturation is not None

    @property
    def li(self) -> float:
        """Current local imbalance."""
        return local_imbalance(self.counts)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        return {
            "counts_before": list(self.initial_counts),
            "counts_after": list(self.counts),
            "li_before": local_imbalance(self.initial_counts),
            "li_after": self.li,
            "added": self.added,
            "removed": self.removed,
            "steps": self.steps,
            "saturation": None if self.saturation is None else str(self.saturation),
        }


@dataclass(frozen=True)
class StepReport:
    """What one `resample_step` did."""

    method: Method | None
    label: int | None
    delta: tuple[int, ...]
    li_before: float
    li_after: float
    saturated: bool

    @property
    def changed(self) -> bool:
        """True if the counts changed (an encrypted update must be sent)."""
        return any(self.delta)


def init_device(
    counts: npt.ArrayLike, *, first: Method = Method.UNDER, alternate: bool = True
) -> DeviceState:
    """Return the state of a device before resampling.

    FLICKER alternates starting with under-sampling (the defaults); the local
    baselines use ``alternate=False`` with ``first`` the one method.
    """
    array = _counts(counts)
    local_imbalance(array)  # validates: not all zero
    values = tuple(int(c) for c in array)
    return DeviceState(
        counts=values, initial_counts=values, next_method=first, alternate=alternate
    )


def _next(method: Method) -> Method:
    return Method.OVER if method is Method.UNDER else Method.UNDER


def _saturation(
    state: DeviceState, nabla_client: float, max_steps: int
) -> SaturationReason | None:
    counts = np.asarray(state.counts, dtype=np.int64)
    if counts.min() == 0:
        return SaturationReason.MISSING_CLASS
    if local_imbalance(counts) >= nabla_client:
        return SaturationReason.THRESHOLD
    if state.idle_steps >= 2:
        return SaturationReason.STALLED
    if state.steps >= max_steps:
        return SaturationReason.MAX_STEPS
    return None


def resample_step(
    state: DeviceState,
    resampler: Resampler,
    *,
    nabla_client: float = DEFAULT_NABLA_CLIENT,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> tuple[DeviceState, StepReport]:
    """Make one resampling step (or none, if saturated) and report it.

    A device already at ``LI >= nabla_client`` (or otherwise saturated) changes
    nothing and reports ``saturated=True``; otherwise it applies
    ``state.next_method`` once, then flips the method for the next step.

    Raises:
        ResamplingError: ``nabla_client`` not in (0, 1] or a resampler that
            reports an impossible change.
    """
    if not 0.0 < nabla_client <= 1.0:
        raise ResamplingError(f"nabla_client must be in (0, 1], got {nabla_client}")
    counts = np.asarray(state.counts, dtype=np.int64)
    li_before = local_imbalance(counts)
    reason = state.saturation or _saturation(state, nabla_client, max_steps)
    if reason is not None:
        done = replace(state, saturation=reason)
        zero = tuple(0 for _ in state.counts)
        return done, StepReport(None, None, zero, li_before, li_before, True)
    method = state.next_method
    delta = np.zeros_like(counts)
    if method is Method.UNDER:
        label = int(np.argmax(counts))
        removed = resampler.undersample(counts.copy(), label)
        if not 0 <= removed < counts[label]:
            raise ResamplingError(
                f"resampler removed {removed} of {counts[label]} samples of {label}"
            )
        delta[label] = -removed
    else:
        label = int(np.argmin(counts))
        amount = oversample_amount(counts)
        added = resampler.oversample(counts.copy(), label, amount)
        if not 0 <= added <= amount:
            raise ResamplingError(f"resampler added {added}, asked for {amount}")
        delta[label] = added
    new_counts = counts + delta
    changed = bool(delta.any())
    state = replace(
        state,
        counts=tuple(int(c) for c in new_counts),
        next_method=_next(method) if state.alternate else method,
        steps=state.steps + 1,
        idle_steps=0 if changed else state.idle_steps + 1,
        added=state.added + int(delta.clip(min=0).sum()),
        removed=state.removed - int(delta.clip(max=0).sum()),
    )
    state = replace(state, saturation=_saturation(state, nabla_client, max_steps))
    report = StepReport(
        method=method,
        label=label,
        delta=tuple(int(d) for d in delta),
        li_before=li_before,
        li_after=local_imbalance(new_counts),
        saturated=state.saturated,
    )
    return state, report


def encrypt_counts(context: CkksPublicContext, counts: npt.ArrayLike) -> bytes:
    """First ring hop: ``Enc(LD)``."""
    return context.encrypt(_counts(counts).astype(np.float64))


def add_counts(
    context: CkksPublicContext, ciphertext: bytes, counts: npt.ArrayLike
) -> bytes:
    """Later ring hops: ``Enc(sum so far) + LD`` (a plaintext addition)."""
    return context.add_plain(ciphertext, _counts(counts).astype(np.float64))


def similarity_reply(
    context: CkksPublicContext,
    encrypted_global_unit: bytes,
    counts: npt.ArrayLike,
    rng: np.random.Generator,
) -> bytes:
    """Localisation: masked ``Enc(GD/||GD||) * LD/||LD||``; only the cosine decrypts.

    Use an unseeded ``np.random.default_rng()`` for ``rng`` outside tests.
    """
    array = _counts(counts)
    if not array.any():
        raise ResamplingError("the device holds no samples")
    return context.masked_product(encrypted_global_unit, unit_vector(array), rng)


def update_global(
    context: CkksPublicContext,
    encrypted_global: bytes,
    old_counts: npt.ArrayLike,
    new_counts: npt.ArrayLike,
) -> bytes:
    """Update step (§2.1.4): ``Enc(GD) - LD_old + LD_new``."""
    old, new = _counts(old_counts), _counts(new_counts)
    if old.shape != new.shape:
        raise ResamplingError(f"count shapes differ: {old.shape} vs {new.shape}")
    return context.add_plain(encrypted_global, (new - old).astype(np.float64))
