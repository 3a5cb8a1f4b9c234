"""FLICKER in the `EdgeClient`: the ring, masked cosines and resampling, then the data.

The coordinator runs FLICKER between enrolment and the first key epoch. The
device half is a `FlickerParticipant` on the client's connection: the
client admits every message (topic, federation, sender; ring hops only on
the device's own down topic) and routes FLICKER's kinds here through its
`Router`; replies go into the client's outbox. The CKKS public context
arrives as a chunked transfer the client hands over (`claims`).

The run's end is the first `KeyEpochStart`: before it registers, the
client takes `resampled()` (once) as its labels and, when it trains, as its
trainer's data, so Dubhe's registry and the training rounds see the
balanced data. Two ways to resample:

* with a shared feature extractor and images (`DataResampler`): rotated or
  flipped copies of the minority class, under-sampling by feature
  redundancy with the global test over the wire (papers/003 §3);
* otherwise by count (`CountResampler`): random copies and removals of the
  class's own samples (labels, and the samples when given).

The resampled data lives in memory: a device restarted after the run trains
on its stored data (the coordinator does not run FLICKER again).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.ckks import require_tenseal
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.methods.flicker.participant import WORK_KINDS, FlickerParticipant
from ursa.edge_sdk.methods.flicker.resampling import (
    CentroidFeatures,
    DataResampler,
    FeatureExtractor,
    TrainingView,
)
from ursa.edge_sdk.methods_config import FlickerSpec
from ursa.protocol.messages import (
    BaseMessage,
    Chunk,
    CkksContextAnnounce,
    TransferManifest,
)
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Router

__all__ = ["PEER_KINDS", "Flicker", "load_features", "resample_indices"]

logger = logging.getLogger("ursa.edge_sdk.flicker")

_KINDS: tuple[type[BaseMessage], ...] = (CkksContextAnnounce, *WORK_KINDS)
PEER_KINDS = frozenset({"ring_hop"})
"""Kinds a device sends to another through the coordinator (own down topic only)."""


def load_features(path: Path) -> CentroidFeatures:
    """The shared extractor of ``features_file`` (``centroids``, ``temperature``).

    Raises:
        ValueError: unreadable, or not a (K, d) centroid matrix and a positive
            temperature.
    """
    with np.load(path, allow_pickle=False) as data:
        centroids = np.asarray(data["centroids"], dtype=np.float64)
        temperature = float(data["temperature"])
    if centroids.ndim != 2 or not temperature > 0.0:
        raise ValueError(f"{path}: needs centroids (K, d) and temperature > 0")
    return CentroidFeatures(centroids, temperature)


class Flicker:
    """FLICKER's device half in an `EdgeClient`.

    Args:
        spec: The device's ``kind = "flicker"`` table.
        labels: The device's labels (class indices).
        x: Its samples when it trains (resampled with the labels).
        extractor: The shared feature extractor: with square images in ``x``
            the device resamples images (`DataResampler`), else by count.
        num_classes: Classes of the federation (default: the spec's, else the
            labels' maximum plus one; give it when a class may be absent).
        rng: Masks, copies and removals (unseeded by default: never fix it
            in production).

    Raises:
        BackendUnavailableError: TenSEAL is not installed (the ``ckks`` extra).
        ValueError: samples and labels differ, or samples are not images.
    """

    name: ClassVar[str] = "flicker"

    def __init__(
        self,
        spec: FlickerSpec | None = None,
        *,
        labels: NDArray[np.integer[Any]],
        x: NDArray[np.floating[Any]] | None = None,
        extractor: FeatureExtractor | None = None,
        num_classes: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        require_tenseal()  # at configuration, not when the ring starts
        self.spec = spec if spec is not None else FlickerSpec()
        self._labels = np.asarray(labels, dtype=np.int64)
        self._x = None if x is None else np.asarray(x)
        if self._x is not None and len(self._x) != len(self._labels):
            raise ValueError("x and labels differ in length")
        self._num_classes = (
            num_classes
            or self.spec.num_classes
            or int(self._labels.max(initial=1)) + 1
        )
        self._rng = rng if rng is not None else np.random.default_rng()
        self._data: DataResampler | None = None
        if extractor is not None and self._x is not None:
            self._data = DataResampler(
                TrainingView.of(_images(self._x), self._labels, self._num_classes),
                extractor,
                self._rng,
                theta=self.spec.theta,
                mode=self.spec.orientation,
            )
        self.participant: FlickerParticipant | None = None

    def attach(
        self,
        *,
        identity: DeviceIdentity,
        federation: str,
        outbox: Outbox,
        verify: Callable[[BaseMessage], None],
        router: Router,
    ) -> None:
        """Join the client: its identity, outbox and router (a kind, one owner).

        ``verify`` checks the coordinator's signature on a `RingStart` (the
        ring members' keys come with it).
        """
        counts = (
            self._data.view.counts()
            if self._data is not None
            else np.bincount(self._labels, minlength=self._num_classes)
        )
        self.participant = FlickerParticipant(
            identity=identity,
            federation=federation,
            peers={},
            counts=counts,
            transport=None,
            outbox=outbox,
            verify=verify,
            resampler=self._data,
            rng=self._rng,
            max_steps=self.spec.max_steps,
            max_context_bytes=self.spec.max_context_bytes,
            global_test=self.spec.global_test,
        )
        for kind in _KINDS:
            router.register(kind, self._on_message, owner=self.name)

    def claims(self, message: TransferManifest | Chunk) -> bool:
        """Take a transfer message of the CKKS context; False: another's (a model)."""
        participant = self.participant
        if participant is None or not participant.claims_transfer(message):
            return False
        participant.on_message(message, relayed=True)
        return True

    @property
    def has_resampled(self) -> bool:
        """Whether a resampling step changed this device's counts."""
        participant = self.participant
        return participant is not None and participant.counts != tuple(
            participant.state.initial_counts
        )

    def resampled(self) -> tuple[NDArray[Any] | None, NDArray[np.int64]]:
        """The data to train on after the run: (samples or None, labels)."""
        if self._data is not None and self._x is not None:
            images, labels = self._data.view.materialise()
            return images.reshape(len(images), *self._x.shape[1:]), labels
        participant = self.participant
        if participant is None:
            return self._x, self._labels
        picked = resample_indices(self._labels, participant.counts, self._rng)
        return (None if self._x is None else self._x[picked]), self._labels[picked]

    def _on_message(self, message: BaseMessage) -> None:
        """A router handler: the client admitted the message."""
        if self.participant is not None:
            self.participant.on_message(message, relayed=True)


def _images(x: NDArray[Any]) -> NDArray[Any]:
    """Samples as square images (flattened digits are reshaped)."""
    if x.ndim >= 3:
        return x
    side = math.isqrt(int(x[0].size))
    if side * side != x[0].size:
        raise ValueError(f"samples of {x[0].size} values are not square images")
    return x.reshape(len(x), side, side)


def resample_indices(
    labels: NDArray[np.int64], counts: tuple[int, ...], rng: np.random.Generator
) -> NDArray[np.int64]:
    """Indices whose labels have ``counts``: kept, copied or dropped per class."""
    picked = []
    for label, target in enumerate(counts):
        own = np.flatnonzero(labels == label)
        if target <= len(own):
            picked.append(np.sort(rng.choice(own, size=target, replace=False)))
        elif len(own):
            extra = rng.choice(own, size=target - len(own), replace=True)
            picked.append(np.concatenate([own, extra]))
    if not picked:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(picked).astype(np.int64)

