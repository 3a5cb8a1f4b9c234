"""`ursa bench privacy`: a tiny run, plain beside secure with and without DP."""

from __future__ import annotations

import io
import json
import math

import pytest

from ursa.bench.privacy import run

pytest.importorskip("torch")


def test_a_tiny_run_compares_secure_sums_with_plain_and_spends_privacy() -> None:
    out = io.StringIO()
    code = run(
        noise=(0.0, 1.0),
        seed=3,
        rounds=2,
        devices=6,
        k=3,
        tries=2,
        key_bits=512,
        as_json=True,
        out=out,
    )

    assert code == 0
    result = json.loads(out.getvalue())
    plain, secure, noised = result["runs"]
    assert [r["run"] for r in result["runs"]] == [
        "plain",
        "secure z=0.0",
        "secure z=1.0",
    ]
    assert all(r["rounds_completed"] == 2 for r in result["runs"])
    assert plain["epsilon"] is None and secure["epsilon"] is None
    # the same seed, the same selections: only the rounding differs
    assert secure["max_abs_model_difference"] < 1e-3
    assert secure["accuracy_minus_plain"] == pytest.approx(0.0, abs=0.02)
    assert math.isfinite(noised["epsilon"]) and noised["epsilon"] > 0
    assert noised["max_abs_model_difference"] > secure["max_abs_model_difference"]
    for row in result["runs"]:
        assert 0.0 <= row["attack_top1_recovery"] <= 1.0
