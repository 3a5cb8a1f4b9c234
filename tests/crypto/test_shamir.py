"""Shamir shares of multi-block secrets, and the typed refusals."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.crypto import shamir
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


@pytest.mark.parametrize(
    ("threshold", "holders"),
    [(1, 1), (3, 5), (30, 45), (39, 57), (250, 300)],  # (250, 300): per block
)
def test_shares_are_the_textbook_polynomial_values(
    threshold: int, holders: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether packed or per block, share x is sum_i c_i x^i mod p, c_0 the block."""
    draws = random.Random(threshold)
    drawn: list[int] = []

    def randbelow(bound: int) -> int:
        drawn.append(draws.randrange(bound))
        return drawn[-1]

    monkeypatch.setattr(shamir.secrets, "randbelow", randbelow)
    secret = bytes(range(1, 65))  # four blocks
    shares = split_secret(secret, threshold, holders)
    blocks = [int.from_bytes(secret[o : o + 16], "big") for o in range(0, 64, 16)]
    # Drawn by degree (highest first), then by block.
    coefficients = [drawn[j::4] for j in range(4)]
    for share in shares:
        x = share.index
        for j, block in enumerate(blocks):
            degree = len(coefficients[j])
            expected = (
                block
                + sum(c * x ** (degree - i) for i, c in enumerate(coefficients[j]))
            ) % shamir.PRIME
            data = share.data[17 * j : 17 * (j + 1)]
            assert int.from_bytes(data, "big") == expected
    assert combine_shares(shares[-threshold:], threshold) == secret


def test_a_share_of_two_secrets_is_the_two_shares_side_by_side() -> None:
    """The participant splits s || b once; each half rebuilds its own secret."""
    s, b = os.urandom(32), os.urandom(32)
    shares = split_secret(s + b, 4, 7)
    half = 2 * SHARE_BLOCK_BYTES
    assert combine_shares([Share(x.index, x.data[:half]) for x in shares[2:6]], 4) == s
    assert combine_shares([Share(x.index, x.data[half:]) for x in shares[:4]], 4) == b
