"""The devices an operator must look at, read from the store's meta values."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.device_health import DeviceHealth, device_health
from ursa.coordinator.ready_devices import SAT_OUT_KEY, SAT_OUT_WHY_KEY
from ursa.coordinator.training_health import HEALTH_KEY, TrainingHealth


def test_failing_devices_and_this_epochs_sit_outs_with_their_reasons() -> None:
    health = TrainingHealth(sit_out_after=3)
    for round_index in (1, 2):
        health.failed("d2", round_index, "training_failed")
    health.failed("d4", 2, "training_failed")  # once: not failing yet
    meta = {
        HEALTH_KEY: health.to_json(),
        SAT_OUT_KEY: json.dumps({"d1": 3, "d3": 2}),  # d3 sat an older epoch out
        SAT_OUT_WHY_KEY: json.dumps({"d1": "model_mismatch: tensor 'w'", "d3": "x"}),
    }
    assert device_health(meta.get, 3) == DeviceHealth(
        failing={"d2": 2}, sitting_out={"d1": "model_mismatch: tensor 'w'"}
    )


def test_a_sit_out_stored_before_reasons_were_kept_has_none() -> None:
    meta = {SAT_OUT_KEY: json.dumps({"d1": 1})}
    assert device_health(meta.get, 1).sitting_out == {"d1": ""}


@pytest.mark.parametrize("sat_out", ["[1, 2]", "{not json", '{"d1": "x"}'])
def test_malformed_sit_outs_read_as_none(
    sat_out: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert device_health({SAT_OUT_KEY: sat_out}.get, 1) == DeviceHealth()
    assert "stored sit-outs unreadable" in caplog.text


def test_an_empty_store_has_no_trouble() -> None:
    assert device_health({}.get, 0) == DeviceHealth()
