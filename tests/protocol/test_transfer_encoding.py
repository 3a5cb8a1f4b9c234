"""Transfer encodings: byte planes + zlib round-trips, shrinks floats, is bounded."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from ursa.protocol.errors import ChunkError, OversizeError
from ursa.protocol.transfer_encoding import (
    IDENTITY,
    PLANES_ZLIB,
    decode_payload,
    encode_payload,
)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 1027])
def test_planes_zlib_round_trips_any_length(size: int) -> None:
    payload = bytes(np.random.default_rng(size).integers(0, 256, size, np.uint8))

    encoded = encode_payload(payload, PLANES_ZLIB)

    assert decode_payload(encoded, PLANES_ZLIB, max_size=size) == payload
    assert encode_payload(payload, IDENTITY) == payload


def test_float_weights_shrink_more_than_under_zlib_alone() -> None:
    weights = np.random.default_rng(0).normal(0, 0.1, 20_000).astype("<f4").tobytes()

    planes = len(encode_payload(weights, PLANES_ZLIB))

    assert planes < len(zlib.compress(weights, 9)) < len(weights)


def test_a_small_transfer_cannot_inflate_past_the_cap() -> None:
    bomb = encode_payload(bytes(1_000_000), PLANES_ZLIB)  # about 1 KiB on the wire

    with pytest.raises(OversizeError):
        decode_payload(bomb, PLANES_ZLIB, max_size=64 * 1024)
    with pytest.raises(OversizeError):
        decode_payload(b"x" * 10, IDENTITY, max_size=9)


def test_a_stream_that_is_not_the_encodings_is_refused() -> None:
    good = encode_payload(b"0123456789", PLANES_ZLIB)

    with pytest.raises(ChunkError, match="does not inflate"):
        decode_payload(b"not zlib", PLANES_ZLIB, max_size=100)
    with pytest.raises(ChunkError, match="truncated"):
        decode_payload(good[:-3], PLANES_ZLIB, max_size=100)
    with pytest.raises(ChunkError, match="trailing"):
        decode_payload(good + b"more", PLANES_ZLIB, max_size=100)
