"""FLICKER on the coordinator: ring order, GI, localisation and the correction loop.

FLICKER (the FLICKER paper, §2) runs before training. The coordinator holds
the CKKS secret key; by design (docs/threat_model.md) it learns the global class counts
``GD``, each device's cosine similarity with ``GD`` and the dominant device's
count changes, never a device's own counts.

One run, as a state machine (`FlickerState`, stages `CorrectionStage`):

1. The devices sum their counts around a ring whose order the coordinator
   picks (`choose_ring_order`; `ring_successor` skips silent devices); the
   coordinator decrypts ``GD`` (`decrypt_global_counts`) and calls `start`.
   ``GI = min(GD) / max(GD)`` (eq. 2); at ``GI >= nabla`` the run is done.
2. LOCALISE: the coordinator broadcasts ``Enc(GD / ||GD||)``
   (`encrypt_normalised_global`); every non-saturated device answers a masked
   product; `decrypt_similarity` gives its cosine; `on_similarities` picks the
   dominant device (largest cosine among non-saturated devices, §2.1.2).
3. RESAMPLE: the dominant device makes one resampling step and returns the
   updated ``Enc(GD)`` with a saturation flag; `on_update` decrypts nothing
   itself but takes the new counts: ``GI >= nabla`` ends the run; a device
   that is not saturated stays dominant (§2.1.4 rule 1); a saturated one is
   excluded and localisation runs again (rule 2); when every device is
   saturated the run ends (``StopReason.ALL_SATURATED``).

The coordinator side of the global redundancy test (the FLICKER paper, §3.2.2) is
`decrypt_block_similarities`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ursa._compat import StrEnum

if TYPE_CHECKING:
    from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext

__all__ = [
    "DEFAULT_MAX_UPDATES",
    "DEFAULT_NABLA",
    "MIN_RING_DEVICES",
    "CorrectionStage",
    "FlickerError",
    "FlickerState",
    "StopReason",
    "choose_ring_order",
    "decrypt_block_similarities",
    "decrypt_global_counts",
    "decrypt_similarity",
    "encrypt_normalised_global",
    "global_imbalance",
    "localisation_candidates",
    "on_similarities",
    "on_update",
    "pick_dominant",
    "ring_successor",
    "start",
]

DEFAULT_NABLA = 0.1
"""Target global imbalance (the FLICKER paper, §4.1)."""
MIN_RING_DEVICES = 3
"""With two devices each would learn the other's counts from the global sum."""
DEFAULT_MAX_UPDATES = 10_000
"""Safety cap on resampling updates; the loop also ends by saturation."""
COUNT_TOLERANCE = 0.01
"""Decrypted counts must lie this close to an integer (CKKS error is ~1e-6)."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class FlickerError(ValueError):
    """Bad input to a FLICKER step, or a step called in the wrong stage."""


class CorrectionStage(StrEnum):
    """Where a FLICKER run stands."""

    LOCALISE = "localise"
    RESAMPLE = "resample"
    DONE = "done"


class StopReason(StrEnum):
    """Why a FLICKER run ended."""

    BALANCED = "balanced"
    ALL_SATURATED = "all_saturated"
    MAX_UPDATES = "max_updates"


def _counts(values: npt.ArrayLike, what: str) -> IntArray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size < 2:
        raise FlickerError(f"{what} must be a 1-D vector of >= 2 classes")
    if not np.issubdtype(array.dtype, np.integer):
        raise FlickerError(f"{what} must be integers, got {array.dtype}")
    if array.min() < 0:
        raise FlickerError(f"{what} must be non-negative, got {array.tolist()}")
    return array.astype(np.int64)


def global_imbalance(global_counts: npt.ArrayLike) -> float:
    """Return ``GI = min(GD) / max(GD)`` (the FLICKER paper, eq. 2).

    Raises:
        FlickerError: the counts are not non-negative integers or all zero.
    """
    counts = _counts(global_counts, "global counts")
    top = int(counts.max())
    if top == 0:
        raise FlickerError("global counts are all zero")
    return int(counts.min()) / top


def choose_ring_order(
    device_ids: Sequence[str], rng: np.random.Generator
) -> tuple[str, ...]:
    """Return the ring order: a random permutation of ``device_ids``.

    A fresh order per run keeps any one device from always being first (the
    first device's ciphertext holds only its own counts).

    Raises:
        FlickerError: fewer than `MIN_RING_DEVICES` devices or duplicate ids.
    """
    ids = list(device_ids)
    if len(set(ids)) != len(ids):
        raise FlickerError("device ids in the ring must be distinct")
    if len(ids) < MIN_RING_DEVICES:
        raise FlickerError(
            f"the FLICKER ring needs >= {MIN_RING_DEVICES} devices, got {len(ids)}"
        )
    return tuple(ids[i] for i in rng.permutation(len(ids)))


def ring_successor(
    order: Sequence[str], device_id: str, silent: Collection[str] = ()
) -> str | None:
    """Return the next live device after ``device_id``; None means the coordinator.

    A device whose successor stays silent past the deadline calls this again
    with that successor in ``silent`` and sends its ciphertext further on.

    Raises:
        FlickerError: ``device_id`` is not in the ring.
    """
    if device_id not in order:
        raise FlickerError(f"device {device_id!r} is not in the ring")
    for nxt in order[list(order).index(device_id) + 1 :]:
        if nxt not in silent:
            return nxt
    return None


def decrypt_global_counts(
    key_owner: CkksKeyOwner, ciphertext: bytes, num_classes: int
) -> IntArray:
    """Decrypt ``Enc(GD)`` into integer counts.

    Raises:
        FlickerError: a slot is negative or not within `COUNT_TOLERANCE` of an
            integer (a wrong or tampered ring sum).
    """
    values = key_owner.decrypt(ciphertext)[:num_classes]
    rounded = np.rint(values)
    if len(values) != num_classes or np.max(np.abs(values - rounded)) > COUNT_TOLERANCE:
        raise FlickerError(f"decrypted global counts are not integers: {values}")
    if rounded.min() < 0:
        raise FlickerError(f"decrypted global counts are negative: {rounded}")
    return rounded.astype(np.int64)


def encrypt_normalised_global(
    context: CkksPublicContext, global_counts: npt.ArrayLike
) -> bytes:
    """Return ``Enc(GD / ||GD||)``, broadcast for localisation (§2.1.2)."""
    counts = _counts(global_counts, "global counts").astype(np.float64)
    norm = float(np.linalg.norm(counts))
    if norm == 0.0:
        raise FlickerError("global counts are all zero")
    return context.encrypt(counts / norm)


def decrypt_similarity(key_owner: CkksKeyOwner, reply: bytes) -> float:
    """Return a device's cosine similarity from its masked-product reply."""
    return key_owner.decrypt_sum(reply)


def decrypt_block_similarities(
    key_owner: CkksKeyOwner, ciphertexts: Sequence[bytes], count: int, block: int
) -> FloatArray:
    """Sum each ``block``-slot group of masked block products (global test).

    ``ciphertexts`` come from
    `ursa.edge_sdk.methods.flicker.resampling.masked_block_products`:
    slot group ``j`` holds ``b * v_j + m_j`` with ``sum(m_j) = 0``, so the
    group sum is ``<b, v_j>`` and nothing finer. Returns the first ``count``
    similarities.

    Raises:
        FlickerError: ``block`` is not positive or the ciphertexts hold fewer
            than ``count`` groups.
    """
    if block < 1:
        raise FlickerError(f"block must be >= 1, got {block}")
    sums: list[FloatArray] = []
    for ciphertext in ciphertexts:
        values = key_owner.decrypt(ciphertext)
        groups = len(values) // block
        sums.append(values[: groups * block].reshape(groups, block).sum(axis=1))
    out = np.concatenate(sums) if sums else np.zeros(0)
    if len(out) < count:
        raise FlickerError(f"expected {count} similarities, got {len(out)}")
    return out[:count]


def pick_dominant(
    similarities: Mapping[str, float], saturated: Collection[str]
) -> str | None:
    """Return the non-saturated device of largest cosine (ties: smallest id)."""
    live = [(-sim, dev) for dev, sim in similarities.items() if dev not in saturated]
    for _, dev in live:
        if not math.isfinite(similarities[dev]):
            raise FlickerError(f"similarity of {dev!r} is not finite")
    return min(live)[1] if live else None


@dataclass(frozen=True)
class FlickerState:
    """The coordinator's view of one FLICKER run (immutable; steps return new ones).

    Attributes:
        devices: the participating devices.
        global_counts: the current decrypted ``GD``.
        gi: ``global_imbalance(global_counts)``.
        nabla: the target ``GI``.
        stage: what the coordinator waits for next.
        dominant: the device asked to resample (stage RESAMPLE).
        saturated: devices that reported saturation.
        updates: number of count updates received.
        localisations: number of localisation rounds started.
        max_updates: the safety cap on updates.
        stop_reason: why the run ended (stage DONE).
    """

    devices: tuple[str, ...]
    global_counts: tuple[int, ...]
    gi: float
    nabla: float
    stage: CorrectionStage
    dominant: str | None = None
    saturated: frozenset[str] = frozenset()
    updates: int = 0
    localisations: int = 0
    max_updates: int = DEFAULT_MAX_UPDATES
    stop_reason: StopReason | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        return {
            "devices": list(self.devices),
            "global_counts": list(self.global_counts),
            "gi": self.gi,
            "nabla": self.nabla,
            "stage": str(self.stage),
            "dominant": self.dominant,
            "saturated": sorted(self.saturated),
            "updates": self.updates,
            "localisations": self.localisations,
            "max_updates": self.max_updates,
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FlickerState:
        """Rebuild from `to_dict` (a restarted coordinator's run).

        Raises:
            KeyError, TypeError, ValueError: a damaged record.
        """
        reason = data["stop_reason"]
        return cls(
            devices=tuple(str(d) for d in data["devices"]),
            global_counts=tuple(int(c) for c in data["global_counts"]),
            gi=float(data["gi"]),
            nabla=float(data["nabla"]),
            stage=CorrectionStage(data["stage"]),
            dominant=None if data["dominant"] is None else str(data["dominant"]),
            saturated=frozenset(str(d) for d in data["saturated"]),
            updates=int(data["updates"]),
            localisations=int(data["localisations"]),
            max_updates=int(data.get("max_updates", DEFAULT_MAX_UPDATES)),
            stop_reason=None if reason is None else StopReason(reason),
        )


def _check_stage(state: FlickerState, expected: CorrectionStage) -> None:
    if state.stage != expected:
        raise FlickerError(f"FLICKER is in stage {state.stage}, not {expected}")


def start(
    devices: Sequence[str],
    global_counts: npt.ArrayLike,
    *,
    nabla: float = DEFAULT_NABLA,
    max_updates: int = DEFAULT_MAX_UPDATES,
) -> FlickerState:
    """Begin a run from the ring's decrypted global counts.

    Raises:
        FlickerError: ``nabla`` not in (0, 1), ``max_updates`` < 1, or bad counts.
    """
    if not 0.0 < nabla < 1.0:
        raise FlickerError(f"nabla must be in (0, 1), got {nabla}")
    if max_updates < 1:
        raise FlickerError(f"max_updates must be >= 1, got {max_updates}")
    if len(set(devices)) != len(devices) or not devices:
        raise FlickerError("devices must be a non-empty list of distinct ids")
    counts = _counts(global_counts, "global counts")
    gi = global_imbalance(counts)
    balanced = gi >= nabla
    return FlickerState(
        devices=tuple(devices),
        global_counts=tuple(int(c) for c in counts),
        gi=gi,
        nabla=nabla,
        stage=CorrectionStage.DONE if balanced else CorrectionStage.LOCALISE,
        max_updates=max_updates,
        stop_reason=StopReason.BALANCED if balanced else None,
        localisations=0 if balanced else 1,
    )


def localisation_candidates(state: FlickerState) -> tuple[str, ...]:
    """Return the devices asked for a cosine similarity (the non-saturated ones)."""
    _check_stage(state, CorrectionStage.LOCALISE)
    return tuple(d for d in state.devices if d not in state.saturated)


def on_similarities(
    state: FlickerState, similarities: Mapping[str, float]
) -> FlickerState:
    """Pick the dominant device from the decrypted cosine similarities.

    Devices missing from ``similarities`` (silent) are not chosen this time.
    """
    _check_stage(state, CorrectionStage.LOCALISE)
    unknown = set(similarities) - set(state.devices)
    if unknown:
        raise FlickerError(f"similarities from unknown devices {sorted(unknown)}")
    dominant = pick_dominant(similarities, state.saturated)
    if dominant is None:
        return replace(
            state,
            stage=CorrectionStage.DONE,
            dominant=None,
            stop_reason=StopReason.ALL_SATURATED,
        )
    return replace(state, stage=CorrectionStage.RESAMPLE, dominant=dominant)


def on_update(
    state: FlickerState,
    global_counts: npt.ArrayLike | None,
    *,
    saturated: bool,
) -> FlickerState:
    """Take the dominant device's answer: new ``GD`` (None if unchanged) and its flag.

    Implements §2.1.4: stop at ``GI >= nabla``; otherwise keep the same
    dominant device until it saturates, then localise again without it; stop
    when every device is saturated.
    """
    _check_stage(state, CorrectionStage.RESAMPLE)
    dominant = state.dominant
    if dominant is None:  # unreachable through these functions
        raise FlickerError("no dominant device in stage RESAMPLE")
    if global_counts is not None:
        counts = _counts(global_counts, "global counts")
        if len(counts) != len(state.global_counts):
            raise FlickerError(
                f"update has {len(counts)} classes, expected {len(state.global_counts)}"
            )
        state = replace(
            state,
            global_counts=tuple(int(c) for c in counts),
            gi=global_imbalance(counts),
            updates=state.updates + 1,
        )
    if saturated:
        state = replace(state, saturated=state.saturated | {dominant})
    if state.gi >= state.nabla:
        return replace(
            state, stage=CorrectionStage.DONE, stop_reason=StopReason.BALANCED
        )
    if state.updates >= state.max_updates:
        return replace(
            state, stage=CorrectionStage.DONE, stop_reason=StopReason.MAX_UPDATES
        )
    if not saturated:
        return state
    if state.saturated >= set(state.devices):
        return replace(
            state,
            stage=CorrectionStage.DONE,
            dominant=None,
            stop_reason=StopReason.ALL_SATURATED,
        )
    return replace(
        state,
        stage=CorrectionStage.LOCALISE,
        dominant=None,
        localisations=state.localisations + 1,
    )
