"""Who trains each round in `ursa simulate train`: random or Dubhe selection.

``random``: K devices uniformly without replacement (all N when K = N).

``dubhe`` (the Dubhe paper's draw): every device registers its category
(Algorithm 1, `ursa.edge_sdk.registration`) with sigma from the paper's
parameter search (`ursa.lab.simulate.sigma_search.search_sigma`, the one
`ursa simulate selection` runs: the sigma grid, H tries per point scored by
the agent's ``||E_h(p_o,h) - p_u||_1``, common random numbers for every point).
Each round, H tentative sets: each device volunteers with probability eq. (6),
the coordinator trims or tops up to exactly K (`finalize_selections`), and the
agent adopts the try whose members' mean distribution is closest to uniform
(`best_try`). The registry and the per-try sums are encrypted in the real
system; here they are plaintext sums, which is what a correct decryption gives
(the per-try sums up to the fixed-point scale; `ursa simulate selection` runs
the same draw at scale).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.selection import finalize_selections
from ursa.edge_sdk.methods.dubhe.draws import participation_probabilities
from ursa.edge_sdk.methods.dubhe.tries import best_try
from ursa.edge_sdk.registration import registry_indices, thresholds_for
from ursa.lab.simulate.sigma_search import search_sigma
from ursa.protocol.codebook import Codebook, default_groups

SELECTIONS = ("random", "dubhe")

Selector = Callable[[int], npt.NDArray[np.int64]]
"""round index -> sorted indices of the round's participants."""


def make_selector(
    kind: str,
    distributions: npt.NDArray[np.float64],
    k: int,
    rng: np.random.Generator,
    *,
    tries: int = 20,
) -> tuple[Selector, dict[str, Any]]:
    """Build the round selector and a JSON-ready description of it.

    Args:
        kind: ``"random"`` or ``"dubhe"``.
        distributions: N x C device label distributions (Dubhe's private input).
        k: participants per round.
        rng: the selection's random stream (coins, trims, random draws).
        tries: Dubhe's H.

    Raises:
        ValueError: an unknown kind, or not ``1 <= k <= N``.
    """
    p = np.asarray(distributions, dtype=np.float64)
    n = p.shape[0]
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= K <= N, got K={k}, N={n}")
    if kind == "random":
        if k == n:
            return (lambda _r: np.arange(n)), {"kind": "all"}
        return (lambda _r: np.sort(rng.choice(n, size=k, replace=False))), {
            "kind": "random"
        }
    if kind != "dubhe":
        raise ValueError(f"unknown selection {kind!r}; choose from {SELECTIONS}")
    codebook = Codebook(p.shape[1], default_groups(p.shape[1]))
    sigma, _ = search_sigma(p, codebook, k, seed=int(rng.integers(2**63)))
    indices = registry_indices(p, codebook, thresholds_for(codebook, sigma))
    registry = np.bincount(indices, minlength=codebook.length).astype(np.int64)
    prob = participation_probabilities(registry, indices, k)

    def select(_round: int) -> npt.NDArray[np.int64]:
        sets = finalize_selections(rng.random((tries, n)) < prob, k, rng)
        chosen = sets[best_try(p[sets].sum(axis=1), np.full(tries, k))]
        return np.asarray(chosen, dtype=np.int64)

    info = {
        "kind": "dubhe",
        "sigma": [*sigma, 0.0],
        "tries": tries,
        "registry_nonzero": int(np.count_nonzero(registry)),
    }
    return select, info
