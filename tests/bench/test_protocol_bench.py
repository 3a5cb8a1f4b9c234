"""A smoke run of `ursa bench protocol`: built through `ursa.tools.compose`, it
selects every round over a real Mosquitto (figures present; no timing asserted)."""

from __future__ import annotations

import json

import pytest

from ursa.bench import protocol as bench

pytestmark = pytest.mark.integration


def test_a_small_protocol_bench_completes_every_round(
    mosquitto_binary: object, capsys: pytest.CaptureFixture[str]
) -> None:
    bench.run(as_json=True, devices=8, k=3, tries=2, rounds=2, key_bits=512)

    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    values = figures.get("figures", figures)
    assert values["all_rounds_done"] is True
    assert values["rounds_completed"] == 2
    assert values["device_crypto_ms_mean"] > 0
