"""Dubhe's parameter search (§5.3.2): the sigma grid point the agent scores best.

Lab-only: the search scores every grid point on the whole population's label
distributions, which only a simulation holds in plaintext (a federation is
given ``[registry] sigma``). Both simulators use this one search: `ursa
simulate selection` (`ursa.lab.simulate.selection`, through any `SumBackend`)
and `ursa simulate train --selection dubhe` (`ursa.lab.simulate.participants`).
Every grid point sees the same random streams (common random numbers), so the
search compares the points, not their luck.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.selection import sigma_grid
from ursa.edge_sdk.methods.dubhe.tries import search_score, try_distances
from ursa.edge_sdk.registration import registry_indices, thresholds_for
from ursa.lab.simulate.selection_draws import decoded_try_sums, draw_sets
from ursa.lab.simulate.selection_sums import DISTRIBUTION_SCALE, PLAINTEXT, SumBackend
from ursa.protocol.codebook import Codebook

__all__ = ["DEFAULT_SEARCH_TRIES", "SEARCH_SCORES", "fixed_point", "search_sigma"]

SEARCH_SCORES = ("paper", "distance")
DEFAULT_SEARCH_TRIES = 100
"""H per grid point (the paper's search)."""


def fixed_point(p: NDArray[np.float64]) -> NDArray[np.int64]:
    """Distributions in the per-try sums' fixed point (`DISTRIBUTION_SCALE`)."""
    return np.rint(np.asarray(p, dtype=np.float64) * DISTRIBUTION_SCALE).astype(
        np.int64
    )


def search_sigma(
    p: NDArray[np.float64],
    codebook: Codebook,
    k: int,
    *,
    draw: str = "paper",
    tries: int = DEFAULT_SEARCH_TRIES,
    steps: int = 10,
    score: str = "paper",
    seed: int = 0,
    backend: SumBackend = PLAINTEXT,
) -> tuple[tuple[float, ...], float]:
    """Walk the sigma grid, H tries each, keep the agent's best point.

    ``score="paper"`` is the paper's ``||E_h(p_o,h) - p_u||_1``; ``"distance"``
    is ``E_h ||p_o,h - p_u||_1``, computed by the agent from the same H sums,
    which also counts each point's round-to-round spread.

    Args:
        p: N x C device label distributions.
        codebook: The registry's codebook (its groups make the grid).
        k: Participants per round.
        draw: The volunteer draw, ``"paper"`` or ``"stratified"``.
        tries: H per grid point.
        steps: Grid steps per sigma.
        score: ``"paper"`` or ``"distance"``.
        seed: The run's seed (the search's streams derive from it).
        backend: Where the registry and per-try sums are computed.

    Returns:
        The adopted sigma values (groups except C) and their score.

    Raises:
        ValueError: an unknown score or draw.
    """
    if score not in SEARCH_SCORES:
        raise ValueError(f"unknown search score {score!r}; choose from {SEARCH_SCORES}")
    fixed = fixed_point(p)
    best: tuple[tuple[float, ...], float] | None = None
    for point in sigma_grid(codebook, steps):
        indices = registry_indices(p, codebook, thresholds_for(codebook, point))
        registry = backend.registry_sum(indices, codebook.length)
        sets, _ = draw_sets(draw, registry, indices, k, 1, tries, seed, search=True)
        sums = decoded_try_sums(sets, fixed, backend)[0]
        counts = np.full(tries, k)
        value = (
            search_score(sums, counts)
            if score == "paper"
            else float(try_distances(sums, counts).mean())
        )
        if best is None or value < best[1]:
            best = (point, value)
    assert best is not None  # the grid is never empty
    return best
