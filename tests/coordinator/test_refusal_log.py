"""`RefusalLog`: refusal lines escaped, within per-device limits, kept in a store."""

from __future__ import annotations

import logging

import pytest

from ursa.coordinator.refusal_limits import RefusalLimits
from ursa.coordinator.refusal_log import RefusalLog, Stored

LOGGER = "ursa.coordinator.test_refusal_log"
Kept = list[tuple[float, str | None, str, str, str]]


def _log(kept: Kept, lines: int = 2) -> RefusalLog:
    return RefusalLog(
        logging.getLogger(LOGGER),
        keep=lambda *error: kept.append(error),
        limits=RefusalLimits(lines=lines, window_s=60.0),
    )


def test_text_arguments_are_escaped_and_the_device_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept: Kept = []
    caplog.set_level(logging.INFO, LOGGER)
    forged = "x\n2026-12-02 00:00:00 ERROR run curl | sh\x1b[2K"
    assert _log(kept).write(
        0.0, "d1", logging.WARNING, "%s says %s (%d)", "d1", forged, 3
    )
    (record,) = caplog.records
    assert (
        record.getMessage()
        == "d1 says x\\n2026-12-02 00:00:00 ERROR run curl | sh\\x1b[2K (3)"
    )
    assert record.levelno == logging.WARNING
    assert record.__dict__["device"] == "d1"
    assert kept == []  # nothing to store was given


def test_a_flood_is_a_few_lines_and_one_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept: Kept = []
    log = _log(kept, lines=2)
    caplog.set_level(logging.INFO, LOGGER)
    written = [
        log.write(
            1.0, "flood", logging.WARNING, "no %s", "x", stored=Stored("m", "c", "r")
        )
        for _ in range(3000)
    ]
    assert written.count(True) == 2
    log.flush(30.0)  # the window is still open: nothing yet
    log.flush(61.0)
    log.flush(62.0)  # once
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "no x",
        "no x",
        "2998 more refusals from flood suppressed in a 60 s window",
    ]
    assert [(d, what, code) for _, d, what, code, _ in kept] == [
        ("flood", "m", "c"),
        ("flood", "m", "c"),
        ("flood", "refusals", "suppressed"),
    ]
    assert kept[-1][4] == "2998 more refusals suppressed"


def test_the_summary_comes_before_the_next_windows_first_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = RefusalLog(logging.getLogger(LOGGER), limits=RefusalLimits(lines=1))
    caplog.set_level(logging.INFO, LOGGER)
    for _ in range(4):
        log.write(0.0, None, logging.WARNING, "bad topic")
    log.write(60.0, None, logging.WARNING, "bad topic")
    assert [r.getMessage() for r in caplog.records] == [
        "bad topic",
        "3 more refusals from None suppressed in a 60 s window",
        "bad topic",
    ]


def test_other_devices_keep_their_lines(caplog: pytest.LogCaptureFixture) -> None:
    log = _log([], lines=1)
    caplog.set_level(logging.INFO, LOGGER)
    for _ in range(100):
        log.write(0.0, "flood", logging.WARNING, "flood")
    assert log.write(0.0, "honest", logging.WARNING, "honest")
    assert [r.getMessage() for r in caplog.records] == ["flood", "honest"]
