"""Dubhe's volunteer draws and per-try sums for the fast selection engine.

The sigma search over them is `ursa.lab.simulate.sigma_search`.
Every random choice comes from its own stream, ``np.random.default_rng([seed,
stream])``, numbered below, so an encrypted `SumBackend` sees the same draws.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.selection import finalize_selections
from ursa.edge_sdk.methods.dubhe.draws import (
    assign_ranks,
    participation_probabilities,
    stratified_volunteers,
)
from ursa.edge_sdk.methods.dubhe.tries import try_distances
from ursa.lab.simulate.selection_sums import DISTRIBUTION_SCALE, SumBackend

DRAWS = ("paper", "stratified")
_CHUNK_ELEMENTS = 2_000_000

(
    STREAM_POPULATION,
    STREAM_SEARCH_COINS,
    STREAM_SEARCH_TRIMS,
    STREAM_SEARCH_SHARED,
    STREAM_COINS,
    STREAM_TRIMS,
    STREAM_SHARED,
    STREAM_RANDOM,
    STREAM_GREEDY,
    STREAM_RANKS,
) = range(10)
"""Stream numbers: each random choice of a run has its own generator."""


def rng_stream(seed: int, stream: int) -> np.random.Generator:
    """The generator of one random stream of a seeded run."""
    return np.random.default_rng([seed, stream])


def draw_sets(
    draw: str,
    registry: NDArray[np.int64],
    indices: NDArray[np.int64],
    k: int,
    rounds: int,
    tries: int,
    seed: int,
    *,
    search: bool,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Rounds x tries x K tentative sets for one draw, and the volunteer counts."""
    n = indices.size
    coin_stream, trim_stream, shared_stream = (
        (STREAM_SEARCH_COINS, STREAM_SEARCH_TRIMS, STREAM_SEARCH_SHARED)
        if search
        else (STREAM_COINS, STREAM_TRIMS, STREAM_SHARED)
    )
    trims = rng_stream(seed, trim_stream)
    if draw == "paper":
        prob = participation_probabilities(registry, indices, k)
        coins = rng_stream(seed, coin_stream)
        chunk = max(1, _CHUNK_ELEMENTS // (tries * n))
        parts = []
        for lo in range(0, rounds, chunk):
            m = min(chunk, rounds - lo)
            parts.append((coins.random((m, tries, n)) < prob).reshape(m * tries, n))
        vol = np.concatenate(parts)
    elif draw == "stratified":
        # ranks: the agent's pass over the registrations in a shuffled order
        shuffle = rng_stream(seed, STREAM_RANKS).permutation(n)
        ranks = np.empty(n, dtype=np.int64)
        ranks[shuffle] = assign_ranks(indices[shuffle])
        shared_seed = int(rng_stream(seed, shared_stream).integers(2**63))
        vol = np.empty((rounds * tries, n), dtype=bool)
        for r in range(rounds):
            for h in range(tries):
                vol[r * tries + h] = stratified_volunteers(
                    registry, indices, ranks, k, shared_seed, r, h
                )
    else:
        raise ValueError(f"unknown draw {draw!r}; choose from {DRAWS}")
    sets = finalize_selections(vol, k, trims).reshape(rounds, tries, k)
    return sets, vol.sum(axis=1).reshape(rounds, tries)


def decoded_try_sums(
    sets: NDArray[np.int64], fixed: NDArray[np.int64], backend: SumBackend
) -> NDArray[np.float64]:
    """Rounds x H x C decrypted per-try sums, as distributions summed (not yet / K)."""
    sums = backend.try_sums(fixed, sets)
    if sums.shape != (*sets.shape[:2], fixed.shape[1]):
        raise ValueError(f"the sum backend returned shape {sums.shape}")
    out: NDArray[np.float64] = sums / DISTRIBUTION_SCALE
    return out


def agent_pick(
    sets: NDArray[np.int64], sums: NDArray[np.float64], h: int
) -> NDArray[np.int64]:
    """The adopted set per round among the first h tries (the agent's argmin)."""
    rounds, _, k = sets.shape
    dist = try_distances(sums[:, :h], np.full((rounds, h), k))
    return np.asarray(sets[np.arange(rounds), np.argmin(dist, axis=1)], dtype=np.int64)
