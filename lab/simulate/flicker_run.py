"""One FLICKER run in one process, with real CKKS and every operation counted.

`run_flicker` drives the same coordinator and device functions the wire
protocol uses (`ursa.coordinator.methods.flicker.algorithm`,
`ursa.edge_sdk.methods.flicker.algorithm`), without a
transport: the ring sum of encrypted counts, ``GI``, localisation by masked
encrypted cosine similarity, the dominant device's resampling steps and
encrypted count updates, until ``GI >= nabla`` or every device is saturated.
Every decrypted value is checked against the plaintext result, and every CKKS
operation is counted (`CountingContext`, `CountingKeyOwner`). The local
baselines of the FLICKER paper, §4.2, are `run_local_baseline`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.methods.flicker import algorithm as coord
from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext, Values
from ursa.edge_sdk.methods.flicker import algorithm as dev

__all__ = [
    "COSINE_TOLERANCE",
    "CountingContext",
    "CountingKeyOwner",
    "FlickerRun",
    "SimulationError",
    "baseline_report",
    "format_counts",
    "run_flicker",
    "run_local_baseline",
]

IntArray = npt.NDArray[np.int64]

COSINE_TOLERANCE = 1e-4


class SimulationError(RuntimeError):
    """An encrypted result disagrees with the plaintext one."""


class CountingContext(CkksPublicContext):
    """A public context that counts its CKKS operations in ``counter``."""

    counter: Counter[str]

    @classmethod
    def counting(cls, data: bytes, counter: Counter[str]) -> CountingContext:
        """Load a public context whose operations add to ``counter``."""
        context = cls.from_bytes(data)
        if not isinstance(context, CountingContext):  # from_bytes builds cls
            raise TypeError("from_bytes did not build a CountingContext")
        context.counter = counter
        return context

    def encrypt(self, values: Values) -> bytes:
        """Count, then encrypt."""
        self.counter["encrypt"] += 1
        return super().encrypt(values)

    def add(self, a: bytes, b: bytes) -> bytes:
        """Count, then add."""
        self.counter["add"] += 1
        return super().add(a, b)

    def add_plain(self, a: bytes, values: Values) -> bytes:
        """Count, then add a plain vector."""
        self.counter["add_plain"] += 1
        return super().add_plain(a, values)

    def multiply_plain(self, a: bytes, values: Values) -> bytes:
        """Count, then multiply by a plain vector."""
        self.counter["multiply_plain"] += 1
        return super().multiply_plain(a, values)

    def masked_product(
        self, ciphertext: bytes, plain_unit: Values, rng: np.random.Generator
    ) -> bytes:
        """Count, then compute a masked product."""
        self.counter["masked_product"] += 1
        return super().masked_product(ciphertext, plain_unit, rng)


class CountingKeyOwner(CkksKeyOwner):
    """A key owner that counts its decryptions in ``counter``."""

    def __init__(self, counter: Counter[str]) -> None:
        super().__init__()
        self.counter = counter

    def decrypt(self, ciphertext: bytes) -> npt.NDArray[np.float64]:
        """Count, then decrypt."""
        self.counter["decrypt"] += 1
        return super().decrypt(ciphertext)

    def decrypt_sum(self, masked_product: bytes) -> float:
        """Count, then decrypt and sum (one operation, not two)."""
        self.counter["decrypt_sum"] += 1
        return math.fsum(CkksKeyOwner.decrypt(self, masked_product).tolist())


@dataclass
class FlickerRun:
    """Everything one simulated FLICKER run did."""

    ring_order: tuple[str, ...]
    initial: dict[str, dev.DeviceState]
    final: dict[str, dev.DeviceState]
    state: coord.FlickerState
    gd_before: tuple[int, ...]
    log: list[dict[str, Any]] = field(default_factory=list)
    device_ops: Counter[str] = field(default_factory=Counter)
    coordinator_ops: Counter[str] = field(default_factory=Counter)
    max_cosine_error: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able report."""
        finals = self.final.values()
        added = sum(s.added for s in finals)
        removed = sum(s.removed for s in finals)
        updates = Counter(e["device"] for e in self.log if e.get("update"))
        n = len(self.final)
        worst = 2 * n * max(updates.values(), default=0) + 3 * n + 2
        return {
            "ring_order": list(self.ring_order),
            "devices": [{"device": d, **s.to_dict()} for d, s in self.final.items()],
            "gd_before": list(self.gd_before),
            "gd_after": list(self.state.global_counts),
            "gi_before": coord.global_imbalance(self.gd_before),
            "gi_after": self.state.gi,
            "stop_reason": str(self.state.stop_reason),
            "reached_nabla": self.state.gi >= self.state.nabla,
            "all_saturated": all(s.saturated for s in finals),
            "added": added,
            "removed": removed,
            "net_change": added - removed,
            "localisations": self.state.localisations,
            "updates": self.state.updates,
            "ckks_ops": {
                "device": dict(self.device_ops),
                "coordinator": dict(self.coordinator_ops),
                "total": sum(self.device_ops.values())
                + sum(self.coordinator_ops.values()),
                "paper_worst_case": worst,
            },
            "max_cosine_error": self.max_cosine_error,
            "steps": self.log,
        }


def _plain_cosine(counts: Sequence[int], global_counts: Sequence[int]) -> float:
    a, b = np.asarray(counts, float), np.asarray(global_counts, float)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _checked_gd(
    key_owner: CkksKeyOwner, ciphertext: bytes, states: Mapping[str, dev.DeviceState]
) -> IntArray:
    plain = np.sum([s.counts for s in states.values()], axis=0)
    gd = coord.decrypt_global_counts(key_owner, ciphertext, len(plain))
    if not np.array_equal(gd, plain):
        raise SimulationError(f"decrypted GD {gd} != plaintext {plain}")
    return gd


def run_flicker(
    counts: Mapping[str, Sequence[int]],
    resamplers: Mapping[str, dev.Resampler],
    *,
    nabla: float = coord.DEFAULT_NABLA,
    nabla_client: float = dev.DEFAULT_NABLA_CLIENT,
    max_steps: int = dev.DEFAULT_MAX_STEPS,
    seed: int = 0,
    key_owner: CountingKeyOwner | None = None,
    device_context: CountingContext | None = None,
) -> FlickerRun:
    """Run FLICKER over ``counts`` (device -> class counts) with real CKKS.

    Raises:
        SimulationError: a decrypted result differs from the plaintext one.
    """
    rng = np.random.default_rng(seed)
    coord_ops: Counter[str] = key_owner.counter if key_owner else Counter()
    owner = key_owner or CountingKeyOwner(coord_ops)
    coord_ctx = CountingContext.counting(owner.public_context_bytes(), coord_ops)
    ctx = device_context or CountingContext.counting(
        owner.public_context_bytes(), Counter()
    )
    states = {d: dev.init_device(c) for d, c in counts.items()}
    order = coord.choose_ring_order(list(states), rng)
    enc_gd = dev.encrypt_counts(ctx, states[order[0]].counts)
    for d in order[1:]:
        enc_gd = dev.add_counts(ctx, enc_gd, states[d].counts)
    gd = _checked_gd(owner, enc_gd, states)
    fl = coord.start(list(states), gd, nabla=nabla)
    run = FlickerRun(order, dict(states), states, fl, tuple(int(c) for c in gd))
    while fl.stage is not coord.CorrectionStage.DONE:
        if fl.stage is coord.CorrectionStage.LOCALISE:
            enc_unit = coord.encrypt_normalised_global(coord_ctx, fl.global_counts)
            sims = {}
            for c in coord.localisation_candidates(fl):
                reply = dev.similarity_reply(ctx, enc_unit, states[c].counts, rng)
                sims[c] = coord.decrypt_similarity(owner, reply)
                plain = _plain_cosine(states[c].counts, fl.global_counts)
                run.max_cosine_error = max(run.max_cosine_error, abs(sims[c] - plain))
            if run.max_cosine_error > COSINE_TOLERANCE:
                raise SimulationError(f"cosine error {run.max_cosine_error}")
            fl = coord.on_similarities(fl, sims)
            run.log.append(
                {
                    "localise": {c: round(s, 6) for c, s in sims.items()},
                    "dominant": fl.dominant,
                }
            )
            continue
        dominant = fl.dominant
        if dominant is None:
            raise SimulationError("stage RESAMPLE without a dominant device")
        old = states[dominant]
        states[dominant], report = dev.resample_step(
            old, resamplers[dominant], nabla_client=nabla_client, max_steps=max_steps
        )
        new_gd = None
        if report.changed:
            new = states[dominant].counts
            enc_gd = dev.update_global(ctx, enc_gd, old.counts, new)
            new_gd = _checked_gd(owner, enc_gd, states)
        fl = coord.on_update(fl, new_gd, saturated=report.saturated)
        run.log.append(
            {
                "device": dominant,
                "method": None if report.method is None else str(report.method),
                "label": report.label,
                "delta": list(report.delta),
                "li": round(report.li_after, 6),
                "saturated": report.saturated,
                "update": report.changed,
                "gi": round(fl.gi, 6),
            }
        )
    run.state, run.final = fl, states
    run.device_ops, run.coordinator_ops = ctx.counter, coord_ops
    return run


def run_local_baseline(
    counts: Sequence[int],
    method: dev.Method,
    resampler: dev.Resampler,
    *,
    nabla_client: float = dev.DEFAULT_NABLA_CLIENT,
    max_steps: int = dev.DEFAULT_MAX_STEPS,
) -> dev.DeviceState:
    """One device corrects its own LI with one method only (§4.2 baselines)."""
    state = dev.init_device(counts, first=method, alternate=False)
    while not state.saturated:
        state, _ = dev.resample_step(
            state, resampler, nabla_client=nabla_client, max_steps=max_steps
        )
    return state


def baseline_report(states: Mapping[str, dev.DeviceState]) -> dict[str, Any]:
    """Summarise devices that corrected their own LI (a §4.2 baseline)."""
    gd = np.sum([s.counts for s in states.values()], axis=0)
    added = sum(s.added for s in states.values())
    removed = sum(s.removed for s in states.values())
    return {
        "devices": [{"device": d, **s.to_dict()} for d, s in states.items()],
        "gd_after": [int(c) for c in gd],
        "gi_after": coord.global_imbalance(gd),
        "added": added,
        "removed": removed,
        "net_change": added - removed,
    }


def format_counts(counts: Sequence[int | None]) -> str:
    """Render counts as ``a/b/c`` (``-`` for an empty cell)."""
    return "/".join("-" if c is None else str(c) for c in counts)
