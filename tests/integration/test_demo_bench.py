"""`ursa demo --selection-only` (embedded broker) and `ursa bench protocol`, small."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from ursa.bench.protocol import run as run_protocol_bench
from ursa.tools.demo.selection import DemoSettings, run_selection_demo

pytestmark = pytest.mark.integration


def test_selection_demo_reports_every_round() -> None:
    pytest.importorskip("amqtt")
    out, err = io.StringIO(), io.StringIO()
    settings = DemoSettings(devices=12, k=4, tries=3, rounds=3, key_bits=512)

    result = run_selection_demo(settings, out=out, err=err, as_json=True)

    assert result["completed"]
    assert [r["round"] for r in result["rounds"]] == [1, 2, 3]
    assert all(r["selected"] == 4 for r in result["rounds"])
    printed = json.loads(out.getvalue())
    assert printed["rounds"] == result["rounds"]
    assert "round 3: ||p_o - p_u||_1" in err.getvalue()
    assert result["crypto_ms_per_device_mean"] > 0
    assert result["bytes_sent_per_device"] > 0


def test_protocol_bench_on_mosquitto(mosquitto_binary: Any) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_protocol_bench(
            as_json=True, devices=12, k=4, tries=3, rounds=2, key_bits=512
        )

    figures = json.loads(out.getvalue())
    assert code == 0 and figures["budgets_met"]
    assert figures["rounds_completed"] == 2
    assert figures["messages_sent_per_device_round"] > 0
    assert figures["messages_received_per_device_round"] > 1  # announce, result
    assert figures["selection_round_s_median"] > 0
