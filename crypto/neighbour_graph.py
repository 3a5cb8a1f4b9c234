"""Who shares masks and secrets with whom: the SecAgg+ neighbour graph.

Bonawitz et al. (CCS 2017) mask every pair of devices, so a round costs O(K^2)
key agreements and Shamir shares. SecAgg+ (Bell et al., CCS 2020) replaces the
complete graph with a sparse one of degree O(log K) and shares each device's
secrets only inside its neighbourhood. Here the sparse graph is a circulant
(Harary) graph over a seeded pseudorandom order of the devices: each device is
joined to the ``degree // 2`` nearest devices on each side of that order.

Both ends compute the graph from the same participant list and `graph_seed`:
the coordinator all of it (`neighbours`), a device only the parts it needs
(`NeighbourRing`), so a device's work grows with the degree, not with K. The
graph depends only on (the set of participants, degree, seed), never on list
order.

Caveat: the seed is the round's context, known to the coordinator in advance
(it is not a jointly random coin as in Bell et al.). A coordinator that
controls which devices are selected could therefore place many of its own
devices next to a target; the share threshold (below) is what protects the
target, and it holds only while fewer than a third of a neighbourhood collude.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "SPARSE_DEGREE_BASE",
    "SPARSE_DEGREE_PER_BIT",
    "NeighbourRing",
    "graph_seed",
    "neighbours",
    "share_holders",
    "share_threshold",
    "sparse_degree",
]

_SEED_LABEL = b"ursa-secagg-graph-v1"
_SHA256_BLOCK = 64
SPARSE_DEGREE_PER_BIT = 4
SPARSE_DEGREE_BASE = 16


def graph_seed(federation: str, run: str, round_index: int) -> bytes:
    """The 32-byte seed of a round's graph: a hash of the round's context."""
    parts = (federation.encode(), run.encode(), struct.pack(">Q", round_index))
    framed = _SEED_LABEL + b"".join(struct.pack(">I", len(p)) + p for p in parts)
    return hashlib.sha256(framed).digest()


class NeighbourRing:
    """A round's graph as the ring it is cut from: any node's neighbourhood on demand.

    `neighbours` builds every neighbourhood, O(K * d) set work: what the
    coordinator needs. A device needs only its own neighbourhood and its index
    among each sender's share holders; asking the ring for those costs the
    ring's order (K HMACs and a sort, once) plus O(d) per question, so its
    share step grows with the degree, not with K.

    The order: ``degree`` rounded up to even; if that reaches ``len - 1`` the
    graph is complete. Otherwise participants are ordered by
    ``HMAC-SHA256(seed, id)`` (ties by id) and each is joined to the
    ``degree // 2`` nearest on either side of that ring. Every device has the
    same number of neighbours (the effective degree); the order depends only
    on (the set of participants, degree, seed), never on list order.

    Raises:
        ValueError: duplicate participants or a negative degree.
    """

    def __init__(self, participants: Iterable[str], degree: int, seed: bytes) -> None:
        ids = sorted(participants)
        position = {u: i for i, u in enumerate(ids)}
        if len(position) != len(ids):
            raise ValueError("duplicate participant ids")
        self._effective = _effective_degree(len(ids), degree)
        self._complete = self._effective == len(ids) - 1
        if not self._complete:
            ids.sort(key=_ring_key(seed))
            position = {u: i for i, u in enumerate(ids)}
        self._order = tuple(ids)  # sorted ids (complete) or the ring
        self._position = position
        self._half = self._effective // 2

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._position

    def __len__(self) -> int:
        return len(self._order)

    @property
    def degree(self) -> int:
        """The effective degree: every node's number of neighbours."""
        return self._effective

    def neighbours_of(self, device_id: str) -> tuple[str, ...]:
        """``device_id``'s neighbours, sorted, itself excluded.

        Raises:
            KeyError: not a participant.
        """
        return tuple(v for v in self.share_holders(device_id) if v != device_id)

    def share_holders(self, owner: str) -> tuple[str, ...]:
        """Who holds ``owner``'s shares, in index order: sorted(N(owner) + owner).

        Raises:
            KeyError: not a participant.
        """
        if self._complete:
            if owner not in self._position:
                raise KeyError(owner)
            return self._order
        return tuple(sorted(self._window(owner)))

    def share_index(self, owner: str, holder: str) -> int:
        """``holder``'s share index (1-based) among ``owner``'s share holders.

        O(d) (no sort): the holders before it in sorted order, plus one.

        Raises:
            KeyError: either is not a participant.
            ValueError: ``holder`` holds none of ``owner``'s shares.
        """
        at, place = self._position[owner], self._position[holder]
        if self._complete:
            return place + 1
        count = len(self._order)
        if min((place - at) % count, (at - place) % count) > self._half:
            raise ValueError(f"{holder!r} holds no share of {owner!r}")
        return 1 + len([v for v in self._window(owner) if v < holder])

    def graph(self) -> dict[str, tuple[str, ...]]:
        """Every participant's neighbours (sorted ids, self excluded); symmetric."""
        if self._complete:
            return {u: tuple(v for v in self._order if v != u) for u in self._order}
        return {u: self.neighbours_of(u) for u in self._order}

    def _window(self, owner: str) -> tuple[str, ...]:
        """``owner`` and the ``half`` nearest on each side of the ring (slices)."""
        at, count, ring = self._position[owner], len(self._order), self._order
        low, high = at - self._half, at + self._half + 1
        if low < 0:
            return ring[low:] + ring[:high]
        if high > count:
            return ring[low:] + ring[: high - count]
        return ring[low:high]


def neighbours(
    participants: Sequence[str], degree: int, seed: bytes
) -> dict[str, tuple[str, ...]]:
    """Each participant's neighbours (sorted ids, self excluded); symmetric.

    The whole graph of `NeighbourRing` (see it for the construction).
    ``degree >= len(participants) - 1`` gives the complete graph.

    Raises:
        ValueError: duplicate participants or a negative degree.
    """
    return NeighbourRing(participants, degree, seed).graph()


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


def _ring_key(seed: bytes) -> Callable[[str], tuple[bytes, str]]:
    """``u -> (HMAC-SHA256(seed, u), u)``, the ring's sort key.

    RFC 2104 from two SHA-256 states keyed once: a device orders all K
    participants, and ``hmac.digest`` sets OpenSSL's HMAC up anew per call
    (about six times the cost). The seed is public (the round's context):
    nothing here is secret. Tests check it against ``hmac.digest``.
    """
    key = seed if len(seed) <= _SHA256_BLOCK else hashlib.sha256(seed).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def ring_key(device_id: str) -> tuple[bytes, str]:
        digest = inner.copy()
        digest.update(device_id.encode())
        mac = outer.copy()
        mac.update(digest.digest())
        return mac.digest(), device_id

    return ring_key


def _effective_degree(count: int, degree: int) -> int:
    if degree < 0:
        raise ValueError(f"degree must be >= 0, not {degree}")
    if count == 0:
        return 0
    return min(count - 1, degree + degree % 2)
