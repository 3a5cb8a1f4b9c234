"""FLICKER's device half: the ring, masked cosines and resampling, then the data.

The coordinator runs FLICKER between enrolment and the first key epoch.
`Flicker` is a `DeviceMethod`: it registers FLICKER's kinds on the client's
`Router` (the client admits them: topic, federation, sender; a ring hop only
from a device, on this device's own down topic), takes the CKKS public
context's chunked transfer (`take_transfer`), and seals and opens ring hops
through its `DeviceContext`. The protocol itself is a `FlickerParticipant`.

The run's end is the first `KeyEpochStart`: before it registers, the
client asks `replace_data` (once) and takes the result as its labels and,
when it trains, as its trainer's data, so Dubhe's registry and the training
rounds see the balanced data. Two ways to resample:

* with a shared feature extractor and images (`DataResampler`): rotated or
  flipped copies of the minority class, under-sampling by feature
  redundancy with the global test over the wire (the FLICKER paper, §3);
* otherwise by count (`CountResampler`): random copies and removals of the
  class's own samples (labels, and the samples when given).

The resampled data lives in memory: a device restarted after the run trains
on its stored data (the coordinator does not run FLICKER again).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.ckks import require_tenseal
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, LocalData
from ursa.edge_sdk.methods.flicker.participant import FlickerParticipant
from ursa.edge_sdk.methods.flicker.resampling import (
    CentroidFeatures,
    DataResampler,
    FeatureExtractor,
    TrainingView,
)
from ursa.edge_sdk.methods_config import FlickerDeviceSpec
from ursa.protocol.messages import Chunk, TransferManifest
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Router

__all__ = ["Flicker", "load_features", "resample_indices"]


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


class Flicker(DeviceMethod):
    """FLICKER's device half in an `EdgeClient`.

    Args:
        ctx: The device: FLICKER's ring hops are sealed and sent through it.
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
    role: ClassVar[MethodRole | None] = MethodRole.BALANCING

    def __init__(
        self,
        ctx: DeviceContext,
        spec: FlickerDeviceSpec | None = None,
        *,
        labels: NDArray[np.integer[Any]],
        x: NDArray[np.floating[Any]] | None = None,
        extractor: FeatureExtractor | None = None,
        num_classes: int | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        require_tenseal()  # at configuration, not when the ring starts
        self.ctx = ctx
        """The device this method runs on."""
        self.spec = spec if spec is not None else FlickerDeviceSpec()
        self._labels = np.asarray(labels, dtype=np.int64)
        self._x = None if x is None else np.asarray(x)
        if self._x is not None and len(self._x) != len(self._labels):
            raise ValueError("x and labels differ in length")
        self._num_classes = (
            num_classes or self.spec.num_classes or int(self._labels.max(initial=1)) + 1
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
        counts = (
            self._data.view.counts()
            if self._data is not None
            else np.bincount(self._labels, minlength=self._num_classes)
        )
        self.participant = FlickerParticipant(
            ctx,
            peers={},
            counts=counts,
            signed_members=True,
            resampler=self._data,
            rng=self._rng,
            max_steps=self.spec.max_steps,
            max_context_bytes=self.spec.max_context_bytes,
            global_test=self.spec.global_test,
        )
        """FLICKER's protocol over this device's `PeerChannel` (its context)."""

    def register(self, router: Router) -> None:
        """Register FLICKER's kinds (the participant's handlers)."""
        self.participant.register(router, owner=self.name)

    def take_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Take a transfer message of the CKKS context; False: another's (a model)."""
        if not self.participant.claims(message):
            return False
        self.participant.on_transfer(message)
        return True

    def replace_data(self) -> LocalData | None:
        """The data to train on after the run (resampled, or the device's own)."""
        x, labels = self.resampled()
        return LocalData(x, labels)

    @property
    def has_resampled(self) -> bool:
        """Whether a resampling step changed this device's counts."""
        participant = self.participant
        return participant.counts != tuple(participant.state.initial_counts)

    def resampled(self) -> tuple[NDArray[Any] | None, NDArray[np.int64]]:
        """The data to train on after the run: (samples or None, labels)."""
        if self._data is not None and self._x is not None:
            images, labels = self._data.view.materialise()
            return images.reshape(len(images), *self._x.shape[1:]), labels
        if not self.has_resampled:  # no run, or one that kept the counts
            return self._x, self._labels
        picked = resample_indices(self._labels, self.participant.counts, self._rng)
        return (None if self._x is None else self._x[picked]), self._labels[picked]


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
