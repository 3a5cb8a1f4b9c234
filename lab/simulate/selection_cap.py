"""What Dubhe's participation cap costs, and what it leaves a cheater, in process.

Plays Dubhe's rounds one after the other on a population (the demo's by
default) with the coordinator's own pieces: the devices' eq. (6) coins
(`ursa.edge_sdk.registration`), the coordinator's trim and top-up
(`ursa.coordinator.selection.draw_tries`) without the devices the
`ParticipationCap` holds back, and the agent's argmin over the try sums
(plaintext: what a correct encrypted sum decrypts). Optionally one device
volunteers in every try (the cheater of issue 28). Reports the mean
``||p_o - p_u||_1`` of the adopted sets and every device's selection count,
so the same seeds with and without the cap give the cap's cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.methods.registry import ParticipationCap
from ursa.coordinator.selection import draw_tries
from ursa.edge_sdk.methods.dubhe.draws import participation_probabilities
from ursa.edge_sdk.methods.dubhe.tries import best_try
from ursa.edge_sdk.registration import registry_indices, thresholds_for
from ursa.protocol.codebook import Codebook
from ursa.tools.data.metrics import distance_to_uniform

__all__ = ["CapRun", "capped_rounds"]


@dataclass(frozen=True)
class CapRun:
    """One sequence of rounds: per-round distances and per-device counts."""

    distances: NDArray[np.float64]
    counts: NDArray[np.int64]

    @property
    def mean_distance(self) -> float:
        """Mean ``||p_o - p_u||_1`` over the rounds."""
        return float(self.distances.mean())


def capped_rounds(
    p: NDArray[np.float64],
    *,
    k: int,
    tries: int,
    rounds: int,
    seed: int,
    cap: ParticipationCap | None = None,
    sigma: tuple[float, ...] = (0.7, 0.1),
    cheater: int | None = None,
) -> CapRun:
    """Play ``rounds`` rounds of Dubhe on N x C distributions ``p``.

    ``cheater``: the index of a device that volunteers in every try.
    """
    n, classes = p.shape
    codebook = Codebook.default(classes)
    indices = registry_indices(p, codebook, thresholds_for(codebook, sigma))
    registry = np.bincount(indices, minlength=codebook.length).astype(np.int64)
    probability = participation_probabilities(registry, indices, k)
    ids = [f"{i:06d}" for i in range(n)]
    eligible = IndexedDevices(ids)
    coins = np.random.default_rng([seed, 0])
    trims = np.random.default_rng([seed, 1])
    counts = np.zeros(n, dtype=np.int64)
    distances = np.empty(rounds, dtype=np.float64)
    for r in range(1, rounds + 1):
        draws = coins.random((tries, n)) < probability
        if cheater is not None:
            draws[:, cheater] = True
        volunteers = {
            ids[i]: tuple(bool(x) for x in draws[:, i])
            for i in np.flatnonzero(draws.any(axis=0))
        }
        held = frozenset() if cap is None else cap.capped(r)
        if n - len(held) < k:
            held = frozenset()
        sets = draw_tries(volunteers, eligible, k, tries, trims, held)
        members = np.array([[int(d) for d in s] for s in sets])
        sums = p[members].sum(axis=1)
        chosen = members[best_try(sums, np.full(tries, k))]
        counts[chosen] += 1
        distances[r - 1] = float(distance_to_uniform(p[chosen].mean(axis=0)))
        if cap is not None:
            cap.record(r, [ids[i] for i in chosen])
    return CapRun(distances, counts)
