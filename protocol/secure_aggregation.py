"""What both sides of secure aggregation must agree on, written once.

A device's contribution to a round is one vector in the uint32 ring
(`ursa.crypto.fixed_point`), laid out as::

    model     every float array of the model, flattened in the global model's
              order: weight * clip(delta)   (L2 clip ``clip_norm`` on the delta)
    weight    1 value: FedAvg's min(num_examples, max_examples); 1 for equal and
              CLIMB weighting (CLIMB's delta is already scaled on the device)
    loss, train_s, samples, reporting
              1 value each, when ``SecAggSetup.metrics`` (not under DP): the
              fleet's training figures come out of the same secure sum

Integer arrays (BatchNorm's ``num_batches_tracked``) are not in the vector:
the coordinator keeps its own value of them, as in plain aggregation. The
coordinator decodes the unmasked sum with the same layout:
``new = global + server_lr * model_sum / weight_sum``.

Each segment's fixed-point scale is the largest that keeps the sum of
``len(participants)`` honest contributions (and, under DP, eight standard
deviations of the summed noise) inside the ring, so an honest sum never wraps.

Distributed DP (``noise_multiplier`` z > 0): the vector normalised by its
segment bounds, ``[model / (a_max C), weight / a_max]``, has L2 norm at most
sqrt(2) (`SENSITIVITY`); each device adds discrete Gaussian noise of integer
standard deviation ``z * SENSITIVITY * bound * 2^s / sqrt(threshold)`` per
coordinate, so any sum over at least ``threshold`` devices carries noise of
standard deviation ``z * SENSITIVITY`` in normalised units: the Gaussian
mechanism with noise multiplier z (`ursa.coordinator.secure_aggregation.privacy`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from ursa.crypto.fixed_point import Segment, VectorLayout
from ursa.protocol.messages.secure_aggregation import SecAggSetup

__all__ = [
    "LOSS_BOUND",
    "METRIC_SLOTS",
    "MODEL_SEGMENT",
    "SENSITIVITY",
    "TRAIN_S_BOUND",
    "WEIGHT_SEGMENT",
    "advert_transcript",
    "contribution_layout",
    "float_names",
    "noise_sigmas",
    "weight_bound",
]

MODEL_SEGMENT = "model"
WEIGHT_SEGMENT = "weight"
METRIC_SLOTS = ("loss", "train_s", "samples", "reporting")
LOSS_BOUND = 1e3
"""A mean per-sample training loss above this is clipped (nats)."""
TRAIN_S_BOUND = 86_400.0
"""A round's local training time above a day is clipped."""
SENSITIVITY = math.sqrt(2.0)
"""L2 bound of one device's DP-protected vector in normalised units."""
_ADVERT_LABEL = b"ursa-secagg-advert-v1"
NOISE_TAIL = 8.0
"""Headroom kept in the ring for the summed noise, in standard deviations."""


def float_names(arrays: Mapping[str, Any]) -> tuple[str, ...]:
    """The arrays that go into the model segment, in the model's order.

    Integer arrays (counters) stay out: the coordinator keeps its own value.
    """
    return tuple(
        name for name, a in arrays.items() if np.asarray(a).dtype.kind not in "iub"
    )


def weight_bound(setup: SecAggSetup) -> float:
    """The largest weight a device may give its update in this round."""
    return float(setup.max_examples) if setup.weighting == "fedavg" else 1.0


def contribution_layout(setup: SecAggSetup, model_values: int) -> VectorLayout:
    """The round's vector layout for a model of ``model_values`` float values."""
    a_max = weight_bound(setup)
    segments = [
        Segment(MODEL_SEGMENT, model_values, a_max * setup.clip_norm),
        Segment(WEIGHT_SEGMENT, 1, a_max),
    ]
    if setup.metrics and setup.noise_multiplier == 0.0:
        segments += [
            Segment("loss", 1, LOSS_BOUND),
            Segment("train_s", 1, TRAIN_S_BOUND),
            Segment("samples", 1, float(setup.max_examples)),
            Segment("reporting", 1, 1.0),
        ]
    headroom = max(NOISE_TAIL * _summed_noise_std(setup, s.bound) for s in segments)
    return VectorLayout(segments, len(setup.participants), headroom)


def noise_sigmas(setup: SecAggSetup, layout: VectorLayout) -> dict[str, float]:
    """Each segment's per-device discrete Gaussian sigma, in ring units (0: no DP)."""
    out: dict[str, float] = {}
    for segment, codec in zip(layout.segments, layout.codecs, strict=True):
        real = _device_noise_std(setup, segment.bound)
        out[segment.name] = real * float(2**codec.scale_bits)
    return out


def _device_noise_std(setup: SecAggSetup, bound: float) -> float:
    z = setup.noise_multiplier
    return z * SENSITIVITY * bound / math.sqrt(setup.threshold) if z else 0.0


def _summed_noise_std(setup: SecAggSetup, bound: float) -> float:
    return _device_noise_std(setup, bound) * math.sqrt(len(setup.participants))


def advert_transcript(
    federation: str,
    run: str,
    round_index: int,
    device_id: str,
    c_public: bytes,
    s_public: bytes,
) -> bytes:
    """The bytes a device signs to advertise its round keys (both sides check).

    ``"ursa-secagg-advert-v1" | lp(federation) | lp(run) | round (8, BE) |
    lp(device_id) | lp(c_public) | lp(s_public)`` (lp: 4-byte big-endian
    length prefix): binding the round stops a coordinator from replaying last
    round's keys (and so last round's masks).
    """
    parts = (
        federation.encode(),
        run.encode(),
        struct.pack(">Q", round_index),
        device_id.encode(),
        c_public,
        s_public,
    )
    return _ADVERT_LABEL + b"".join(struct.pack(">I", len(p)) + p for p in parts)
