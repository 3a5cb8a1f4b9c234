"""A smoke run of `ursa bench flicker --json`: every figure present and consistent.

Budgets are not asserted on times (no timing assertions in tests); sizes are
deterministic enough to check, and the bench exits 1 when a budget is missed.
"""

from __future__ import annotations

import json

import pytest

from ursa.bench import flicker as bench
from ursa.tools.cli.app import main

pytest.importorskip("tenseal")

STEP_KEYS = {
    "device_load_context_ms", "device_encrypt_counts_ms", "device_ring_add_ms",
    "device_ring_open_and_seal_ms", "device_masked_cosine_ms",
    "device_count_update_ms", "coordinator_keygen_ms", "coordinator_encrypt_unit_ms",
    "coordinator_decrypt_gd_ms", "coordinator_decrypt_cosine_ms",
    "coordinator_apply_update_ms",
}  # fmt: skip
SIZE_KEYS = {
    "ckks_public_context_bytes", "ckks_ciphertext_bytes", "ring_hop_message_bytes",
    "device_bytes_sent_mean", "device_bytes_sent_max", "device_bytes_received_mean",
    "device_bytes_received_max", "coordinator_bytes_sent", "coordinator_bytes_received",
}  # fmt: skip


def test_bench_flicker_json_has_every_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "flicker", "--json", "--repeats", "1"])
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) >= STEP_KEYS | SIZE_KEYS | {"budgets_met"}
    assert code == (0 if figures["budgets_met"] else 1)
    assert all(figures[k] > 0 for k in STEP_KEYS | SIZE_KEYS)
    assert figures["ckks_public_context_bytes"] <= 500_000
    # a hop is one sealed ciphertext plus a small envelope
    assert (
        0 < figures["ring_hop_message_bytes"] - figures["ckks_ciphertext_bytes"] < 400
    )
    # every device downloads the context at least once
    assert figures["device_bytes_received_max"] >= figures["ckks_public_context_bytes"]
    assert figures["protocol_gi_after"] >= 0.1 or figures["protocol_updates"] > 0


def test_a_missed_budget_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        bench, "BUDGETS", [bench.Budget("ckks_public_context_bytes", at_most=1000)]
    )
    assert bench.run(as_json=True, repeats=1) == 1
    assert json.loads(capsys.readouterr().out)["budgets_met"] is False
