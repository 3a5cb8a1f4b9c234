"""What an operator reads at INFO: stage changes, one line per round, devices."""

from __future__ import annotations

import logging
from typing import Any

import pytest


def test_info_log_has_stage_changes_one_line_per_round_and_device_progress(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ursa")
    fed = federation(num_devices=4, k=2, tries=2, rounds=2)
    fed.start()

    coordinator = [
        r.getMessage() for r in caplog.records if r.name == "ursa.coordinator"
    ]
    assert "stage enrolment -> key_epoch (epoch 1, round 0)" in coordinator
    assert "stage registration -> selecting (epoch 1, round 1)" in coordinator
    for index in (1, 2):
        (line,) = [m for m in coordinator if m.startswith(f"round {index} complete")]
        assert line.startswith(f"round {index} complete: 2 selected, ")
        assert " in, " in line and " out, " in line
    devices = [r.getMessage() for r in caplog.records if r.name == "ursa.edge_sdk"]
    for d in fed.device_ids:  # "d00: enrolled (run ...)"
        assert any(m.startswith(f"{d}: enrolled") for m in devices), d
    selected = [m for m in devices if ": selected in round " in m]
    assert len(selected) == 2 * 2  # K devices in each of the two rounds
