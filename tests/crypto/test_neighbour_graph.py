"""The SecAgg+ neighbour graph: symmetric, regular, deterministic; thresholds."""

from __future__ import annotations

import hmac
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.crypto.neighbour_graph import (
    NeighbourRing,
    graph_seed,
    neighbours,
    share_holders,
    share_threshold,
    sparse_degree,
)

SEED = graph_seed("fed", "run", 1)


def _ids(n: int) -> list[str]:
    return [f"dev-{i:03d}" for i in range(n)]


def test_complete_when_degree_reaches_n_minus_1() -> None:
    ids = _ids(5)
    graph = neighbours(ids, 4, SEED)
    assert graph["dev-000"] == ("dev-001", "dev-002", "dev-003", "dev-004")
    assert neighbours(ids, 3, SEED) == graph  # 3 rounds up to 4 = n - 1


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 60), degree=st.integers(0, 70))
def test_graph_is_symmetric_regular_and_order_free(n: int, degree: int) -> None:
    ids = _ids(n)
    graph = neighbours(ids, degree, SEED)
    effective = min(n - 1, degree + degree % 2)
    assert set(graph) == set(ids)
    for u, around in graph.items():
        assert u not in around
        assert len(around) == effective
        assert all(u in graph[v] for v in around)
    assert neighbours(list(reversed(ids)), degree, SEED) == graph


def test_graph_depends_on_the_seed() -> None:
    ids = _ids(40)
    assert neighbours(ids, 6, SEED) != neighbours(ids, 6, graph_seed("fed", "run", 2))


def test_share_holders_include_the_owner_in_sorted_order() -> None:
    graph = neighbours(_ids(10), 4, SEED)
    holders = share_holders(graph, "dev-003")
    assert holders == tuple(sorted((*graph["dev-003"], "dev-003")))


def test_refuses_duplicates_and_negative_degree() -> None:
    with pytest.raises(ValueError):
        neighbours(["a", "a"], 1, SEED)
    with pytest.raises(ValueError):
        neighbours(["a", "b"], -1, SEED)


def test_sparse_degree() -> None:
    assert sparse_degree(30, sparse_above=50) == 29
    assert sparse_degree(64, sparse_above=50) == 16 + 4 * 6
    assert sparse_degree(1000, sparse_above=50) == 56
    assert sparse_degree(10, sparse_above=5) == 9  # capped at k - 1
    assert all(sparse_degree(k, 20) % 2 == 0 for k in range(60, 5000, 37))


def test_share_threshold() -> None:
    assert share_threshold(threshold=27, k=40, degree=39) == 27
    assert share_threshold(threshold=27, k=40, degree=12) == math.ceil(2 * 13 / 3)
    assert share_threshold(threshold=27, k=40, degree=11) == 9  # 11 -> 12
    for degree in range(2, 80, 2):
        t = share_threshold(threshold=2, k=100, degree=degree)
        assert 2 * t > degree + 1  # two disjoint honest halves cannot both reach t
    with pytest.raises(ValueError):
        share_threshold(threshold=0, k=4, degree=3)
    with pytest.raises(ValueError):
        share_threshold(threshold=5, k=4, degree=3)


def _first_graph(
    ids: list[str], degree: int, seed: bytes
) -> dict[str, tuple[str, ...]]:
    """The graph as first built (every neighbourhood from sets): the reference."""
    ids = sorted(ids)
    count = len(ids)
    effective = min(count - 1, degree + degree % 2)
    if effective == count - 1:
        return {u: tuple(v for v in ids if v != u) for u in ids}
    ring = sorted(ids, key=lambda u: (hmac.digest(seed, u.encode(), "sha256"), u))
    half = effective // 2
    graph = {}
    for position, u in enumerate(ring):
        around = {ring[(position + step) % count] for step in range(1, half + 1)}
        around |= {ring[(position - step) % count] for step in range(1, half + 1)}
        graph[u] = tuple(sorted(around))
    return graph


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 90),
    degree=st.integers(0, 100),
    salt=st.integers(0, 2**32),
)
def test_a_devices_own_queries_agree_with_the_whole_graph(
    n: int, degree: int, salt: int
) -> None:
    """What a device asks the ring is what the coordinator's full graph says."""
    chooser = random.Random(salt)
    ids = [f"d{chooser.getrandbits(40):x}-{i}" for i in range(n)]
    chooser.shuffle(ids)
    seed = graph_seed("fed", f"run-{salt}", salt % 97)
    graph = _first_graph(ids, degree, seed)
    assert neighbours(ids, degree, seed) == graph
    ring = NeighbourRing(ids, degree, seed)
    assert ring.degree == min(n - 1, degree + degree % 2)
    for owner in ids:
        assert ring.neighbours_of(owner) == graph[owner]
        holders = share_holders(graph, owner)
        assert ring.share_holders(owner) == holders
        for index, holder in enumerate(holders, start=1):
            assert ring.share_index(owner, holder) == index
        for stranger in set(ids) - set(holders):
            with pytest.raises(ValueError, match="holds no share"):
                ring.share_index(owner, stranger)


def test_the_ring_knows_its_participants_and_refuses_strangers() -> None:
    ring = NeighbourRing(_ids(40), 6, SEED)
    assert "dev-007" in ring and "dev-999" not in ring and len(ring) == 40
    for ask in (ring.neighbours_of, ring.share_holders):
        with pytest.raises(KeyError):
            ask("dev-999")
    with pytest.raises(KeyError):
        ring.share_index("dev-001", "dev-999")
    complete = NeighbourRing(_ids(5), 4, SEED)
    with pytest.raises(KeyError):
        complete.share_holders("dev-999")
    with pytest.raises(ValueError, match="duplicate"):
        NeighbourRing(["a", "b", "a"], 1, SEED)


@pytest.mark.parametrize("seed_bytes", [0, 1, 32, 63, 64, 65, 200])
def test_the_ring_order_is_hmac_sha256_for_any_seed_length(seed_bytes: int) -> None:
    """The ring's own HMAC (two keyed SHA-256 states) is `hmac.digest`'s."""
    seed = bytes((7 * i + 1) % 256 for i in range(seed_bytes))
    ids = [f"dev-{i:03d}" for i in range(70)]
    assert neighbours(ids, 10, seed) == _first_graph(ids, 10, seed)
