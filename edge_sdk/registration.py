"""Dubhe on the device: registration, participation probability, the volunteer draw.

Everything here runs on a device (the agent is a device too) and only ever sees
the device's own label distribution, the decrypted overall registry and the
decrypted per-try sums. Each function has a scalar form (what one device calls)
and, where the simulator needs it, a vectorised form over all devices that
returns exactly what the scalar form would.

Two volunteer draws:

* ``paper`` (Dubhe §5.2): an independent coin with probability eq. (6).
* ``stratified`` (ursa's option): devices of a category share randomness: a
  ``shared_seed`` that every device derives from the epoch's secret key (so the
  coordinator cannot) plus round and try. Each round the non-empty categories
  get integer quotas summing to exactly K (the paper's equal per-category
  shares, water-filled where a category is too small, then systematically
  rounded), and in each category exactly its quota of devices volunteer: those
  whose private rank falls among the quota smallest shared keys. When no
  category is smaller than its share, every device volunteers with exactly the
  paper's eq. (6) probability; what disappears is the binomial spread of each
  category's count (and with it most trims and biased top-ups).

Ranks are handed out once per key epoch (`assign_ranks`): each device sends,
with its encrypted registry, a one-time X25519 public key; the coordinator
relays the pairs to the agent in a uniformly random order; the agent decrypts
the registries, computes each entry's rank within its slot and seals it to the
one-time key; the coordinator relays the sealed ranks back. The coordinator
learns nothing it did not have (ciphertexts, sealed boxes); the agent sees an
anonymous, shuffled list of categories, which is the overall registry every
device decrypts anyway; a device learns its rank, a uniform number in
``0..R_A(u)-1``. Under this draw the per-round selection must be sent to each
device alone, never broadcast: any device knows the shared seed and could
otherwise link device ids to categories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import DEFAULT_SCALE_BITS
from ursa.protocol.codebook import Category, Codebook

Thresholds = Mapping[int, float]
"""sigma_i per group size i in G (sigma_C = 0)."""

QUOTA_SCALE = 1 << 20
"""Fixed-point scale of the stratified quotas: exact integer systematic rounding."""


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


def _registry(registry_sum: NDArray[np.integer]) -> NDArray[np.int64]:
    r = np.asarray(registry_sum)
    if r.ndim != 1 or (r < 0).any() or not np.issubdtype(r.dtype, np.integer):
        raise RegistrationError(
            "the overall registry must be a 1-D non-negative int vector"
        )
    return r.astype(np.int64)


def participation_probabilities(
    registry_sum: NDArray[np.integer], indices: NDArray[np.integer], k: int
) -> NDArray[np.float64]:
    """Eq. (6) for many devices: ``min(1, K / (R_A(u) * ||R_A||_0))``."""
    r = _registry(registry_sum)
    idx = np.asarray(indices, dtype=np.int64)
    if k < 1:
        raise RegistrationError(f"K must be >= 1, got {k}")
    if idx.size and (idx.min() < 0 or idx.max() >= r.size):
        raise RegistrationError("registry slot out of range")
    own = r[idx]
    if (own == 0).any():
        raise RegistrationError("a device's own slot is 0 in the overall registry")
    return np.minimum(1.0, k / (own * np.count_nonzero(r)))


def participation_probability(
    registry_sum: NDArray[np.integer], index: int, k: int
) -> float:
    """Eq. (6) for one device, from the decrypted overall registry."""
    return float(participation_probabilities(registry_sum, np.array([index]), k)[0])


def volunteer(probability: float, rng: np.random.Generator) -> bool:
    """The paper's coin: volunteer with ``probability`` (device-private randomness)."""
    return bool(rng.random() < probability)


# --- the agent: multi-time selection and parameter search (Dubhe §5.3) ---


def try_distances(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> NDArray[np.float64]:
    """``||p_o,h - p_u||_1`` per try; ``p_o,h = sum_h / count_h`` (plain mean).

    Args:
        try_sums: ... x H x C decrypted sums of the members' distributions.
        counts: ... x H member counts.
        target: p_u, uniform when None (or the test-set distribution).
    """
    sums = np.asarray(try_sums, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if (n <= 0).any():
        raise RegistrationError("every try needs at least one member")
    p_o = sums / n[..., None]
    p_u = _target(target, sums.shape[-1])
    return np.asarray(np.abs(p_o - p_u).sum(axis=-1), dtype=np.float64)


def best_try(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> int:
    """The agent's answer ``h* = argmin_h ||p_o,h - p_u||_1`` (first on ties)."""
    return int(np.argmin(try_distances(try_sums, counts, target)))


def plausible_try_sum(
    totals: NDArray[np.floating], count: int, scale_bits: int = DEFAULT_SCALE_BITS
) -> bool:
    """Whether ``count`` honest label distributions can sum to ``totals``.

    Each honest distribution is in [0, 1] per class and sums to 1, up to the
    fixed point's rounding (at most ``2**-(scale_bits + 1)`` a value): so each
    total lies in [0, count] and all add up to ``count``, within that slack. A
    party that encrypts other values directly and keeps the sum within these
    bounds is not caught (packed Paillier has no per-party range proof).
    """
    t = np.asarray(totals, dtype=np.float64)
    if count < 1 or t.ndim != 1 or not np.isfinite(t).all():
        return False
    slack = count * t.size * 2.0**-scale_bits
    inside = bool(((t >= -slack) & (t <= count + slack)).all())
    return inside and abs(float(t.sum()) - count) <= slack


def search_score(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> float:
    """Parameter-search score of one sigma set: ``||E_h(p_o,h) - p_u||_1``."""
    sums = np.asarray(try_sums, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    mean = (sums / n[:, None]).mean(axis=0)
    return float(np.abs(mean - _target(target, sums.shape[-1])).sum())


def _target(
    target: NDArray[np.floating] | None, num_classes: int
) -> NDArray[np.float64]:
    if target is None:
        return np.full(num_classes, 1.0 / num_classes)
    t = np.asarray(target, dtype=np.float64)
    if t.shape != (num_classes,) or (t < 0).any() or not np.isclose(t.sum(), 1.0):
        raise RegistrationError("target must be a distribution over the C classes")
    return t


# --- ursa's stratified draw ---


def assign_ranks(indices: NDArray[np.integer]) -> NDArray[np.int64]:
    """Rank of each registration within its slot, in the given (shuffled) order.

    The agent runs this once per key epoch on the anonymous registries the
    coordinator relays in a uniformly random order; entry j is the number of
    earlier entries with the same slot.
    """
    idx = np.asarray(indices, dtype=np.int64)
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_idx)) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, idx.size]))
    ranks = np.empty(idx.size, dtype=np.int64)
    ranks[order] = np.arange(idx.size) - run_start
    return ranks


def _draw_generator(
    shared_seed: int, round_index: int, try_index: int
) -> np.random.Generator:
    if min(shared_seed, round_index, try_index) < 0:
        raise RegistrationError("shared seed, round and try must be non-negative")
    return np.random.default_rng([shared_seed, round_index, try_index])


def _quotas(
    r: NDArray[np.int64], k: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Per-slot quotas: equal shares water-filled to capacity, summing to min(K, N).

    Shares are exact fixed-point integers (scale `QUOTA_SCALE`); a shared random
    order and offset round them systematically, so each slot's quota is the
    floor or ceiling of its share, its mean is the share, and the sum is exact.
    """
    nonzero = np.flatnonzero(r)
    if nonzero.size == 0:
        raise RegistrationError("the overall registry is empty")
    sizes = r[nonzero]
    total = min(k, int(sizes.sum()))
    # water level: the first j (sizes ascending) whose level fits under sizes[j]
    by_size = np.argsort(sizes, kind="stable")
    ordered = sizes[by_size]
    below = np.r_[0, np.cumsum(ordered)[:-1]]
    remaining = ordered.size - np.arange(ordered.size)
    j = int(np.flatnonzero((total - below) <= ordered * remaining)[0])
    level_units, extra = divmod(
        (total - int(below[j])) * QUOTA_SCALE, int(remaining[j])
    )
    share_sorted = ordered * QUOTA_SCALE
    share_sorted[j:] = level_units
    share_sorted[j : j + extra] += 1
    share = np.empty_like(share_sorted)
    share[by_size] = share_sorted
    order = rng.permutation(nonzero.size)
    offset = int(rng.integers(QUOTA_SCALE))
    upper = np.cumsum(share[order]) + offset
    lower = upper - share[order]
    quotas = np.zeros(r.size, dtype=np.int64)
    quotas[nonzero[order]] = upper // QUOTA_SCALE - lower // QUOTA_SCALE
    return quotas


def stratified_quotas(
    registry_sum: NDArray[np.integer],
    k: int,
    shared_seed: int,
    round_index: int,
    try_index: int,
) -> NDArray[np.int64]:
    """Devices of each slot that volunteer in this (round, try); sum min(K, N)."""
    r = _registry(registry_sum)
    if k < 1:
        raise RegistrationError(f"K must be >= 1, got {k}")
    return _quotas(r, k, _draw_generator(shared_seed, round_index, try_index))


def stratified_volunteers(
    registry_sum: NDArray[np.integer],
    indices: NDArray[np.integer],
    ranks: NDArray[np.integer],
    k: int,
    shared_seed: int,
    round_index: int,
    try_index: int,
) -> NDArray[np.bool_]:
    """The stratified draw for many devices (same answers as `stratified_volunteer`)."""
    r = _registry(registry_sum)
    idx = np.asarray(indices, dtype=np.int64)
    rank = np.asarray(ranks, dtype=np.int64)
    if k < 1:
        raise RegistrationError(f"K must be >= 1, got {k}")
    if ((rank < 0) | (rank >= r[idx])).any():
        raise RegistrationError("a rank lies outside its slot's count")
    rng = _draw_generator(shared_seed, round_index, try_index)
    quotas = _quotas(r, k, rng)
    keys = rng.random(int(r.sum()))
    starts = np.r_[0, np.cumsum(r)[:-1]]
    block = np.repeat(np.arange(r.size), r)
    order = np.lexsort((keys, block))
    within = np.empty(keys.size, dtype=np.int64)
    within[order] = np.arange(keys.size) - starts[block[order]]
    return np.asarray(within[starts[idx] + rank] < quotas[idx], dtype=np.bool_)


def stratified_volunteer(
    registry_sum: NDArray[np.integer],
    index: int,
    rank: int,
    k: int,
    shared_seed: int,
    round_index: int,
    try_index: int,
) -> bool:
    """One device's stratified draw (what `stratified_volunteers` gives for it).

    The device derives the round's quotas and keys from the shared seed and
    volunteers when its rank's key is among its slot's quota smallest.
    """
    r = _registry(registry_sum)
    if not 0 <= rank < r[index]:
        raise RegistrationError(f"rank {rank} outside its slot's count {r[index]}")
    rng = _draw_generator(shared_seed, round_index, try_index)
    quotas = _quotas(r, k, rng)
    keys = rng.random(int(r.sum()))
    start = int(r[:index].sum())
    block = keys[start : start + int(r[index])]
    return bool(np.count_nonzero(block < block[rank]) < quotas[index])
