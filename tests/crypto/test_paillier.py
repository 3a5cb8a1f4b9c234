from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.crypto.encoding import FixedPoint, PackingLayout
from ursa.crypto.errors import (
    CiphertextError,
    CryptoError,
    EncodingError,
    KeyMismatchError,
    SlotOverflowError,
)
from ursa.crypto.paillier import (
    EncryptedVector,
    PaillierPublicKey,
    PaillierSecretKey,
    add_encrypted,
    decrypt_real_sum,
    decrypt_vector,
    encrypt_reals,
    encrypt_vector,
    encrypted_vector_from,
    generate_keypair,
    sum_encrypted,
)

Keys = tuple[PaillierPublicKey, PaillierSecretKey]
HEADER = 23


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)


@pytest.fixture(scope="module")
def other_keys() -> Keys:
    return generate_keypair(512)


def _layout(max_value: int = 1, max_parties: int = 100) -> PackingLayout:
    return PackingLayout(max_value, max_parties, key_bits=512)


def _round_trip(vector: EncryptedVector, public: PaillierPublicKey) -> EncryptedVector:
    return encrypted_vector_from(vector.to_bytes(public), public)


def test_generated_modulus_has_exactly_the_requested_bits(keys: Keys) -> None:
    public, _ = keys

    assert public.key_bits == public.n.bit_length() == 512
    assert public.ciphertext_size() == 128
    assert len(public.fingerprint()) == 8


@pytest.mark.parametrize("key_bits", [256, 513, 520 - 4, 8192])
def test_generate_keypair_rejects_unsupported_sizes(key_bits: int) -> None:
    with pytest.raises(ValueError, match="key_bits"):
        generate_keypair(key_bits)


def test_public_key_bytes_round_trip(keys: Keys) -> None:
    public, _ = keys

    restored = PaillierPublicKey.from_bytes(public.to_bytes())

    assert restored == public
    assert restored.fingerprint() == public.fingerprint()


@pytest.mark.parametrize("cut", [3, 6, -1])
def test_malformed_public_key_bytes_raise(keys: Keys, cut: int) -> None:
    data = keys[0].to_bytes()

    with pytest.raises(CryptoError):
        PaillierPublicKey.from_bytes(data[:cut])
    with pytest.raises(CryptoError):
        PaillierPublicKey.from_bytes(data + b"\x00")


def test_secret_key_bytes_round_trip_decrypts(keys: Keys) -> None:
    public, secret = keys
    ciphertext = public.raw_encrypt(12345)

    restored = PaillierSecretKey.secret_from_bytes(secret.secret_to_bytes())

    assert restored.public_key == public
    assert restored.raw_decrypt(ciphertext) == 12345


def test_secret_from_bytes_rejects_a_foreign_factor(
    keys: Keys, other_keys: Keys
) -> None:
    mine = keys[1].secret_to_bytes()
    theirs = other_keys[1].secret_to_bytes()
    size = 2 + 64  # length-prefixed 512-bit n
    spliced = mine[: 4 + size] + theirs[4 + size :]

    with pytest.raises(CryptoError, match="malformed secret key"):
        PaillierSecretKey.secret_from_bytes(spliced)


def test_secret_from_bytes_rejects_a_composite_factor(keys: Keys) -> None:
    # p * q == n holds, so only the primality check can refuse this key
    p = keys[1]._p
    fake_p, fake_q = 3 * int(p), int(keys[1]._q)
    fields = [fake_p * fake_q, fake_p, fake_q]
    data = b"USK1" + b"".join(
        struct.pack(">H", (x.bit_length() + 7) // 8)
        + x.to_bytes((x.bit_length() + 7) // 8, "big")
        for x in fields
    )

    with pytest.raises(CryptoError, match="not prime"):
        PaillierSecretKey.secret_from_bytes(data)


def test_secret_key_is_never_serialised_implicitly(keys: Keys) -> None:
    _, secret = keys

    with pytest.raises(TypeError, match="secret_to_bytes"):
        pickle.dumps(secret)
    assert str(int(secret._p)) not in repr(secret)


def test_raw_ciphertexts_add_homomorphically(keys: Keys) -> None:
    public, secret = keys
    a, b = public.raw_encrypt(41), public.raw_encrypt(1)

    assert secret.raw_decrypt(a * b % public.nsquare) == 42
    assert a != public.raw_encrypt(41)  # randomised


def test_raw_encrypt_and_decrypt_check_ranges(keys: Keys) -> None:
    public, secret = keys

    with pytest.raises(EncodingError):
        public.raw_encrypt(public.n)
    with pytest.raises(CiphertextError):
        secret.raw_decrypt(0)
    with pytest.raises(CiphertextError):
        secret.raw_decrypt(public.nsquare)


def test_encrypt_vector_decrypts_to_the_plaintext_also_after_bytes(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=9)
    values = [3, 0, 9, 1, 7]

    encrypted = encrypt_vector(public, layout, values)
    restored = _round_trip(encrypted, public)

    assert restored == encrypted
    assert decrypt_vector(secret, layout, encrypted) == values
    assert decrypt_vector(secret, layout, restored) == values
    assert (restored.length, restored.num_parties) == (5, 1)


def test_add_encrypted_matches_plaintext_sum_also_after_bytes(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=9)
    a, b = [1, 2, 3, 9], [9, 0, 5, 9]
    enc_a, enc_b = encrypt_vector(public, layout, a), encrypt_vector(public, layout, b)

    direct = add_encrypted(public, enc_a, enc_b)
    via_bytes = _round_trip(
        add_encrypted(public, _round_trip(enc_a, public), _round_trip(enc_b, public)),
        public,
    )

    expected = [x + y for x, y in zip(a, b, strict=True)]
    assert decrypt_vector(secret, layout, direct) == expected
    assert decrypt_vector(secret, layout, via_bytes) == expected
    assert via_bytes.num_parties == 2


def test_sum_encrypted_streams_and_matches_plaintext(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=1, max_parties=50)
    registries = [[int(i % 3 == k) for k in range(3)] for i in range(30)]

    total = sum_encrypted(
        public, (encrypt_vector(public, layout, r) for r in registries)
    )

    assert decrypt_vector(secret, layout, _round_trip(total, public)) == [10, 10, 10]
    assert total.num_parties == 30


def test_sum_encrypted_rejects_empty_and_mismatched_input(
    keys: Keys, other_keys: Keys
) -> None:
    public, _ = keys
    layout = _layout()
    three = encrypt_vector(public, layout, [1, 0, 0])

    with pytest.raises(ValueError, match="at least one"):
        sum_encrypted(public, [])
    with pytest.raises(ValueError, match="length"):
        sum_encrypted(public, [three, encrypt_vector(public, layout, [1, 0])])
    with pytest.raises(ValueError, match="length"):
        add_encrypted(public, three, encrypt_vector(public, layout, [1, 0]))
    foreign = encrypt_vector(other_keys[0], layout, [1, 0, 0])
    with pytest.raises(KeyMismatchError):
        sum_encrypted(public, [three, foreign])
    with pytest.raises(KeyMismatchError):
        add_encrypted(public, three, foreign)


@settings(max_examples=12, deadline=None)
@given(data=st.data(), max_parties=st.integers(1, 8), length=st.integers(1, 70))
def test_vectors_from_up_to_max_parties_sum_exactly(
    keys: Keys, data: st.DataObject, max_parties: int, length: int
) -> None:
    public, secret = keys
    max_value = data.draw(st.sampled_from([1, 255, 2**16]))
    layout = _layout(max_value, max_parties)
    parties = data.draw(st.integers(1, max_parties))
    vectors = [
        data.draw(st.lists(st.integers(0, max_value), min_size=length, max_size=length))
        for _ in range(parties)
    ]

    total = sum_encrypted(public, (encrypt_vector(public, layout, v) for v in vectors))

    expected = [sum(column) for column in zip(*vectors, strict=True)]
    assert decrypt_vector(secret, layout, _round_trip(total, public)) == expected


def test_multi_ciphertext_vectors_round_trip(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=2**40, max_parties=4)
    length = 3 * layout.slots_per_plaintext + 1
    values = [(i * 7919) % 2**40 for i in range(length)]

    encrypted = encrypt_vector(public, layout, values)
    doubled = add_encrypted(public, encrypted, _round_trip(encrypted, public))

    assert len(encrypted.ciphertexts) == 4
    assert len(encrypted.to_bytes(public)) == HEADER + 4 * public.ciphertext_size()
    assert decrypt_vector(secret, layout, _round_trip(doubled, public)) == [
        2 * v for v in values
    ]


def test_value_above_max_value_is_rejected_before_encryption(keys: Keys) -> None:
    with pytest.raises(EncodingError):
        encrypt_vector(keys[0], _layout(max_value=1), [0, 2])


def test_crafted_slot_overflow_is_detected_on_decrypt(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=1, max_parties=3)  # 3-bit slots
    honest = encrypt_vector(public, layout, [1, 0])
    forged = EncryptedVector(
        public.fingerprint(), 2, 1, (public.raw_encrypt(0 | 3 << layout.slot_bits),)
    )

    with pytest.raises(SlotOverflowError):
        decrypt_vector(secret, layout, add_encrypted(public, honest, forged))


def test_more_parties_than_the_layout_allows_is_rejected(keys: Keys) -> None:
    public, secret = keys
    layout = _layout(max_value=1, max_parties=2)
    one = encrypt_vector(public, layout, [1])

    with pytest.raises(EncodingError, match="num_parties"):
        decrypt_vector(secret, layout, sum_encrypted(public, [one, one, one]))


def test_decrypt_with_the_wrong_secret_key_raises(keys: Keys, other_keys: Keys) -> None:
    layout = _layout()
    encrypted = encrypt_vector(keys[0], layout, [1, 0, 1])

    with pytest.raises(KeyMismatchError):
        decrypt_vector(other_keys[1], layout, encrypted)
    with pytest.raises(KeyMismatchError):
        encrypted.to_bytes(other_keys[0])


def test_bytes_under_another_public_key_raise(keys: Keys, other_keys: Keys) -> None:
    data = encrypt_vector(keys[0], _layout(), [1]).to_bytes(keys[0])

    with pytest.raises(KeyMismatchError):
        encrypted_vector_from(data, other_keys[0])


def _with_ciphertext(data: bytes, value: int, size: int) -> bytes:
    return data[:HEADER] + value.to_bytes(size, "big") + data[HEADER + size :]


def test_malformed_vector_bytes_raise_ciphertext_error(keys: Keys) -> None:
    public, _ = keys
    size = public.ciphertext_size()
    data = encrypt_vector(public, _layout(), [1, 0, 1]).to_bytes(public)
    bad_magic = b"XX" + data[2:]
    zero_length = data[:11] + struct.pack(">I", 0) + data[15:]

    for bad in (
        data[:10],
        data[:-1],
        data + b"\x00",
        bad_magic,
        zero_length,
        _with_ciphertext(data, 0, size),
        _with_ciphertext(data, public.nsquare, size),
        _with_ciphertext(data, public.n, size),  # not coprime with n
    ):
        with pytest.raises(CiphertextError):
            encrypted_vector_from(bad, public)


def test_claimed_party_count_can_be_pinned(keys: Keys) -> None:
    public, _ = keys
    one = encrypt_vector(public, _layout(), [1])
    data = add_encrypted(public, one, one).to_bytes(public)

    with pytest.raises(CiphertextError, match="parties"):
        encrypted_vector_from(data, public, num_parties=1)
    assert encrypted_vector_from(one.to_bytes(public), public, num_parties=1) == one


def test_decrypt_with_a_layout_of_other_width_raises(keys: Keys) -> None:
    public, secret = keys
    narrow = _layout(max_value=1, max_parties=2)
    values = [1] * (narrow.slots_per_plaintext + 1)
    encrypted = encrypt_vector(public, narrow, values)

    with pytest.raises(CiphertextError, match="ciphertexts"):
        decrypt_vector(secret, _layout(max_value=1, max_parties=10**6), encrypted)


def test_layout_wider_than_the_key_is_rejected(keys: Keys) -> None:
    with pytest.raises(EncodingError, match="layout"):
        encrypt_vector(keys[0], PackingLayout(1, 10, key_bits=2048), [1])


def test_signed_reals_sum_within_fixed_point_tolerance(keys: Keys) -> None:
    public, secret = keys
    codec = FixedPoint(bound=5.0)
    rng = np.random.default_rng(1)
    rows = rng.uniform(-5, 5, size=(4, 9))

    total = sum_encrypted(public, (encrypt_reals(public, codec, 4, r) for r in rows))
    decoded = decrypt_real_sum(secret, codec, 4, _round_trip(total, public))

    tolerance = 4 * 2.0**-codec.scale_bits
    assert np.max(np.abs(decoded - rows.sum(axis=0))) <= tolerance


def test_2048_bit_registry_fits_600_bytes() -> None:
    public, secret = generate_keypair(2048)
    layout = PackingLayout(max_value=1, max_parties=100_000, key_bits=2048)
    registry = [0] * 56
    registry[17] = 1

    wire = encrypt_vector(public, layout, registry).to_bytes(public)

    assert public.ciphertext_size() == 512
    assert len(wire) <= 600
    assert decrypt_vector(secret, layout, encrypted_vector_from(wire, public)) == (
        registry
    )
