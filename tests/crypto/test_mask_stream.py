"""Mask streams are deterministic per (seed, label); pairwise seeds are symmetric."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ursa.crypto.errors import CryptoError, KeyFormatError
from ursa.crypto.mask_stream import (
    PAIR_MASK_LABEL,
    SELF_MASK_LABEL,
    mask_stream,
    pair_context,
    pairwise_seed,
)


def test_stream_is_deterministic_and_label_separated() -> None:
    seed = bytes(range(32))
    first = mask_stream(seed, 1000, SELF_MASK_LABEL)
    assert first.dtype == np.uint32 and first.shape == (1000,)
    assert np.array_equal(first, mask_stream(seed, 1000, SELF_MASK_LABEL))
    assert np.array_equal(first[:10], mask_stream(seed, 10, SELF_MASK_LABEL))
    assert not np.array_equal(first, mask_stream(seed, 1000, PAIR_MASK_LABEL))
    assert not np.array_equal(first, mask_stream(bytes(32), 1000, SELF_MASK_LABEL))


def test_stream_looks_uniform() -> None:
    stream = mask_stream(b"\x07" * 32, 100_000, SELF_MASK_LABEL)
    assert abs(stream.astype(np.float64).mean() / 2**32 - 0.5) < 0.01
    assert len(np.unique(stream)) > 99_000


def test_stream_refuses_short_seed_and_negative_length() -> None:
    with pytest.raises(ValueError):
        mask_stream(b"short", 4, SELF_MASK_LABEL)
    with pytest.raises(ValueError):
        mask_stream(bytes(32), -1, SELF_MASK_LABEL)
    assert mask_stream(bytes(32), 0, SELF_MASK_LABEL).shape == (0,)


def test_pairwise_seed_is_symmetric_and_context_bound() -> None:
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    a_pub = a.public_key().public_bytes_raw()
    b_pub = b.public_key().public_bytes_raw()
    context = pair_context("fed", "run", 3, "u", "v")
    assert context == pair_context("fed", "run", 3, "v", "u")
    seed = pairwise_seed(a, b_pub, context)
    assert len(seed) == 32
    assert seed == pairwise_seed(b, a_pub, context)
    assert seed != pairwise_seed(a, b_pub, pair_context("fed", "run", 4, "u", "v"))


def test_pair_context_frames_fields_unambiguously() -> None:
    assert pair_context("ab", "c", 1, "x", "y") != pair_context("a", "bc", 1, "x", "y")


def test_pairwise_seed_refuses_bad_peer_keys() -> None:
    own = X25519PrivateKey.generate()
    with pytest.raises(KeyFormatError):
        pairwise_seed(own, b"\x01" * 31, b"ctx")
    with pytest.raises(CryptoError):
        pairwise_seed(own, bytes(32), b"ctx")  # low-order point: all-zero secret
