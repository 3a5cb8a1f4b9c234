"""FLICKER's data-level resampling of images (the FLICKER paper, §3); stored data stays.

A `TrainingView` says which of the device's stored samples it trains on
(``kept``) plus synthetic samples; every operation returns a new view and
never writes to the stored arrays, so resampling changes what the device
trains on afterwards, not what the user has.

* Over-sampling (§3.1): the minority class gets ``amount`` re-oriented copies
  of its existing samples, sources picked uniformly (a random permutation of
  the class, cycled). Orientations: ``"rotate"`` draws an angle uniformly in
  ``±max_angle_deg`` (default for digits: a mirrored or upside-down digit is
  another digit), ``"dihedral"`` one of the 7 non-identity flips/quarter turns
  (for natural images such as CIFAR).
* Under-sampling (§3.2): features from a shared `FeatureExtractor`, made unit
  norm. Local test: the ``theta`` share of the majority class with the highest
  mean cosine similarity to the other samples of the class, ordered by the
  variance of those similarities (largest first). Global test: a buffered
  sample is removed if at least ``chi`` of the other devices' vectors of the
  class have cosine above ``eta`` (`is_globally_redundant`). ``global_test``
  computes it: in one process (`ursa simulate flicker --train`) each buffered
  vector is encrypted (`encrypt_tiled`), the other devices compute its cosine
  with their vectors (`class_features`) on the ciphertext
  (`masked_block_products`) and the key owner decrypts the per-vector sums
  (`ursa.coordinator.methods.flicker.algorithm.decrypt_block_similarities`). Over the
  wire
  (`ursa.edge_sdk.methods.flicker.redundancy`) the candidates travel sealed to the
  other devices and the coordinator decrypts only blinded signs
  (`ursa.edge_sdk.methods.flicker.global_redundancy`, which says what each party
  learns).

The shared feature extractor here is `CentroidFeatures`: the soft-max output
of a nearest-class-mean classifier fit on auxiliary data, a numpy stand-in for
the paper's pre-shared K-class network (§4.1: K = 4 outputs, trained on
auxiliary samples). Any callable mapping ``(n, ...)`` samples to ``(n, K)``
features fits `FeatureExtractor`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import pad_length, zero_sum_mask
from ursa.edge_sdk.methods.flicker.algorithm import (
    DEFAULT_THETA,
    ResamplingError,
    undersample_candidates,
)

if TYPE_CHECKING:
    from ursa.crypto.ckks import CkksPublicContext

__all__ = [
    "DEFAULT_CHI",
    "DEFAULT_ETA",
    "DEFAULT_MAX_ANGLE_DEG",
    "CentroidFeatures",
    "DataResampler",
    "FeatureExtractor",
    "GlobalTest",
    "Orientation",
    "TrainingView",
    "encrypt_tiled",
    "is_globally_redundant",
    "local_redundancy",
    "masked_block_products",
    "orient",
    "oversample",
    "undersample",
    "unit_rows",
]

DEFAULT_ETA = 0.98
"""Cosine threshold of the global redundancy test (the FLICKER paper, §4.1)."""
DEFAULT_CHI = 0.5
"""Share of the other devices' vectors that must exceed ``eta`` (the paper
gives no value; 0.5 = a sample is redundant if most of the fleet's samples
of its class look like it)."""
DEFAULT_MAX_ANGLE_DEG = 15.0

FloatArray = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
OrientationMode = Literal["rotate", "dihedral"]
GlobalTest = Callable[[int, Float64Array], BoolArray]
"""``(label, unit candidate features (b, K)) -> removable flags (b,)``."""


@dataclass(frozen=True)
class Orientation:
    """Mirror left-right (if ``flip``), then rotate counter-clockwise by the angle."""

    angle_deg: float = 0.0
    flip: bool = False


def _rotate(images: FloatArray, angle_deg: float) -> FloatArray:
    """Rotate the last two axes about the centre, bilinear, zero outside."""
    quarter = angle_deg / 90.0
    if quarter == round(quarter):
        turned: FloatArray = np.rot90(
            images, k=round(quarter) % 4, axes=(-2, -1)
        ).copy()
        return turned
    h, w = images.shape[-2:]
    cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
    theta = -np.deg2rad(angle_deg)  # counter-clockwise as displayed, like np.rot90
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float64)
    # inverse map: output pixel -> source position (rows grow downwards)
    dy, dx = rows - cy, cols - cx
    src_y = cy + np.cos(theta) * dy - np.sin(theta) * dx
    src_x = cx + np.sin(theta) * dy + np.cos(theta) * dx
    y0, x0 = np.floor(src_y).astype(int), np.floor(src_x).astype(int)
    fy, fx = src_y - y0, src_x - x0
    out = np.zeros(images.shape, dtype=np.float64)
    for oy, ox, weight in (
        (0, 0, (1 - fy) * (1 - fx)),
        (0, 1, (1 - fy) * fx),
        (1, 0, fy * (1 - fx)),
        (1, 1, fy * fx),
    ):
        yy, xx = y0 + oy, x0 + ox
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        values = images[..., np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
        out += np.where(inside, weight, 0.0) * values
    return out.astype(images.dtype)


def orient(image: FloatArray, orientation: Orientation) -> FloatArray:
    """Return a re-oriented copy of ``image`` (shape ``(..., H, W)``)."""
    if image.ndim < 2:
        raise ResamplingError(f"an image needs >= 2 axes, got shape {image.shape}")
    out = np.flip(image, axis=-1) if orientation.flip else image
    return _rotate(out, orientation.angle_deg)


_DIHEDRAL = tuple(
    Orientation(angle, flip)
    for flip in (False, True)
    for angle in (0.0, 90.0, 180.0, 270.0)
    if (angle, flip) != (0.0, False)
)


def _draw_orientations(
    n: int, rng: np.random.Generator, mode: OrientationMode, max_angle_deg: float
) -> tuple[Orientation, ...]:
    if mode == "dihedral":
        return tuple(_DIHEDRAL[i] for i in rng.integers(0, len(_DIHEDRAL), size=n))
    if mode != "rotate" or not 0.0 < max_angle_deg < 180.0:
        raise ResamplingError(f"bad orientation mode {mode!r} / angle {max_angle_deg}")
    angles = rng.uniform(-max_angle_deg, max_angle_deg, size=n)
    return tuple(Orientation(float(a)) for a in angles)


@dataclass(frozen=True, eq=False)
class TrainingView:
    """The samples a device trains on: stored ones still kept plus synthetic ones.

    ``x`` and ``y`` are the device's stored arrays, shared and never written.
    """

    x: FloatArray
    y: IndexArray
    num_classes: int
    kept: IndexArray
    extra_x: FloatArray
    extra_y: IndexArray
    extra_source: IndexArray
    extra_orientation: tuple[Orientation, ...] = ()

    @classmethod
    def of(cls, x: FloatArray, y: IndexArray, num_classes: int) -> TrainingView:
        """Return the view of all stored samples, nothing synthetic."""
        if x.ndim < 3 or len(x) != len(y):
            raise ResamplingError(
                f"expected images (N, ..., H, W) and N labels, got {x.shape}, {y.shape}"
            )
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ResamplingError(f"labels must lie in [0, {num_classes})")
        empty = np.zeros(0, dtype=np.int64)
        no_images = np.zeros((0, *x.shape[1:]), dtype=x.dtype)
        kept = np.arange(len(y), dtype=np.int64)
        return cls(x, y, num_classes, kept, no_images, empty, empty)

    def counts(self) -> IndexArray:
        """Class counts of the training samples."""
        labels = np.concatenate([self.y[self.kept], self.extra_y])
        return np.bincount(labels, minlength=self.num_classes).astype(np.int64)

    def materialise(self) -> tuple[FloatArray, IndexArray]:
        """Return new training arrays (kept stored samples, then synthetic ones)."""
        x = np.concatenate([self.x[self.kept], self.extra_x]).astype(self.x.dtype)
        return x, np.concatenate([self.y[self.kept], self.extra_y]).astype(np.int64)


def oversample(
    view: TrainingView,
    label: int,
    amount: int,
    rng: np.random.Generator,
    *,
    mode: OrientationMode = "rotate",
    max_angle_deg: float = DEFAULT_MAX_ANGLE_DEG,
) -> TrainingView:
    """Add ``amount`` re-oriented copies of kept stored samples of ``label``.

    Raises:
        ResamplingError: the class has no kept stored sample or amount < 0.
    """
    sources = view.kept[view.y[view.kept] == label]
    if amount < 0 or (amount and not len(sources)):
        raise ResamplingError(f"cannot add {amount} samples to class {label}")
    if amount == 0:
        return view
    picked = np.resize(rng.permutation(sources), amount).astype(np.int64)
    orientations = _draw_orientations(amount, rng, mode, max_angle_deg)
    new_x = np.stack(
        [orient(view.x[s], o) for s, o in zip(picked, orientations, strict=True)]
    )
    return replace(
        view,
        extra_x=np.concatenate([view.extra_x, new_x.astype(view.x.dtype)]),
        extra_y=np.concatenate([view.extra_y, np.full(amount, label, np.int64)]),
        extra_source=np.concatenate([view.extra_source, picked]),
        extra_orientation=view.extra_orientation + orientations,
    )


class FeatureExtractor(Protocol):
    """The shared feature function: ``(n, ...)`` samples to ``(n, K)`` features."""

    def __call__(self, x: FloatArray) -> Float64Array:
        """Return the features of ``x``."""
        ...


@dataclass(frozen=True, eq=False)
class CentroidFeatures:
    """``softmax(-||x - c_k||^2 / temperature)`` over class means ``c_k``."""

    centroids: Float64Array
    temperature: float

    @classmethod
    def fit(
        cls,
        x_aux: FloatArray,
        y_aux: IndexArray,
        num_classes: int,
        temperature: float | None = None,
    ) -> CentroidFeatures:
        """Fit the class means on auxiliary data.

        The default temperature is the median squared distance of an auxiliary
        sample to its own class mean.

        Raises:
            ResamplingError: a class has no auxiliary sample.
        """
        flat = x_aux.reshape(len(x_aux), -1).astype(np.float64)
        if np.bincount(y_aux, minlength=num_classes).min() == 0:
            raise ResamplingError("every class needs auxiliary samples")
        centroids = np.stack(
            [flat[y_aux == k].mean(axis=0) for k in range(num_classes)]
        )
        if temperature is None:
            temperature = float(np.median(((flat - centroids[y_aux]) ** 2).sum(axis=1)))
        if not temperature > 0.0:
            raise ResamplingError(f"temperature must be > 0, got {temperature}")
        return cls(centroids, temperature)

    def __call__(self, x: FloatArray) -> Float64Array:
        """Return the class-membership probabilities of ``x``."""
        flat = x.reshape(len(x), -1).astype(np.float64)
        d2 = ((flat[:, None, :] - self.centroids[None, :, :]) ** 2).sum(axis=2)
        logits = -d2 / self.temperature
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        out: Float64Array = probs / probs.sum(axis=1, keepdims=True)
        return out


def unit_rows(features: Float64Array) -> Float64Array:
    """Return the rows scaled to unit L2 norm (zero rows stay zero)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    out: Float64Array = np.divide(
        features, norms, out=np.zeros_like(features, dtype=np.float64), where=norms > 0
    )
    return out


def local_redundancy(
    features: Float64Array, theta: float = DEFAULT_THETA
) -> IndexArray:
    """Rows of the local test (§3.2.1), in removal-priority order.

    Picks ``round(theta * n)`` rows of highest mean cosine similarity to the
    other rows, ordered by the variance of those similarities, largest first.
    """
    n = len(features)
    if n < 2:
        return np.zeros(0, dtype=np.int64)
    unit = unit_rows(features)
    sims = unit @ unit.T
    off = ~np.eye(n, dtype=bool)
    others = sims[off].reshape(n, n - 1)
    mean, var = others.mean(axis=1), others.var(axis=1)
    top = np.argsort(-mean, kind="stable")[: undersample_candidates(n, theta)]
    return top[np.argsort(-var[top], kind="stable")].astype(np.int64)


def is_globally_redundant(
    similarities: Float64Array, eta: float = DEFAULT_ETA, chi: float = DEFAULT_CHI
) -> bool:
    """True if at least ``chi`` of the similarities exceed ``eta`` (none: False)."""
    if len(similarities) == 0:
        return False
    return bool(np.mean(similarities > eta) >= chi)


def undersample(
    view: TrainingView,
    label: int,
    extractor: FeatureExtractor,
    *,
    theta: float = DEFAULT_THETA,
    global_test: GlobalTest | None = None,
) -> TrainingView:
    """Drop redundant kept samples of ``label``: local test, then the global one.

    Without ``global_test`` (the local under-sampling baseline) every buffered
    candidate is dropped.
    """
    positions = view.kept[view.y[view.kept] == label]
    if len(positions) == 0:
        return view
    features = extractor(view.x[positions])
    order = local_redundancy(features, theta)
    if global_test is None:
        drop = positions[order]
    else:
        flags = np.asarray(global_test(label, unit_rows(features[order])), dtype=bool)
        if flags.shape != order.shape:
            raise ResamplingError(f"global test gave {flags.shape}, not {order.shape}")
        drop = positions[order[flags]]
    return replace(view, kept=np.setdiff1d(view.kept, drop).astype(np.int64))


def encrypt_tiled(context: CkksPublicContext, unit: Float64Array, copies: int) -> bytes:
    """Dominant device: ``Enc(b || b || ...)``, ``copies`` blocks of `pad_length` slots.

    Raises:
        ResamplingError: ``copies`` is not a power of two or overflows a ciphertext.
    """
    block = pad_length(len(unit))
    if copies < 1 or copies & (copies - 1) or copies * block > context.slot_count:
        raise ResamplingError(f"{copies} copies of {block} slots do not fit")
    return context.encrypt(np.tile(np.pad(unit, (0, block - len(unit))), copies))


def masked_block_products(
    context: CkksPublicContext,
    ciphertext: bytes,
    vectors: Float64Array,
    copies: int,
    rng: np.random.Generator,
) -> list[bytes]:
    """Other device: masked ``Enc(b) * v_j`` for each unit row ``v_j``, packed.

    Block ``j`` of each result holds ``b * v_j + m_j`` with ``sum(m_j) = 0``
    (a fresh encryption), so the key owner learns ``<b, v_j>`` per block only.
    """
    block = pad_length(vectors.shape[1])
    padded = np.pad(vectors, ((0, 0), (0, block - vectors.shape[1])))
    out = []
    for start in range(0, len(padded), copies):
        chunk = padded[start : start + copies].reshape(-1)
        mask = np.concatenate([zero_sum_mask(block, rng) for _ in range(copies)])
        product = context.multiply_plain(ciphertext, chunk)
        out.append(context.add(product, context.encrypt(mask)))
    return out


class DataResampler:
    """The `ursa.edge_sdk.methods.flicker.algorithm.Resampler` of an image device.

    ``view`` is the current training view; `materialise` it to train.
    ``global_test`` (None: local test only) may be set after construction,
    e.g. once every device of a simulation exists.
    """

    def __init__(
        self,
        view: TrainingView,
        extractor: FeatureExtractor,
        rng: np.random.Generator,
        *,
        theta: float = DEFAULT_THETA,
        global_test: GlobalTest | None = None,
        mode: OrientationMode = "rotate",
        max_angle_deg: float = DEFAULT_MAX_ANGLE_DEG,
    ) -> None:
        self.view = view
        self.global_test = global_test
        self._extractor = extractor
        self._rng = rng
        self._theta = theta
        self._mode: OrientationMode = mode
        self._max_angle_deg = max_angle_deg

    def class_features(self, label: int) -> Float64Array:
        """Unit feature vectors of the training samples of ``label`` (kept + synthetic).

        What this device contributes to another device's global test; shape
        ``(0, 0)`` when it has no such sample.
        """
        x, y = self.view.materialise()
        picked = x[y == label]
        if not len(picked):
            return np.zeros((0, 0))
        return unit_rows(self._extractor(picked))

    def _check(self, counts: IndexArray) -> None:
        if not np.array_equal(counts, self.view.counts()):
            raise ResamplingError(f"counts {counts} do not match the view's data")

    def undersample(self, counts: IndexArray, label: int) -> int:
        """Remove redundant samples of ``label``; return how many."""
        self._check(counts)
        before = len(self.view.kept)
        self.view = undersample(
            self.view,
            label,
            self._extractor,
            theta=self._theta,
            global_test=self.global_test,
        )
        return before - len(self.view.kept)

    def oversample(self, counts: IndexArray, label: int, amount: int) -> int:
        """Add ``amount`` re-oriented samples of ``label`` (0 if none to copy)."""
        self._check(counts)
        if not np.any(self.view.y[self.view.kept] == label):
            return 0
        self.view = oversample(
            self.view,
            label,
            amount,
            self._rng,
            mode=self._mode,
            max_angle_deg=self._max_angle_deg,
        )
        return amount
