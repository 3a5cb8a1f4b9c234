"""Selection baselines that need plaintext distributions (simulation only).

* random: K devices uniformly without replacement.
* greedy (Astraea-style, Dubhe §6.1): start from a random device, then add the
  device that minimises ``KL(p_selected || uniform)`` until K are chosen.
  ``KL(p || u) = log C - H(p)``, so each step maximises the entropy of the
  running mean; ties go to the lowest device index.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

GREEDY_CHUNK_ELEMENTS = 4_000_000
"""Rounds are processed in chunks of at most this many rounds x N x C floats."""


class BaselineError(ValueError):
    """A baseline request that cannot be met."""


def random_selection(
    num_clients: int, k: int, rounds: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """``rounds`` x K uniform random selections without replacement (rows sorted)."""
    if not 1 <= k <= num_clients or rounds < 0:
        raise BaselineError(
            f"need 1 <= K <= N and rounds >= 0 (K={k}, N={num_clients})"
        )
    keys = rng.random((rounds, num_clients))
    chosen = (
        np.argpartition(keys, k - 1, axis=1)[:, :k]
        if k < num_clients
        else (np.tile(np.arange(num_clients), (rounds, 1)))
    )
    return np.sort(chosen, axis=1).astype(np.int64)


def _neg_entropy_terms(p: NDArray[np.float64]) -> NDArray[np.float64]:
    """Elementwise ``p log p`` with ``0 log 0 = 0``."""
    safe = np.where(p > 0, p, 1.0)
    out: NDArray[np.float64] = p * np.log(safe)
    return out


def greedy_selection(
    distributions: NDArray[np.floating], k: int, rounds: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """``rounds`` x K greedy selections, one random start device per round."""
    p = np.asarray(distributions, dtype=np.float64)
    if p.ndim != 2:
        raise BaselineError("distributions must be N x C")
    n, c = p.shape
    if not 1 <= k <= n or rounds < 0:
        raise BaselineError(f"need 1 <= K <= N and rounds >= 0 (K={k}, N={n})")
    starts = rng.integers(n, size=rounds)
    out = np.empty((rounds, k), dtype=np.int64)
    chunk = max(1, GREEDY_CHUNK_ELEMENTS // (n * c))
    for lo in range(0, rounds, chunk):
        out[lo : lo + chunk] = _greedy_chunk(p, k, starts[lo : lo + chunk])
    return out


def _greedy_chunk(
    p: NDArray[np.float64], k: int, starts: NDArray[np.int64]
) -> NDArray[np.int64]:
    r = starts.size
    n = p.shape[0]
    rows = np.arange(r)
    chosen = np.empty((r, k), dtype=np.int64)
    taken = np.zeros((r, n), dtype=bool)
    chosen[:, 0] = starts
    taken[rows, starts] = True
    running = p[starts].copy()
    for step in range(1, k):
        candidate = (running[:, None, :] + p[None, :, :]) / (step + 1)
        score = _neg_entropy_terms(candidate).sum(axis=2)  # = -H, minimise
        score[taken] = np.inf
        pick = np.argmin(score, axis=1)
        chosen[:, step] = pick
        taken[rows, pick] = True
        running += p[pick]
    return np.sort(chosen, axis=1)
