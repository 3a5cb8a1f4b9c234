"""Fixed-point ring encoding: no wrap for honest sums, unbiased rounding, bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.crypto.fixed_point import (
    MAX_SCALE_BITS,
    RING,
    RING_BITS,
    LayoutError,
    RingFixedPoint,
    Segment,
    VectorLayout,
)


def test_ring_constants() -> None:
    assert RING_BITS == 32
    assert RING == 2**32


def test_for_sum_picks_the_largest_scale_that_cannot_wrap() -> None:
    codec = RingFixedPoint.for_sum(bound=1.0, parties=100)
    s = codec.scale_bits
    assert 100 * (2**s) < 2**31 <= 100 * 2 ** (s + 1)
    assert RingFixedPoint.for_sum(bound=1e-6, parties=2).scale_bits == MAX_SCALE_BITS


def test_for_sum_counts_headroom() -> None:
    without = RingFixedPoint.for_sum(bound=1.0, parties=100)
    with_room = RingFixedPoint.for_sum(bound=1.0, parties=100, headroom=200.0)
    assert with_room.scale_bits < without.scale_bits


def test_for_sum_refuses_when_even_integers_overflow() -> None:
    with pytest.raises(ValueError, match="overflow"):
        RingFixedPoint.for_sum(bound=2.0**31, parties=2)


def test_encode_clips_and_decode_recovers_within_one_unit() -> None:
    rng = np.random.default_rng(1)
    codec = RingFixedPoint.for_sum(bound=2.0, parties=10)
    values = np.array([-5.0, -2.0, -0.3, 0.0, 0.7, 2.0, 9.0])
    decoded = codec.decode(codec.encode(values, rng))
    np.testing.assert_allclose(
        decoded, np.clip(values, -2, 2), atol=2.0**-codec.scale_bits
    )


def test_stochastic_rounding_is_unbiased() -> None:
    rng = np.random.default_rng(2)
    codec = RingFixedPoint(scale_bits=0, bound=10.0)
    encoded = codec.encode(np.full(200_000, 0.25), rng)
    assert set(np.unique(codec.decode(encoded))) == {0.0, 1.0}
    assert abs(codec.decode(encoded).mean() - 0.25) < 0.01


def test_encode_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        RingFixedPoint(4, 1.0).encode(np.array([np.nan]), np.random.default_rng(0))


@settings(max_examples=20, deadline=None)
@given(
    parties=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_worst_case_sum_never_wraps(parties: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    codec = RingFixedPoint.for_sum(bound=3.0, parties=parties)
    sign = rng.choice([-1.0, 1.0])
    total = np.zeros(4, dtype=np.uint32)
    for _ in range(parties):
        total += codec.encode(np.full(4, sign * 3.0), rng)
    np.testing.assert_allclose(codec.decode(total), sign * 3.0 * parties, rtol=1e-6)


def _layout() -> VectorLayout:
    return VectorLayout(
        [Segment("a", 5, 1.0), Segment("weight", 1, 100.0), Segment("b", 3, 0.5)],
        parties=8,
    )


def test_layout_sums_segments_with_their_own_codecs() -> None:
    layout = _layout()
    rng = np.random.default_rng(3)
    parts = [
        {
            "a": rng.uniform(-1, 1, 5),
            "weight": np.array([rng.integers(1, 100)]),
            "b": rng.uniform(-0.5, 0.5, (3,)),
        }
        for _ in range(8)
    ]
    total = np.zeros(layout.length, dtype=np.uint32)
    for part in parts:
        total = total + layout.from_bytes(layout.to_bytes(layout.encode(part, rng)))
    decoded = layout.decode(total)
    assert layout.length == 9
    assert layout.codec("weight").scale_bits < layout.codec("a").scale_bits
    for name in ("a", "weight", "b"):
        expected = sum(np.ravel(part[name]) for part in parts)
        step = 2.0 ** -layout.codec(name).scale_bits
        np.testing.assert_allclose(decoded[name], expected, atol=8 * step)


def test_layout_refuses_missing_unknown_and_missized_segments() -> None:
    layout = _layout()
    rng = np.random.default_rng(4)
    good = {"a": np.zeros(5), "weight": np.zeros(1), "b": np.zeros(3)}
    with pytest.raises(LayoutError, match="missing"):
        layout.encode({"a": np.zeros(5)}, rng)
    with pytest.raises(LayoutError, match="unknown"):
        layout.encode({**good, "c": np.zeros(1)}, rng)
    with pytest.raises(LayoutError, match="expected 3"):
        layout.encode({**good, "b": np.zeros(4)}, rng)


def test_layout_bytes_are_little_endian_and_size_checked() -> None:
    layout = _layout()
    vector = np.arange(9, dtype=np.uint32)
    data = layout.to_bytes(vector)
    assert data[:8] == bytes([0, 0, 0, 0, 1, 0, 0, 0])
    assert np.array_equal(layout.from_bytes(data), vector)
    with pytest.raises(LayoutError):
        layout.from_bytes(data[:-1])
    with pytest.raises(LayoutError):
        layout.to_bytes(np.arange(8, dtype=np.uint32))
    with pytest.raises(LayoutError):
        layout.decode(vector.astype(np.int64))


def test_layout_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        VectorLayout([Segment("a", 1, 1.0), Segment("a", 2, 1.0)], parties=2)


def test_codec_refuses_a_bound_that_does_not_fit_one_value() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        RingFixedPoint(scale_bits=24, bound=1000.0)
