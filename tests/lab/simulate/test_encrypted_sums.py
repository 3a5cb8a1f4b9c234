from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ursa.crypto import PaillierPublicKey, PaillierSecretKey, generate_keypair
from ursa.lab.simulate import encrypted_sums
from ursa.lab.simulate.encrypted_sums import (
    ENCRYPTED_MAX_CLIENTS,
    EncryptedSums,
    RegistrySumError,
    check_encrypted_size,
    simulate_encrypted,
)
from ursa.lab.simulate.selection import SelectionSimConfig, simulate_selection
from ursa.lab.simulate.selection_sums import plain_registry_sum, plain_try_sums
from ursa.tools.cli.app import main

Keys = tuple[PaillierPublicKey, PaillierSecretKey]

SMALL = SelectionSimConfig(
    num_classes=5,
    num_clients=90,
    k=6,
    rho=5.0,
    emd=1.2,
    tries=(1, 3),
    rounds=6,
    seed=4,
    search_tries=4,
    search_steps=2,
    draws=("paper", "stratified"),
)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)


@pytest.fixture(scope="module")
def encrypted(keys: Keys) -> dict[str, Any]:
    return simulate_encrypted(SMALL, keypair=keys, keep_selections=True)


def test_encrypted_run_makes_the_same_selections(encrypted: dict[str, Any]) -> None:
    plain = simulate_selection(SMALL, keep_selections=True)
    assert set(plain["selections"]) == {
        "dubhe_H1",
        "dubhe_H3",
        "dubhe_stratified_H1",
        "dubhe_stratified_H3",
    }
    for key in (
        "selections",
        "dubhe",
        "dubhe_stratified",
        "sigma",
        "sigma_stratified",
        "volunteers",
        "registry_nonzero",
    ):
        assert encrypted[key] == plain[key], key
    # H=3 must have picked another try than the first in some round
    chosen = plain["selections"]
    assert chosen["dubhe_H3"] != chosen["dubhe_H1"]


def test_crypto_report_counts_every_ciphertext(encrypted: dict[str, Any]) -> None:
    crypto = encrypted["crypto"]
    assert crypto["key_bits"] == 512
    assert set(crypto["phases"]) == {
        "search:paper",
        "rounds:paper",
        "search:stratified",
        "rounds:stratified",
    }
    n, size = SMALL.num_clients, crypto["registry_ciphertext_bytes"]
    assert size == 23 + 128  # header + one 512-bit ciphertext (16 slots)
    rounds = crypto["phases"]["rounds:paper"]
    assert rounds["registry_sums"] == 1 and rounds["registry_encryptions"] == n
    assert rounds["registry_bytes_up"] == n * size == rounds["registry_bytes_down"]
    assert rounds["rounds"] == SMALL.rounds
    assert rounds["try_sums"] == SMALL.rounds * max(SMALL.tries)
    # a member sends once per round however many tries it is in
    assert SMALL.k * SMALL.rounds <= rounds["distribution_encryptions"]
    assert rounds["distribution_encryptions"] <= SMALL.k * SMALL.rounds * 3
    assert (
        rounds["distribution_bytes_up"]
        == rounds["distribution_encryptions"] * crypto["distribution_ciphertext_bytes"]
    )
    search = crypto["phases"]["search:paper"]
    assert search["registry_sums"] == 4  # a 2 x 2 sigma grid
    assert search["rounds"] == 4 and search["try_sums"] == 4 * SMALL.search_tries
    assert crypto["total_bytes"] == sum(
        s["total_bytes"] for s in crypto["phases"].values()
    )
    assert crypto["crypto_s"] > 0


def test_sums_equal_plaintext_at_1024_bits() -> None:
    sums = EncryptedSums(1024)
    rng = np.random.default_rng(2)
    indices = rng.integers(0, 56, size=40)
    assert sums.registry_sum(indices, 56).tolist() == (
        plain_registry_sum(indices, 56).tolist()
    )
    fixed = rng.integers(0, 1 << 20, size=(30, 52))
    sets = np.stack([np.sort(rng.permutation(30)[:7]) for _ in range(6)]).reshape(
        2, 3, 7
    )
    assert sums.try_sums(fixed, sets).tolist() == plain_try_sums(fixed, sets).tolist()
    assert sums.distribution_ciphertext_bytes == 23 + 256 * 2  # 52 x 24-bit slots


def test_a_device_registering_twice_is_caught(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = encrypted_sums.encrypt_vector
    calls = {"n": 0}

    def cheat(pk: Any, layout: Any, values: list[int], **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # the third device claims two categories
            values = [1, *values[1:]]  # slot 0 besides its own slot 5
        return real(pk, layout, values, **kw)

    monkeypatch.setattr(encrypted_sums, "encrypt_vector", cheat)
    with pytest.raises(RegistrySumError, match="sums to 6, not 5"):
        EncryptedSums(keypair=keys).registry_sum(np.array([4, 0, 5, 2, 2]), 8)


def test_bad_inputs_are_refused(keys: Keys) -> None:
    sums = EncryptedSums(keypair=keys)
    with pytest.raises(ValueError, match="slots"):
        sums.registry_sum(np.array([0, 8]), 8)
    fixed = np.zeros((5, 3), dtype=np.int64)
    with pytest.raises(ValueError, match="rounds x tries x K"):
        sums.try_sums(fixed, np.array([[0, 1]]))
    with pytest.raises(ValueError, match="repeats"):
        sums.try_sums(fixed, np.array([[[0, 0]]]))


def test_size_limit() -> None:
    check_encrypted_size(ENCRYPTED_MAX_CLIENTS)
    check_encrypted_size(ENCRYPTED_MAX_CLIENTS + 1, force=True)
    with pytest.raises(ValueError, match="--force"):
        check_encrypted_size(ENCRYPTED_MAX_CLIENTS + 1)


CLI = [
    "simulate", "selection", "--classes", "4", "--clients", "40", "--k", "4",
    "--rho", "4", "--emd", "1.0", "--tries", "1,2", "--rounds", "3", "--seed", "1",
    "--sigma", "0.6,0.2", "--encrypted", "--key-bits", "512",
]  # fmt: skip


def test_cli_encrypted_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["crypto"]["key_bits"] == 512
    assert set(data["crypto"]["phases"]) == {"rounds:paper"}
    assert main(CLI) == 0
    out = capsys.readouterr().out
    assert "crypto: Paillier 512-bit" in out and "rounds:paper" in out


def test_cli_encrypted_sweep_has_its_own_crypto_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*CLI, "--json", "--sweep", "--sweep-rounds", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    sweep_crypto = data["sweep"]["crypto"]
    assert sweep_crypto["key_bits"] == 512
    assert sweep_crypto["phases"]["rounds:paper"]["registry_sums"] == len(
        data["sweep"]["k"]
    )


def test_cli_refuses_large_encrypted_runs(capsys: pytest.CaptureFixture[str]) -> None:
    big = [*CLI, "--clients", str(ENCRYPTED_MAX_CLIENTS + 1)]
    assert main(big) == 2
    assert "--force" in capsys.readouterr().err
