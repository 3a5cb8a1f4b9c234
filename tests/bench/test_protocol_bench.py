"""A small run of `ursa bench protocol`: worker processes of real devices on
one pool loop each, the coordinator as `coordinator serve`, a private
Mosquitto; every round selects (figures present; no timing asserted)."""

from __future__ import annotations

import json

import pytest

from ursa.bench import protocol as bench

pytestmark = pytest.mark.integration

KEYS = {
    "devices",
    "rounds_completed",
    "key_epoch_s",
    "selection_round_s_median",
    "coordinator_cpu_s_per_round",
    "coordinator_inbound_per_round",
    "coordinator_rss_mib",
    "broker_deliveries_per_round",
    "device_processes",
}


def test_a_small_fleet_in_two_processes_completes_every_round(
    mosquitto_binary: object, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.run(
        as_json=True,
        devices=20,
        processes=2,
        k=3,
        tries=2,
        rounds=2,
        key_bits=512,
        timeout_s=240,
    )

    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(figures) >= KEYS
    assert figures["devices"] == 20
    assert figures["device_processes"] == 2
    assert figures["rounds_completed"] == 2
    assert figures["devices_connected_at_end"] == 20
    # 20 devices, under the explicit-replies threshold: each answers each round
    assert figures["explicit_replies"] is True
    assert figures["coordinator_inbound_per_round"] >= 20
    assert figures["broker_deliveries_per_round"] >= 20  # the announce alone
    assert figures["coordinator_rss_mib"] > 0
    assert figures["device_crypto_s"] > 0
