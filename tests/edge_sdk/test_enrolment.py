"""A refused enrolment: the device names its fingerprint and remedy, then retries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.enrolment import REFUSED_RETRY_MAX_S, REFUSED_RETRY_S, Enrolment
from ursa.edge_sdk.membership import RunMembership
from ursa.protocol.messages import COORDINATOR, EnrolResult, ErrorReply
from ursa.protocol.outbox import Outbox

REASON = "device id is not on the enrolment list"


def _enrolment(tmp_path: Path, jitter: float) -> tuple[Enrolment, DeviceLink, Outbox]:
    config = DeviceConfig(device_id="d0", federation="f", state_dir=tmp_path / "d0")
    outbox = Outbox("d0")
    membership = RunMembership(device_id="d0", say_hello=lambda: None)
    link = DeviceLink(config, outbox, membership)
    link.open()
    enrolment = Enrolment(
        link=link, membership=membership, forget_run=lambda: None, jitter=lambda: jitter
    )
    return enrolment, link, outbox


def _refusal() -> EnrolResult:
    return EnrolResult(
        federation="f",
        round=0,
        sender=COORDINATOR,
        device_id="d0",
        accepted=False,
        reason=REASON,
    )


def test_a_refusal_names_the_fingerprint_and_the_enrol_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    enrolment, link, _ = _enrolment(tmp_path, 1.0)
    caplog.set_level(logging.INFO, logger="ursa.edge_sdk")
    enrolment.say_hello()
    enrolment.on_enrol_result(_refusal())
    enrolment.on_enrol_result(_refusal())

    fingerprint = link.identity.public().fingerprint()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per reason; the repeats are INFO
    assert REASON in errors[0] and f"fingerprint is {fingerprint}" in errors[0]
    assert (
        "ursa coordinator enrol --config <coordinator config> --device d0 "
        f"--fingerprint {fingerprint}"
    ) in errors[0]
    assert not enrolment.enrolled.is_set()


@pytest.mark.parametrize("jitter", [0.5, 1.0])
def test_a_refused_device_says_hello_again_with_bounded_backoff(
    tmp_path: Path, jitter: float
) -> None:
    enrolment, _, outbox = _enrolment(tmp_path, jitter)
    enrolment.say_hello()
    now, waits = 1000.0, []
    for _ in range(10):
        enrolment.on_enrol_result(_refusal())
        sent = len(outbox)
        enrolment.retry_hello(now)  # schedules the next hello
        start = now
        while len(outbox) == sent:
            now += 0.25
            enrolment.retry_hello(now)
        waits.append(now - start)
    expected = [
        min(REFUSED_RETRY_S * 2**i, REFUSED_RETRY_MAX_S) * jitter for i in range(10)
    ]
    assert waits == pytest.approx(expected, abs=0.25)
    assert max(waits) <= REFUSED_RETRY_MAX_S


@pytest.mark.parametrize(
    ("code", "level"),
    [
        ("late", logging.INFO),  # a reply after its window: a race
        ("wrong_run", logging.INFO),  # a run gone by: the Hello below mends it
        ("unknown_device", logging.INFO),  # a status before the Hello
        ("bad_signature", logging.WARNING),  # a real problem
    ],
)
def test_an_error_reply_of_an_expected_race_is_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: str, level: int
) -> None:
    enrolment, _, _ = _enrolment(tmp_path, 1.0)
    caplog.set_level(logging.INFO, logger="ursa.edge_sdk")
    reply = ErrorReply(
        federation="f", round=3, sender=COORDINATOR, code=code, reason="r"
    )
    enrolment.on_error(reply)
    (record,) = [r for r in caplog.records if "coordinator refused" in r.message]
    assert record.levelno == level
