"""Dubhe's tentative sets (Dubhe Fig. 3, 5): pure steps from draws to K devices.

The functions turn what the coordinator saw (device ids, each responder's H
draws, who delivered a distribution) into the H tentative sets and, when the
agent cannot answer, a selection. They take device ids and the coordinator's
generator and touch no network, clock or database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ursa.coordinator.selection import finalize_selections

__all__ = ["complete_tries", "fallback_selection", "make_tries"]


def make_tries(
    volunteers: Mapping[str, Sequence[bool]],
    k: int,
    tries: int,
    rng: np.random.Generator,
) -> tuple[tuple[str, ...], ...]:
    """The H tentative sets of exactly K from the responders' per-try draws.

    Per try: trim surplus volunteers uniformly, or top up uniformly from the
    responders who did not volunteer in that try (`finalize_selections`).
    Responders are sorted by id first, so a seeded generator is reproducible.

    Raises:
        SelectionError: fewer than K responders.
    """
    devices = sorted(volunteers)
    draws = np.array([list(volunteers[d])[:tries] for d in devices], dtype=bool)
    chosen = finalize_selections(draws.T.reshape(tries, len(devices)), k, rng)
    return tuple(tuple(devices[i] for i in row) for row in chosen)


def complete_tries(
    tries: Sequence[Sequence[str]], delivered: set[str] | frozenset[str]
) -> tuple[int, ...]:
    """Indices of the tries all of whose members delivered their distribution."""
    return tuple(h for h, members in enumerate(tries) if set(members) <= delivered)


def fallback_selection(
    tries: Sequence[Sequence[str]],
    preferred: Sequence[int],
    alive: Sequence[str],
    k: int,
    rng: np.random.Generator,
) -> tuple[int | None, tuple[str, ...]]:
    """A selection when the agent cannot answer: the first usable try, or a repair.

    Returns ``(h, members)`` of the first try in `preferred` (complete tries),
    else ``(None, set)``: try 0's members that are in `alive`, topped up
    uniformly from the rest of `alive` to K (fewer only if `alive` is short).
    """
    if preferred:
        return preferred[0], tuple(tries[preferred[0]])
    alive_set = set(alive)
    kept = [d for d in tries[0] if d in alive_set] if tries else []
    rest = sorted(alive_set - set(kept))
    need = max(0, min(k - len(kept), len(rest)))
    extra = [rest[i] for i in rng.permutation(len(rest))[:need]] if need else []
    return None, tuple(sorted(kept + extra))
