"""Dubhe's tentative sets (Dubhe Fig. 3, 5): pure steps from draws to K devices.

The functions turn what the coordinator saw (device ids, each volunteer's H
draws, the eligible devices, who delivered a distribution) into the H
tentative sets and, when the
agent cannot answer, a selection. They take device ids and the coordinator's
generator and touch no network, clock or database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

import numpy as np

from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.selection import draw_tries

__all__ = [
    "common_suspects",
    "complete_tries",
    "fallback_selection",
    "make_tries",
    "short_tries",
    "without",
]


def make_tries(
    volunteers: Mapping[str, Sequence[bool]],
    eligible: Iterable[str],
    k: int,
    tries: int,
    rng: np.random.Generator,
    excluded: Set[str] = frozenset(),
) -> tuple[tuple[str, ...], ...]:
    """The H tentative sets of exactly K from the volunteers' per-try draws.

    A device that drew no in every try stays silent, so the top-up cannot
    come from the responders alone. Per try: trim surplus volunteers
    uniformly, or top up uniformly from the ``eligible`` devices (online and
    registered) that did not volunteer in that try (`finalize_selections`).
    A volunteer that went offline since is kept in its own tries only.
    The runtime's eligible devices are an `IndexedDevices` kept per event,
    so the top-up draws by position: O(H·K + volunteers) per round whatever
    the fleet's size (`draw_tries`). Any other collection is sorted by id
    first (O(N log N)), so a seeded generator is reproducible. ``excluded``
    devices (over the participation cap) are in no try.

    Raises:
        SelectionError: fewer than K devices to choose from in some try.
    """
    indexed = (
        eligible
        if isinstance(eligible, IndexedDevices)
        else IndexedDevices(sorted(set(eligible)))
    )
    return draw_tries(volunteers, indexed, k, tries, rng, excluded)


def short_tries(
    volunteers: Mapping[str, Sequence[bool]], eligible: Iterable[str], k: int
) -> bool:
    """Whether some try has fewer than K devices to choose from (then wait)."""
    online = eligible if isinstance(eligible, Set) else set(eligible)
    if len(online) >= k:
        return False
    extra = [d for d in volunteers if d not in online]
    tries = min((len(v) for v in volunteers.values()), default=0)
    return tries == 0 or any(
        len(online) + sum(1 for d in extra if volunteers[d][h]) < k
        for h in range(tries)
    )


def complete_tries(
    tries: Sequence[Sequence[str]], delivered: set[str] | frozenset[str]
) -> tuple[int, ...]:
    """Indices of the non-empty tries all of whose members delivered."""
    return tuple(
        h for h, members in enumerate(tries) if members and set(members) <= delivered
    )


def without(
    tries: Sequence[Sequence[str]], dropped: Set[str]
) -> tuple[tuple[str, ...], ...]:
    """The tries with the `dropped` members taken out (order kept, maybe empty)."""
    return tuple(tuple(d for d in members if d not in dropped) for members in tries)


def common_suspects(
    tries: Sequence[Sequence[str]], bad: Iterable[int]
) -> tuple[str, ...]:
    """Members in every bad try: the only devices one cheater can be (sorted).

    The coordinator sees which sums the agent found bad, never a distribution:
    a single malformed contribution spoils every try it is summed into, so its
    sender is in all of them. Empty when no member is (two cheaters, or none).
    """
    sets = [set(tries[h]) for h in bad]
    if not sets:
        return ()
    return tuple(sorted(set.intersection(*sets)))


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
