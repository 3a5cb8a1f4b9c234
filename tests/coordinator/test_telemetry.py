from __future__ import annotations

import logging

import pytest

from ursa.coordinator.telemetry import (
    ROUND_DURATION_BUCKETS_S,
    DeviceRounds,
    RecentErrors,
    Telemetry,
)
from ursa.coordinator.training import TrainingRoundReport


class Ticker:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(round_index: int, **metrics: object) -> TrainingRoundReport:
    return TrainingRoundReport(
        round=round_index,
        base_version=round_index - 1,
        version=round_index,
        selected=("d1", "d2", "d3"),
        contributed=("d1", "d2"),
        dropped=("d3",),
        before_training={},
        elapsed_s=1.0,
        metrics=metrics,
    )


def test_counts_messages_by_kind_and_direction_and_refusals_by_reason() -> None:
    telemetry = Telemetry()
    telemetry.received("d1", "hello")
    telemetry.received("d2", "hello")
    telemetry.sent("enrol_result")
    telemetry.rejected("unknown_device")
    telemetry.rejected("rate")
    telemetry.rejected("rate")
    snap = telemetry.snapshot()
    assert snap.messages == {("hello", "in"): 2, ("enrol_result", "out"): 1}
    assert snap.rejected == {"unknown_device": 1, "rate": 2}
    assert set(snap.last_seen) == {"d1", "d2"}


def test_a_round_joins_its_training_record_traffic_and_duration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Ticker()
    traffic = [1000, 5000]
    telemetry = Telemetry(wall=clock, monotonic=clock)
    telemetry.set_traffic(lambda: (traffic[0], traffic[1]))
    telemetry.stage_changed("selecting", 1)
    clock.now += 7.0
    traffic[0] += 2048
    traffic[1] += 4096
    fed = {"version": 0, "parties": 3, "accuracy": 0.25, "per_class": [0.5, 0.0]}
    telemetry.training_round(
        _record(1, accuracy=0.5, per_class_accuracy=[1.0, 0.0], federated_eval=fed)
    )
    telemetry.annotate_round(1, l1_to_uniform=0.4)
    with caplog.at_level(logging.INFO, logger="ursa.coordinator"):
        telemetry.round_completed(1, ("d1", "d2", "d3"))
    (summary,) = telemetry.snapshot().rounds
    assert summary.contributed == 2
    assert summary.elapsed_s == 7.0
    assert (summary.bytes_sent, summary.bytes_received) == (2048, 4096)
    assert summary.per_class_accuracy == (1.0, 0.0)
    assert summary.federated_accuracy == 0.25
    assert summary.to_json()["l1_to_uniform"] == 0.4
    snap = telemetry.snapshot()
    assert snap.updates == 2
    assert snap.accuracy == {"server": 0.5, "federated": 0.25}
    bucket = next(i for i, b in enumerate(ROUND_DURATION_BUCKETS_S) if b >= 7.0)
    assert snap.round_buckets[bucket - 1] == 0
    assert snap.round_buckets[bucket] == 1
    assert snap.round_buckets[-1] == 1
    assert snap.round_duration_sum_s == 7.0
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "round 1 complete: 3 selected, 2 updates, accuracy 0.5000, federated "
        "accuracy 0.2500, 4.0 KiB in, 2.0 KiB out, 7.0 s"
    )


def test_a_record_after_the_completion_and_an_annotation_after_it_still_land() -> None:
    telemetry = Telemetry()
    telemetry.round_completed(4, ("d1",))
    telemetry.training_round(_record(4, accuracy=float("nan")))
    telemetry.annotate_round(4, l1_to_uniform=0.1)
    (summary,) = telemetry.snapshot().rounds
    assert summary.selected == ("d1",)
    assert summary.contributed == 2
    assert summary.accuracy is None  # not finite: not an accuracy
    assert summary.to_json()["l1_to_uniform"] == 0.1
    assert telemetry.snapshot().accuracy == {}


def test_a_round_without_training_logs_selection_only() -> None:
    telemetry = Telemetry()
    telemetry.round_completed(1, ("d2", "d1"))
    (summary,) = telemetry.snapshot().rounds
    assert summary.selected == ("d1", "d2")
    assert summary.contributed is None and summary.elapsed_s is None


def test_recent_errors_keeps_warnings_not_info() -> None:
    telemetry = Telemetry()
    log = logging.getLogger("ursa.coordinator.test_telemetry")
    handler = RecentErrors(telemetry)
    log.addHandler(handler)
    try:
        log.warning("round %d: training deadline passed", 3)
        log.info("fine")
        log.error("bad")
    finally:
        log.removeHandler(handler)
    errors = telemetry.snapshot().errors
    assert [(e.level, e.message) for e in errors] == [
        ("WARNING", "round 3: training deadline passed"),
        ("ERROR", "bad"),
    ]


def test_one_devices_lines_replace_only_its_own() -> None:
    from ursa.coordinator.telemetry import MAX_ERRORS_KEPT, MAX_ERRORS_PER_DEVICE_KEPT

    telemetry = Telemetry()
    telemetry.error("WARNING", "honest trouble", "d01")
    telemetry.error("WARNING", "lost the broker")
    for i in range(3 * MAX_ERRORS_KEPT):
        telemetry.error("WARNING", f"flood {i}", "d00")
    errors = telemetry.snapshot().errors
    assert [e.message for e in errors[:2]] == ["honest trouble", "lost the broker"]
    flood = [e.message for e in errors if e.device == "d00"]
    assert len(flood) == MAX_ERRORS_PER_DEVICE_KEPT
    assert flood[-1] == f"flood {3 * MAX_ERRORS_KEPT - 1}"


def test_recent_errors_are_escaped_and_name_their_device() -> None:
    telemetry = Telemetry()
    log = logging.getLogger("ursa.coordinator.test_telemetry")
    handler = RecentErrors(telemetry)
    log.addHandler(handler)
    try:
        log.warning("refused: %s", "a\nERROR forged\u202e", extra={"device": "d00"})
    finally:
        log.removeHandler(handler)
    (error,) = telemetry.snapshot().errors
    assert error.message == "refused: a\\nERROR forged\\u202e"
    assert error.to_json()["device"] == "d00"


def test_each_device_counts_its_selections_and_how_its_training_ended() -> None:
    telemetry = Telemetry()
    for round_index in (1, 2):
        telemetry.training_round(_record(round_index))  # d3 dropped both times
        telemetry.round_completed(round_index, ("d1", "d2", "d3"))
    telemetry.round_completed(3, ("d1",))  # a selection-only round

    counts = telemetry.snapshot().device_rounds

    assert counts["d1"] == DeviceRounds(selected=3, trained=2, failed=0)
    assert counts["d3"] == DeviceRounds(selected=2, trained=0, failed=2)
