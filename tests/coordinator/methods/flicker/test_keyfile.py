"""The coordinator's CKKS key file: 0600, reloaded as the same key, or refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ursa.coordinator.methods.flicker.keyfile import (
    CKKS_KEY_FILENAME,
    load_or_create_key_owner,
)
from ursa.crypto.errors import CryptoError

pytest.importorskip("tenseal")


def test_the_key_is_created_0600_and_a_restart_decrypts_old_ciphertexts(
    tmp_path: Path,
) -> None:
    owner = load_or_create_key_owner(tmp_path)
    counts = np.array([3.0, 140.0, 7.0, 0.0])
    ciphertext = owner.public_context().encrypt(counts)

    again = load_or_create_key_owner(tmp_path)

    path = tmp_path / CKKS_KEY_FILENAME
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert again.key_id == owner.key_id
    assert again.public_context_bytes() == owner.public_context_bytes()
    decrypted = again.decrypt(bytes(ciphertext))[:4]
    np.testing.assert_allclose(decrypted, counts, atol=1e-3)
    context = again.public_context()
    summed = context.add(ciphertext, context.encrypt(counts))
    np.testing.assert_allclose(again.decrypt(summed)[:4], 2 * counts, atol=1e-3)


def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    load_or_create_key_owner(tmp_path)
    (tmp_path / CKKS_KEY_FILENAME).chmod(0o644)

    with pytest.raises(CryptoError, match="chmod 600"):
        load_or_create_key_owner(tmp_path)


def test_a_corrupt_key_file_is_a_crypto_error(tmp_path: Path) -> None:
    path = tmp_path / CKKS_KEY_FILENAME
    path.write_bytes(b'{"version": 1}\nnot a context')
    path.chmod(0o600)

    with pytest.raises(CryptoError):
        load_or_create_key_owner(tmp_path)
