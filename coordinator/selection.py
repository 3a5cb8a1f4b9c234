"""Dubhe on the coordinator: exactly K participants, multi-time tries, sigma grid.

The coordinator never sees a category or a distribution. It sees who
volunteered and makes the round's set exactly K (Dubhe §5.2): a surplus is
trimmed uniformly at random among the volunteers, a shortfall is topped up
uniformly at random from the online non-volunteers (the paper's rule; ursa
follows it for both volunteer draws). For H tries it does this once per try,
keeps the H tentative sets, and adopts the one whose index the agent returns.
For parameter search it walks a grid of sigma values.

Every function takes the coordinator's own random generator, so a seeded run
reproduces the same sets whatever computes the sums (plaintext or encrypted).
`draw_tries` does the per-try trim and top-up on a live coordinator: it draws
the top-up by position from an indexed set of the eligible devices, so a
round costs O(H·K + volunteers) whatever the fleet's size.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence, Set
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ursa.protocol.codebook import Codebook


class SelectionError(ValueError):
    """A selection request that cannot be met (too few online devices, bad shapes)."""


class Drawable(Protocol):
    """Devices one can test and draw by position (`IndexedDevices`)."""

    def __len__(self) -> int: ...

    def __contains__(self, device: object, /) -> bool: ...

    def at(self, position: int) -> str:
        """The member at ``position`` (0 <= position < len)."""
        ...


REJECTION_BATCH = 64
"""Random positions drawn at a time by `draw_tries`'s rejection sampling."""
DENSE_FACTOR = 4
"""`draw_tries` draws as `finalize_selections` below ``DENSE_FACTOR``·H·K eligible."""


def draw_tries(
    volunteers: Mapping[str, Sequence[bool]],
    eligible: Drawable,
    k: int,
    tries: int,
    rng: np.random.Generator,
    excluded: Set[str] = frozenset(),
) -> tuple[tuple[str, ...], ...]:
    """Per try, exactly K devices: trim the volunteers or top them up (uniformly).

    A device in try h's pool drew yes in try h (kept even if it went offline
    since: it is in its own tries only). Per try: K of the pool uniformly if
    it has at least K, else the whole pool plus a uniform subset of the
    ``eligible`` devices outside it.

    A fleet of fewer than `DENSE_FACTOR`·H·K eligible devices is drawn as
    `finalize_selections` draws it, over every device sorted by id (O(H·K)
    there, and the same sets as before for a seeded generator). A larger one
    is drawn sparsely: the pool from the volunteers (sorted by id), the
    top-up from random positions of ``eligible``, rejecting the pool and
    repeats (each draw is accepted with probability above 1/2), so the cost
    is O(H·K + volunteers) whatever the fleet's size. Either way a seeded
    generator reproduces the sets for the same ``eligible`` order.
    ``excluded`` devices (Dubhe's participation cap) are in no try, as
    volunteers or as top-ups; the eligible others must number at least K.

    Returns:
        H tuples of K device ids, each sorted.

    Raises:
        SelectionError: fewer than K devices to choose from in some try.
    """
    if k < 1:
        raise SelectionError(f"K={k} must be at least 1")
    size = len(eligible)
    if excluded:
        volunteers = {d: v for d, v in volunteers.items() if d not in excluded}
    if size < DENSE_FACTOR * k * tries:
        return _dense_tries(volunteers, eligible, k, tries, rng, excluded)
    ordered = sorted(volunteers)
    sets: list[tuple[str, ...]] = []
    for h in range(tries):
        pool = [d for d in ordered if h < len(volunteers[d]) and volunteers[d][h]]
        if len(pool) >= k:
            picked = rng.choice(len(pool), size=k, replace=False)
            sets.append(tuple(sorted(pool[int(i)] for i in picked)))
            continue
        taken, chosen = set(pool) | set(excluded), list(pool)
        while len(chosen) < k:
            for position in rng.integers(0, size, size=REJECTION_BATCH):
                device = eligible.at(int(position))
                if device not in taken:
                    taken.add(device)
                    chosen.append(device)
                    if len(chosen) == k:
                        break
        sets.append(tuple(sorted(chosen)))
    return tuple(sets)


def _dense_tries(
    volunteers: Mapping[str, Sequence[bool]],
    eligible: Drawable,
    k: int,
    tries: int,
    rng: np.random.Generator,
    excluded: Set[str] = frozenset(),
) -> tuple[tuple[str, ...], ...]:
    """`draw_tries` of a small fleet: every device sorted, `finalize_selections`."""
    online = {eligible.at(i) for i in range(len(eligible))} - excluded
    devices = sorted(online.union(volunteers))
    draws = np.zeros((tries, len(devices)), dtype=bool)
    up = np.zeros(len(devices), dtype=bool)
    for i, device in enumerate(devices):
        up[i] = device in online
        said = volunteers.get(device)
        if said is not None:
            draws[:, i] = list(said)[:tries]
    chosen = finalize_selections(draws, k, rng, draws | up)
    return tuple(tuple(devices[i] for i in row) for row in chosen)


def finalize_selections(
    volunteers: NDArray[np.bool_],
    k: int,
    rng: np.random.Generator,
    online: NDArray[np.bool_] | None = None,
) -> NDArray[np.int64]:
    """Trim or top up each row of volunteers to exactly K devices.

    Every device gets a uniform random key, shifted by 1 for non-volunteers:
    the K smallest keys are a uniform K-subset of the volunteers when there are
    at least K of them, else every volunteer plus a uniform subset of the online
    non-volunteers. Offline devices are never chosen.

    Args:
        volunteers: T x N (or N) booleans, one row per tentative set.
        k: set size K.
        rng: the coordinator's generator.
        online: N booleans, or T x N (who may be chosen, per row); all
            online when None.

    Returns:
        T x K (or K) device indices, each row sorted.
    """
    v = np.asarray(volunteers, dtype=bool)
    single = v.ndim == 1
    rows = v[None, :] if single else v
    if rows.ndim != 2:
        raise SelectionError("volunteers must be N or T x N booleans")
    n = rows.shape[1]
    up = np.ones(n, dtype=bool) if online is None else np.asarray(online, dtype=bool)
    if up.shape not in ((n,), rows.shape):
        raise SelectionError(f"online must have {n} entries (or one row per set)")
    fewest = int(up.sum(axis=-1).min()) if up.size else 0
    if not 1 <= k <= fewest:
        raise SelectionError(f"K={k} needs 1 <= K <= online devices ({fewest})")
    keys = rng.random(rows.shape)
    keys += ~rows
    if up.ndim == 1:
        keys[:, ~up] = np.inf
    else:
        keys[~up] = np.inf
    chosen = (
        np.argpartition(keys, k - 1, axis=1)[:, :k]
        if k < n
        else np.tile(np.arange(n), (rows.shape[0], 1))
    )
    chosen = np.sort(chosen, axis=1).astype(np.int64)
    return chosen[0] if single else chosen


def choose_try(tries: NDArray[np.integer], h_star: int) -> NDArray[np.int64]:
    """The adopted set: tentative set ``h_star`` (the agent's answer)."""
    sets = np.asarray(tries, dtype=np.int64)
    if sets.ndim != 2:
        raise SelectionError("tries must be H x K device indices")
    if not 0 <= h_star < sets.shape[0]:
        raise SelectionError(
            f"agent answered try {h_star}, but there are {sets.shape[0]}"
        )
    return np.asarray(sets[h_star], dtype=np.int64)


def sigma_grid(codebook: Codebook, steps: int = 10) -> list[tuple[float, ...]]:
    """The parameter-search grid: sigma_i in {j / (i * steps) : j = 1..steps}.

    One value per group except C (sigma_C = 0), in increasing i. The i-th
    largest proportion of a distribution is at most 1/i, so that is the top of
    each axis. ``steps=10`` contains the paper's optimum (0.7, 0.1) for
    G = {1, 2, 10}.
    """
    if steps < 1:
        raise SelectionError(f"steps must be >= 1, got {steps}")
    axes = [
        [round(j / (i * steps), 10) for j in range(1, steps + 1)]
        for i in codebook.groups[:-1]
    ]
    return [tuple(point) for point in itertools.product(*axes)]
