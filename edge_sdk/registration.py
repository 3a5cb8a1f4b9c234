"""The key epoch's registry on the device: its category, slot and one-hot vector.

Once per key epoch a device computes its category from its own label
distribution (Dubhe's Algorithm 1, `registry_indices`), encrypts the one-hot
registry of that slot (`registry_vector`), and reads the decrypted overall
registry, the count of devices per slot (`overall_registry`). Nothing here
sees another device's distribution. Dubhe's volunteer draws over the registry
are `ursa.edge_sdk.methods.dubhe.draws`; the agent's choice among tries is
`ursa.edge_sdk.methods.dubhe.tries`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import FixedPoint
from ursa.protocol.codebook import Category, Codebook

DISTRIBUTION_CODEC = FixedPoint(bound=1.0)
"""Label distributions in [0, 1], 24 fraction bits (the protocol-wide scale)."""

Thresholds = Mapping[int, float]
"""sigma_i per group size i in G (sigma_C = 0)."""


class RegistrationError(ValueError):
    """Bad input to registration or self-selection."""


def thresholds_for(codebook: Codebook, values: Sequence[float]) -> dict[int, float]:
    """Map sigma values, one per group except C (increasing i), to `Thresholds`."""
    sizes = codebook.groups[:-1]
    if len(values) != len(sizes):
        raise RegistrationError(
            f"need {len(sizes)} sigma values for groups {list(sizes)}, "
            f"got {len(values)}"
        )
    out = {i: float(v) for i, v in zip(sizes, values, strict=True)}
    out[codebook.num_classes] = 0.0
    return _checked(codebook, out)


def _checked(codebook: Codebook, thresholds: Thresholds) -> dict[int, float]:
    out = {int(i): float(v) for i, v in thresholds.items()}
    if set(out) != set(codebook.groups):
        raise RegistrationError(f"thresholds must cover groups {codebook.groups}")
    if out[codebook.num_classes] != 0.0:
        raise RegistrationError("sigma_C must be 0 so that every device has a category")
    if any(not 0.0 <= v <= 1.0 for v in out.values()):
        raise RegistrationError(f"sigma values must lie in [0, 1], got {out}")
    return out


def _as_distributions(
    distributions: NDArray[np.floating], num_classes: int
) -> NDArray[np.float64]:
    p = np.asarray(distributions, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != num_classes:
        raise RegistrationError(f"distributions must be N x {num_classes}")
    if not np.isfinite(p).all() or (p < 0).any():
        raise RegistrationError("distributions must be finite and non-negative")
    return p


def registry_indices(
    distributions: NDArray[np.floating], codebook: Codebook, thresholds: Thresholds
) -> NDArray[np.int64]:
    """Algorithm 1 for N devices at once: each device's registry slot.

    For i in G (increasing) take the device's top-i classes; the first i whose
    i-th largest proportion is >= sigma_i gives the category. Ties in the
    ranking go to the lower class index (argmax takes the first maximum).
    """
    sigma = _checked(codebook, thresholds)
    p = _as_distributions(distributions, codebook.num_classes)
    ranked = np.argsort(-p, axis=1, kind="stable")
    ordered = np.take_along_axis(p, ranked, axis=1)
    sizes = np.full(p.shape[0], codebook.num_classes, dtype=np.int64)
    undecided = np.ones(p.shape[0], dtype=bool)
    for i in codebook.groups[:-1]:
        hit = undecided & (ordered[:, i - 1] >= sigma[i])
        sizes[hit] = i
        undecided &= ~hit
    return codebook.indices_of(ranked, sizes)


def categorize(
    distribution: NDArray[np.floating], codebook: Codebook, thresholds: Thresholds
) -> Category:
    """Algorithm 1 for one device: its category (sorted dominating classes)."""
    index = registry_indices(np.asarray(distribution)[None, :], codebook, thresholds)
    return codebook.category_at(int(index[0]))


def registry_vector(index: int, codebook: Codebook) -> NDArray[np.int64]:
    """The one-hot registry R^(t,k) for slot ``index`` (what the device encrypts)."""
    if not 0 <= index < codebook.length:
        raise RegistrationError(f"slot {index} outside 0..{codebook.length - 1}")
    vector = np.zeros(codebook.length, dtype=np.int64)
    vector[index] = 1
    return vector


def is_one_hot(values: Sequence[int]) -> bool:
    """Whether a decrypted registration is an honest registry: one 1, all else 0."""
    return all(v in (0, 1) for v in values) and sum(values) == 1


def overall_registry(registry_sum: NDArray[np.integer]) -> NDArray[np.int64]:
    """The decrypted overall registry as counts per slot, refused when not one.

    Raises:
        RegistrationError: not a 1-D vector of non-negative integers.
    """
    r = np.asarray(registry_sum)
    if r.ndim != 1 or (r < 0).any() or not np.issubdtype(r.dtype, np.integer):
        raise RegistrationError(
            "the overall registry must be a 1-D non-negative int vector"
        )
    return r.astype(np.int64)
