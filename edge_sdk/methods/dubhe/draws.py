"""Dubhe's volunteer draws on the device: the paper's coin and ursa's stratified draw.

Both read the decrypted overall registry (`ursa.edge_sdk.registration`). Each
function has a scalar form (what one device calls) and, where the simulator
needs it, a vectorised form over all devices that returns exactly what the
scalar form would.

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

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.registration import RegistrationError, overall_registry

QUOTA_SCALE = 1 << 20
"""Fixed-point scale of the stratified quotas: exact integer systematic rounding."""


def participation_probabilities(
    registry_sum: NDArray[np.integer], indices: NDArray[np.integer], k: int
) -> NDArray[np.float64]:
    """Eq. (6) for many devices: ``min(1, K / (R_A(u) * ||R_A||_0))``."""
    r = overall_registry(registry_sum)
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
    r = overall_registry(registry_sum)
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
    r = overall_registry(registry_sum)
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
    r = overall_registry(registry_sum)
    if not 0 <= rank < r[index]:
        raise RegistrationError(f"rank {rank} outside its slot's count {r[index]}")
    rng = _draw_generator(shared_seed, round_index, try_index)
    quotas = _quotas(r, k, rng)
    keys = rng.random(int(r.sum()))
    start = int(r[:index].sum())
    block = keys[start : start + int(r[index])]
    return bool(np.count_nonzero(block < block[rank]) < quotas[index])
