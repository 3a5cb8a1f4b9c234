"""Shamir shares of multi-block secrets, and the typed refusals."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.crypto.shamir import (
    MAX_HOLDERS,
    SHARE_BLOCK_BYTES,
    Share,
    ShareError,
    UnmaskShare,
    combine_shares,
    split_secret,
)


@settings(max_examples=20, deadline=None)
@given(
    holders=st.integers(1, 12),
    data=st.data(),
    blocks=st.integers(1, 3),
)
def test_any_threshold_subset_rebuilds_the_secret(
    holders: int, data: st.DataObject, blocks: int
) -> None:
    threshold = data.draw(st.integers(1, holders))
    secret = os.urandom(16 * blocks)
    shares = split_secret(secret, threshold, holders)
    assert [share.index for share in shares] == list(range(1, holders + 1))
    subset = random.Random(holders).sample(shares, threshold)
    assert combine_shares(subset, threshold) == secret
    assert combine_shares(shares, threshold) == secret


def test_fewer_than_threshold_do_not_rebuild() -> None:
    secret = os.urandom(32)
    shares = split_secret(secret, 3, 5)
    with pytest.raises(ShareError, match="needed"):
        combine_shares(shares[:2], 3)
    try:  # the wrong threshold: garbage, or no secret block at all
        assert combine_shares(shares[:2], 2) != secret
    except ShareError as exc:
        assert "no secret block" in str(exc)


def test_a_wrong_share_among_redundant_ones_is_caught() -> None:
    shares = split_secret(os.urandom(32), 3, 5)
    forged = Share(shares[0].index, bytes(SHARE_BLOCK_BYTES * 2))
    with pytest.raises(ShareError, match="inconsistent"):
        combine_shares([forged, *shares[1:]], 3)


def test_refusals() -> None:
    shares = split_secret(os.urandom(32), 2, 3)
    with pytest.raises(ShareError, match="duplicate"):
        combine_shares([shares[0], shares[0]], 2)
    with pytest.raises(ShareError, match="lengths"):
        combine_shares([shares[0], Share(2, bytes(SHARE_BLOCK_BYTES))], 2)
    with pytest.raises(ShareError):
        split_secret(os.urandom(20), 2, 3)
    with pytest.raises(ShareError):
        split_secret(os.urandom(32), 0, 3)
    with pytest.raises(ShareError):
        split_secret(os.urandom(32), 4, 3)
    with pytest.raises(ShareError):
        split_secret(os.urandom(32), 1, MAX_HOLDERS + 1)
    with pytest.raises(ShareError):
        Share(0, bytes(SHARE_BLOCK_BYTES))
    with pytest.raises(ShareError):
        Share(1, bytes(15))


def test_unmask_share_bytes_round_trip() -> None:
    revealed = UnmaskShare(
        "device-7", "s", Share(300, os.urandom(2 * SHARE_BLOCK_BYTES))
    )
    assert UnmaskShare.from_bytes(revealed.to_bytes()) == revealed
    with pytest.raises(ShareError):
        UnmaskShare.from_bytes(revealed.to_bytes()[:5])
    with pytest.raises(ShareError):
        UnmaskShare("d", "x", Share(1, bytes(SHARE_BLOCK_BYTES)))  # type: ignore[arg-type]
