"""`ursa bench store`: counts per message in each commit mode (no timing checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ursa.bench.store import MODES, measure, run
from ursa.coordinator.store_batches import CommitPolicy

LONG = CommitPolicy(interval_s=3600.0, max_records=10_000)


def test_every_commits_each_message_and_batched_once_per_batch(tmp_path: Path) -> None:
    every = measure("every", "volunteer", 40, tmp_path)
    batched = measure("batched", "volunteer", 40, tmp_path, batched_policy=LONG)
    assert every.commits == 1.0
    assert batched.commits == 1 / 40  # the one flush at the end
    # a volunteer's record is its de-duplication: no seen row when batched
    assert batched.statements < every.statements


def test_a_batch_of_max_records_commits_at_that_count(tmp_path: Path) -> None:
    policy = CommitPolicy(interval_s=3600.0, max_records=10)
    result = measure("batched", "heartbeat", 50, tmp_path, batched_policy=policy)
    assert result.commits == 5 / 50


def test_json_names_each_kind_and_mode(capsys: pytest.CaptureFixture[str]) -> None:
    run(as_json=True, messages=30)
    data = json.loads(capsys.readouterr().out)
    for kind in ("volunteer", "heartbeat"):
        for mode in MODES:
            assert f"{kind}_{mode}_us_per_message" in data
            assert f"{kind}_{mode}_commits_per_message" in data
        assert f"{kind}_batched_speedup" in data
