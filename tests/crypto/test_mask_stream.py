"""Mask streams are deterministic per (seed, label); pairwise seeds are symmetric."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ursa.crypto.errors import CryptoError, KeyFormatError
from ursa.crypto.mask_stream import (
    MASK_BLOCK_WORDS,
    PAIR_MASK_LABEL,
    SELF_MASK_LABEL,
    apply_mask,
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


@pytest.mark.parametrize(
    "length", [0, 1, 7, MASK_BLOCK_WORDS, 2 * MASK_BLOCK_WORDS + 5]
)
def test_apply_mask_adds_and_subtracts_the_stream_across_blocks(length: int) -> None:
    seed = bytes(range(32))
    base = np.random.default_rng(1).integers(0, 2**32, size=length, dtype=np.uint32)
    stream = mask_stream(seed, length, PAIR_MASK_LABEL)
    added = base.copy()
    apply_mask(added, seed, PAIR_MASK_LABEL)
    assert np.array_equal(added, base + stream)
    apply_mask(added, seed, PAIR_MASK_LABEL, subtract=True)
    assert np.array_equal(added, base)


def test_stream_is_one_chacha20_keystream_across_blocks() -> None:
    """The reference: HKDF key, zero nonce, one keystream read little-endian."""
    seed, length = b"\x05" * 32, MASK_BLOCK_WORDS + 3
    key = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=None,
        info=b"ursa-secagg-mask-v1|" + SELF_MASK_LABEL,
    ).derive(seed)
    cipher = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    expected = np.frombuffer(cipher.update(bytes(4 * length)), dtype="<u4")
    assert np.array_equal(mask_stream(seed, length, SELF_MASK_LABEL), expected)


def test_apply_mask_refuses_what_it_cannot_write_in_place() -> None:
    with pytest.raises(ValueError):
        apply_mask(np.zeros(4, dtype=np.int64), bytes(32), SELF_MASK_LABEL)
    frozen = np.zeros(4, dtype=np.uint32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        apply_mask(frozen, bytes(32), SELF_MASK_LABEL)
    with pytest.raises(ValueError):
        apply_mask(np.zeros(8, dtype=np.uint32)[::2], bytes(32), SELF_MASK_LABEL)
