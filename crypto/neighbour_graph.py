"""Who shares masks and secrets with whom: the SecAgg+ neighbour graph.

Bonawitz et al. (CCS 2017) mask every pair of devices, so a round costs O(K^2)
key agreements and Shamir shares. SecAgg+ (Bell et al., CCS 2020) replaces the
complete graph with a sparse one of degree O(log K) and shares each device's
secrets only inside its neighbourhood. Here the sparse graph is a circulant
(Harary) graph over a seeded pseudorandom order of the devices: each device is
joined to the ``degree // 2`` nearest devices on each side of that order.

Both ends compute the graph: a device from the roster it is sent, the
coordinator from the same list, with the same `graph_seed`. The graph depends
only on (the set of participants, degree, seed), never on list order.

Caveat: the seed is the round's context, known to the coordinator in advance
(it is not a jointly random coin as in Bell et al.). A coordinator that
controls which devices are selected could therefore place many of its own
devices next to a target; the share threshold (below) is what protects the
target, and it holds only while fewer than a third of a neighbourhood collude.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Mapping, Sequence

__all__ = [
    "SPARSE_DEGREE_BASE",
    "SPARSE_DEGREE_PER_BIT",
    "graph_seed",
    "neighbours",
    "share_holders",
    "share_threshold",
    "sparse_degree",
]

_SEED_LABEL = b"ursa-secagg-graph-v1"
SPARSE_DEGREE_PER_BIT = 4
SPARSE_DEGREE_BASE = 16


def graph_seed(federation: str, run: str, round_index: int) -> bytes:
    """The 32-byte seed of a round's graph: a hash of the round's context."""
    parts = (federation.encode(), run.encode(), struct.pack(">Q", round_index))
    framed = _SEED_LABEL + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hashlib.sha256(framed).digest()


def neighbours(
    participants: Sequence[str], degree: int, seed: bytes
) -> dict[str, tuple[str, ...]]:
    """Each participant's neighbours (sorted ids, self excluded); symmetric.

    ``degree >= len(participants) - 1`` gives the complete graph. Otherwise
    ``degree`` is rounded up to even, participants are ordered by
    ``HMAC-SHA256(seed, id)`` and each is joined to the ``degree // 2``
    nearest on either side of that ring; if the rounded degree reaches
    ``len - 1`` the graph is complete. Every device has the same number of
    neighbours (the effective degree).

    Raises:
        ValueError: duplicate participants or a negative degree.
    """
    ids = sorted(participants)
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate participant ids")
    count = len(ids)
    effective = _effective_degree(count, degree)
    if effective == count - 1:
        return {u: tuple(v for v in ids if v != u) for u in ids}
    ring = sorted(ids, key=lambda u: (hmac.digest(seed, u.encode(), "sha256"), u))
    half = effective // 2
    graph: dict[str, tuple[str, ...]] = {}
    for position, u in enumerate(ring):
        around = {ring[(position + step) % count] for step in range(1, half + 1)}
        around |= {ring[(position - step) % count] for step in range(1, half + 1)}
        graph[u] = tuple(sorted(around))
    return graph


def share_holders(graph: Mapping[str, tuple[str, ...]], owner: str) -> tuple[str, ...]:
    """Who holds ``owner``'s shares, in index order: sorted(N(owner) + owner).

    Share index ``i`` (1-based) goes to ``share_holders(...)[i - 1]``, so the
    coordinator can tell which device a revealed share must come from.
    """
    return tuple(sorted((*graph[owner], owner)))


def sparse_degree(k: int, sparse_above: int) -> int:
    """The graph degree for ``k`` participants: complete up to ``sparse_above``.

    Above it: ``16 + 4 * ceil(log2 k)``, rounded up to even, capped at ``k - 1``
    (k = 64: 40, k = 1000: 56, k = 10^4: 72). SecAgg+ needs degree O(log k)
    for privacy (the survivors' graph stays connected) and for correctness
    (every neighbourhood keeps `share_threshold` survivors). With the 2/3
    share threshold, the chance that one neighbourhood of degree d loses too
    many holders when each drops independently with probability p is the
    binomial tail P[Bin(d + 1, 1 - p) < ceil(2(d + 1)/3)]: at d = 56 it is
    about 3e-7 for p = 10 % and 1.4e-4 for p = 15 %, so a round of 1000
    devices fails to unmask with probability about 3e-4 and 0.13.
    Dropout rates near 1/3 (what the round threshold tolerates) need the
    complete graph or a larger degree.

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    if k <= sparse_above:
        return k - 1
    degree = SPARSE_DEGREE_BASE + SPARSE_DEGREE_PER_BIT * math.ceil(math.log2(k))
    return min(k - 1, degree + degree % 2)


def share_threshold(threshold: int, k: int, degree: int) -> int:
    """Shares needed to rebuild one device's secrets, inside its neighbourhood.

    Complete graph (``degree >= k - 1`` after rounding up to even): the
    round's ``threshold`` of the ``k`` holders, as in Bonawitz et al.
    Sparse graph: ``ceil(2 * (d + 1) / 3)`` of the ``d + 1`` holders (the
    ``d`` neighbours and the owner), d the effective (even) degree.

    Why that is safe against a coordinator that drops honest devices: it can
    rebuild both secrets of an honest u (and so unmask x_u alone) only with
    ``t`` shares of b_u and ``t`` of s_u. An honest holder reveals at most one
    kind per owner, so with ``c`` colluding holders it needs ``2 t - c <=
    d + 1``; ``t = ceil(2(d + 1)/3)`` makes that impossible while ``c <
    (d + 1)/3``, and for any ``t`` above half of ``d + 1`` when nobody
    colludes (the honest-but-curious coordinator that lies about dropouts).
    The price is robustness: more than a third of a neighbourhood dropping
    makes u's secrets unrecoverable and the round fails (see `sparse_degree`).

    Raises:
        ValueError: ``threshold`` not in ``[1, k]``.
    """
    if not 1 <= threshold <= k:
        raise ValueError(f"threshold must be in [1, {k}], not {threshold}")
    effective = _effective_degree(k, degree)
    if effective == k - 1:
        return threshold
    return math.ceil(2 * (effective + 1) / 3)


def _effective_degree(count: int, degree: int) -> int:
    if degree < 0:
        raise ValueError(f"degree must be >= 0, not {degree}")
    if count == 0:
        return 0
    return min(count - 1, degree + degree % 2)
