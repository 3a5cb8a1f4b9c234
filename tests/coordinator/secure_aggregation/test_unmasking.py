"""unmask_sum recovers the survivors' plaintext sum and refuses what it cannot trust."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ursa.coordinator.secure_aggregation as coordinator_secagg
from tests.secagg_round import Reveals, Round, device_ids, run_round
from ursa.coordinator.secure_aggregation import UnmaskError, add_masked
from ursa.crypto.fixed_point import Segment, VectorLayout
from ursa.crypto.neighbour_graph import share_threshold
from ursa.crypto.shamir import Share, UnmaskShare, split_secret


def _layout(parties: int) -> VectorLayout:
    return VectorLayout(
        [Segment("dense.weight", 12, 0.5), Segment("weight", 1, 50.0)],
        parties=parties,
    )


def _float_parts(k: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        device_id: {
            "dense.weight": rng.uniform(-0.5, 0.5, (3, 4)),
            "weight": np.array([float(rng.integers(1, 50))]),
        }
        for device_id in device_ids(k)
    }


@pytest.mark.parametrize(
    ("k", "threshold", "degree", "drop_share", "drop_mask", "drop_unmask"),
    [
        (8, 5, 7, ["dev-01"], ["dev-04"], ["dev-06"]),
        (40, 27, 20, ["dev-03", "dev-17"], ["dev-05", "dev-30"], ["dev-11", "dev-39"]),
    ],
    ids=["k8-complete", "k40-sparse"],
)
def test_decoded_sum_equals_the_survivors_plaintext_sum(
    k: int,
    threshold: int,
    degree: int,
    drop_share: list[str],
    drop_mask: list[str],
    drop_unmask: list[str],
) -> None:
    layout = _layout(parties=k)
    parts = _float_parts(k, seed=k)
    rng = np.random.default_rng(0)
    vectors = {
        u: layout.from_bytes(layout.to_bytes(layout.encode(p, rng)))
        for u, p in parts.items()
    }
    secagg = Round(k=k, threshold=threshold, degree=degree)
    if degree < k - 1:
        assert len(secagg.graph()["dev-00"]) == degree  # really sparse

    outcome = run_round(
        secagg,
        vectors,
        drop_before_share=drop_share,
        drop_before_mask=drop_mask,
        drop_before_unmask=drop_unmask,
    )

    excluded = set(drop_share) | set(drop_mask)
    assert outcome.survivors == sorted(set(device_ids(k)) - excluded)
    assert outcome.dropped == sorted(drop_mask)
    exact = np.zeros(layout.length, dtype=np.uint32)
    for u in outcome.survivors:
        exact = add_masked(exact, vectors[u])
    assert np.array_equal(outcome.total, exact)  # exact in the ring
    decoded = layout.decode(layout.from_bytes(layout.to_bytes(outcome.total)))
    n = len(outcome.survivors)
    for name in ("dense.weight", "weight"):
        expected = sum(np.ravel(parts[u][name]) for u in outcome.survivors)
        step = 2.0 ** -layout.codec(name).scale_bits
        np.testing.assert_allclose(decoded[name], expected, atol=n * step)


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_random_rounds_unmask_exactly(data: st.DataObject) -> None:
    k = data.draw(st.integers(2, 14), label="k")
    degree = data.draw(st.integers(1, k - 1), label="degree")
    threshold = data.draw(st.integers(1, k), label="threshold")
    t_n = share_threshold(threshold, k, degree)
    holders = min(k - 1, degree + degree % 2) + 1
    slack = min(holders - t_n, k - threshold)
    ids = device_ids(k)
    drops = data.draw(
        st.lists(st.sampled_from(ids), unique=True, max_size=slack), label="drops"
    )
    cut = sorted(
        data.draw(st.lists(st.integers(0, len(drops)), min_size=2, max_size=2))
    )
    length = data.draw(st.integers(1, 50), label="length")
    rng = np.random.default_rng(k * 1000 + length)
    vectors = {
        u: rng.integers(0, 2**32, size=length, dtype=np.uint64).astype(np.uint32)
        for u in ids
    }
    outcome = run_round(
        Round(k=k, threshold=threshold, degree=degree),
        vectors,
        drop_before_share=drops[: cut[0]],
        drop_before_mask=drops[cut[0] : cut[1]],
        drop_before_unmask=drops[cut[1] :],
    )
    exact = np.zeros(length, dtype=np.uint32)
    for u in outcome.survivors:
        exact = add_masked(exact, vectors[u])
    assert np.array_equal(outcome.total, exact)


def _zeros(k: int, length: int = 6) -> dict[str, np.ndarray]:
    return {u: np.zeros(length, dtype=np.uint32) for u in device_ids(k)}


def _replace_first(reveals: Reveals, owner: str, data: bytes) -> Reveals:
    first, *rest = reveals[owner]
    forged = dataclasses.replace(first, share=Share(first.share.index, data))
    return {**reveals, owner: [forged, *rest]}


def _keep(reveals: Reveals, owner: str, count: int) -> Reveals:
    return {**reveals, owner: reveals[owner][:count]}


def test_a_wrong_s_share_is_caught_by_the_advertised_key() -> None:
    def tamper(reveals: Reveals) -> Reveals:
        # consistent shares of another secret: they rebuild a key, not the one
        # dev-02 advertised
        kept = _keep(reveals, "dev-02", 3)["dev-02"]
        other = split_secret(bytes(range(32)), 3, max(r.share.index for r in kept))
        forged = [dataclasses.replace(r, share=other[r.share.index - 1]) for r in kept]
        return {**reveals, "dev-02": forged}

    with pytest.raises(UnmaskError, match="does not match its advert") as caught:
        run_round(
            Round(k=5, threshold=3, degree=4),
            _zeros(5),
            drop_before_mask=["dev-02"],
            tamper=tamper,
        )
    assert caught.value.owners == ("dev-02",)


def test_a_wrong_share_among_redundant_ones_is_caught() -> None:
    def tamper(reveals: Reveals) -> Reveals:
        return _replace_first(reveals, "dev-00", bytes(34))  # a b share

    with pytest.raises(UnmaskError, match="inconsistent") as caught:
        run_round(Round(k=5, threshold=3, degree=4), _zeros(5), tamper=tamper)
    assert caught.value.owners == ("dev-00",)


def test_too_few_shares_names_the_owner() -> None:
    def tamper(reveals: Reveals) -> Reveals:
        return _keep(_keep(reveals, "dev-01", 2), "dev-03", 1)

    with pytest.raises(UnmaskError, match="3 needed") as caught:
        run_round(Round(k=5, threshold=3, degree=4), _zeros(5), tamper=tamper)
    assert caught.value.owners == ("dev-01", "dev-03")


def test_shares_of_the_wrong_kind_or_holder_are_refused() -> None:
    def wrong_kind(reveals: Reveals) -> Reveals:
        item = reveals["dev-00"][0]
        return {**reveals, "dev-00": [dataclasses.replace(item, kind="s")]}

    with pytest.raises(UnmaskError, match="needs b"):
        run_round(Round(k=4, threshold=2, degree=3), _zeros(4), tamper=wrong_kind)

    def dropped_holder(reveals: Reveals) -> Reveals:
        item = reveals["dev-00"][0]
        moved = UnmaskShare("dev-00", "b", Share(4, item.share.data))  # dev-03's
        return {**reveals, "dev-00": [moved, *reveals["dev-00"][1:]]}

    with pytest.raises(UnmaskError, match="no surviving holder"):
        run_round(
            Round(k=4, threshold=2, degree=3),
            _zeros(4),
            drop_before_mask=["dev-03"],
            tamper=dropped_holder,
        )


def test_too_few_survivors_or_inconsistent_lists_are_refused() -> None:
    secagg = Round(k=4, threshold=3, degree=3)
    secagg.advertise()
    total = np.zeros(3, dtype=np.uint32)
    with pytest.raises(UnmaskError, match="fewer than the threshold"):
        secagg.unmask(total, ["dev-00", "dev-01"], [], {})
    with pytest.raises(UnmaskError, match="overlap"):
        secagg.unmask(total, ["dev-00", "dev-01", "dev-02"], ["dev-02"], {})
    with pytest.raises(UnmaskError, match="not participants"):
        secagg.unmask(total, ["dev-00", "dev-01", "dev-02"], ["dev-99"], {})


def test_add_masked_wraps_and_checks_shapes() -> None:
    top = np.array([2**32 - 1, 5], dtype=np.uint32)
    assert add_masked(top, np.array([2, 1], dtype=np.uint32)).tolist() == [1, 6]
    with pytest.raises(ValueError):
        add_masked(top, np.array([1], dtype=np.uint32))
    with pytest.raises(ValueError):
        add_masked(top, np.array([1, 2], dtype=np.int64))


def test_exported_members_are_pinned() -> None:
    assert set(coordinator_secagg.__all__) == {
        "UnmaskError",
        "UnmaskShare",
        "add_masked",
        "unmask_sum",
    }
