"""A smoke run of `ursa bench crypto --json`: every key present, results consistent.

The budgets are not asserted here (no timing assertions in tests); the bench
itself exits 1 when one is missed.
"""

from __future__ import annotations

import json

import pytest

from ursa.tools.cli.app import main

KEYS = {
    "registry_encrypt_ms", "registry_encrypt_per_slot_ms", "registry_encrypt_speedup",
    "registry_decrypt_ms", "registry_bytes", "registry_bytes_per_slot_way",
    "aggregate_registries_per_s", "online_encrypt_ms", "ckks_public_context_bytes",
    "ckks_encrypt_ms", "ckks_masked_dot_ms", "ckks_dot_abs_error", "budgets_met",
}  # fmt: skip


@pytest.mark.slow
def test_bench_crypto_json_has_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "crypto", "--json", "--repeats", "2"])
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) >= KEYS
    assert code == (0 if figures["budgets_met"] else 1)
    # sizes are deterministic, unlike times
    assert figures["registry_bytes"] <= 600
    assert figures["registry_bytes_per_slot_way"] == 56 * 512
    assert figures["ckks_public_context_bytes"] <= 500_000
    assert figures["ckks_dot_abs_error"] <= 1e-4
