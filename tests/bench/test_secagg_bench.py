"""A tiny run of `ursa bench secagg`: every key, the exact mean, consistent bytes.

No timing assertion (the bench itself exits 1 when a target is missed). The
sparse-graph setting lowers the degree below K - 1: `sparse_degree` keeps the
complete graph for any K this small, whatever ``sparse_above`` is.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from ursa.bench.secagg import SecaggBenchError, fastest, measure_setting, run
from ursa.tools.cli.app import main

SETTING_KEYS = {
    "kind", "k", "params", "degree", "effective_degree", "threshold",
    "share_threshold", "dropped", "survivors", "vector_bytes", "device_cpu_s",
    "device_cpu_breakdown_s", "plain_device_cpu_s", "device_cpu_overhead_s",
    "coordinator_cpu_s", "coordinator_cpu_breakdown_s", "plain_coordinator_cpu_s",
    "bytes_per_device", "plain_bytes_per_device", "bytes_ratio",
    "messages_per_device", "plain_messages_per_device", "extra_messages_per_device",
    "max_abs_error", "sampled_devices", "wall_s",
}  # fmt: skip
SUMMARY_KEYS = {"kind", "targets", "growth_info", "targets_met", "dropout", "seed"}
PARAMS = 1_000


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _check_setting(s: dict[str, Any], k: int) -> None:
    assert set(s) >= SETTING_KEYS
    assert s["k"] == k and s["params"] == PARAMS
    assert s["survivors"] + s["dropped"] == k
    assert s["survivors"] >= s["threshold"]
    # the decoded secure weighted mean is the plaintext one, up to fixed point
    assert 0.0 <= s["max_abs_error"] < 1e-6
    # a masked vector is the model plus weight and 4 metric slots, as uint32
    assert s["vector_bytes"] == 4 * (PARAMS + 5)
    # bytes: plain carries at least the float32 delta; secure the masked
    # vector plus every secure-aggregation message
    assert s["plain_bytes_per_device"] > 4 * PARAMS
    assert s["bytes_per_device"] > s["vector_bytes"]
    assert s["bytes_per_device"] > s["plain_bytes_per_device"]
    assert s["bytes_ratio"] == pytest.approx(
        s["bytes_per_device"] / s["plain_bytes_per_device"]
    )
    # 1 kB goes inline: one update plain; + setup, keys, roster, shares,
    # bundle, unmask request and unmask shares when secure
    assert s["plain_messages_per_device"] == 1
    assert s["extra_messages_per_device"] == 7
    assert s["device_cpu_s"] == pytest.approx(sum(s["device_cpu_breakdown_s"].values()))
    assert s["device_cpu_overhead_s"] == pytest.approx(
        s["device_cpu_s"] - s["plain_device_cpu_s"]
    )
    assert s["coordinator_cpu_s"] >= 0.0


def test_cli_json_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "secagg", "--k", "4,9", "--params", str(PARAMS), "--json",
         "--dropout", "0.25", "--seed", "3", "--repeats", "2"]
    )  # fmt: skip
    lines = _lines(capsys.readouterr().out)
    assert [line["kind"] for line in lines] == ["setting", "setting", "summary"]
    for line, k in zip(lines[:2], (4, 9), strict=True):
        _check_setting(line, k)
    assert [line["dropped"] for line in lines[:2]] == [1, 2]
    assert [line["repeats"] for line in lines[:2]] == [2, 2]
    summary = lines[2]
    assert set(summary) >= SUMMARY_KEYS
    # K = 8 at 100k params is not run: only the two growth targets apply
    names = [t["name"] for t in summary["targets"]]
    assert names == ["bytes_per_device_growth_1000", "device_cpu_s_growth_1000"]
    for target in summary["targets"]:
        assert target["met"] == (target["value"] <= target["at_most"])
    assert summary["targets_met"] == all(t["met"] for t in summary["targets"])
    assert code == (0 if summary["targets_met"] else 1)
    # per-device bytes grow with K (more ids, peers and boxes), never shrink
    assert lines[1]["bytes_per_device"] > lines[0]["bytes_per_device"]


def test_sparse_graph_round_is_exact() -> None:
    figures = measure_setting(9, PARAMS, dropout=0.1, seed=1, degree=4)
    assert figures["effective_degree"] == 4  # sparse: 4 of 8 others
    assert figures["share_threshold"] == 4  # ceil(2 * (4 + 1) / 3)
    assert figures["dropped"] == 1
    _check_setting({"kind": "setting", **figures}, 9)
    complete = measure_setting(9, PARAMS, dropout=0.1, seed=1)
    assert complete["effective_degree"] == 8
    # fewer neighbours: fewer peers, boxes and shares on the wire
    assert figures["bytes_per_device"] < complete["bytes_per_device"]


def test_table_output_and_targets_at_the_target_setting() -> None:
    out = io.StringIO()
    code = run(ks=[8], params=[100_000], dropout=0.1, as_json=False, out=out)
    text = out.getvalue()
    assert "bytes/dev" in text and "targets_met" in text
    assert "<= 1.15" in text and "<= 0.2" in text
    assert code in (0, 1)


def test_too_many_dropouts_refused() -> None:
    with pytest.raises(SecaggBenchError, match="threshold"):
        measure_setting(4, PARAMS, dropout=0.6, seed=0)


def test_fastest_takes_each_cpu_figure_least_and_keeps_breakdowns_whole() -> None:
    runs = [measure_setting(4, PARAMS, dropout=0.0, seed=2) for _ in range(3)]
    best = fastest(runs)
    assert best["repeats"] == 3
    assert best["device_cpu_s"] == min(r["device_cpu_s"] for r in runs)
    assert best["coordinator_cpu_s"] == min(r["coordinator_cpu_s"] for r in runs)
    assert best["device_cpu_overhead_s"] == pytest.approx(
        best["device_cpu_s"] - best["plain_device_cpu_s"]
    )
    assert best["device_cpu_s"] == pytest.approx(
        sum(best["device_cpu_breakdown_s"].values())
    )
    assert best["bytes_per_device"] == runs[0]["bytes_per_device"]
    with pytest.raises(SecaggBenchError, match="disagree"):
        fastest([runs[0], {**runs[1], "bytes_per_device": 1.0}])
    with pytest.raises(SecaggBenchError):
        fastest([])
