"""Which refusals of the coordinator's identity count; the re-keys they may cause."""

from __future__ import annotations

import json
import logging

import pytest

from ursa.coordinator.config import KeyEpochConfig
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import decode, encode, message_digest, signing_bytes
from ursa.protocol.messages import COORDINATOR, EnrolResult, ErrorCode, ErrorReply
from ursa.protocol.router import RejectedError

DEVICE = DeviceIdentity.generate("d1")
OTHER = DeviceIdentity.generate("d2")


def _acceptance(device: str = "d1", epoch: int = 1) -> EnrolResult:
    return EnrolResult(
        federation="f",
        round=0,
        sender=COORDINATOR,
        device_id=device,
        accepted=True,
        epoch=epoch,
    )


def _refusal(
    named: EnrolResult | None, signer: DeviceIdentity | None = DEVICE, **fields: str
) -> ErrorReply:
    reply = ErrorReply(
        federation="f",
        round=0,
        sender="d1",
        code=ErrorCode.COORDINATOR_IDENTITY_MISMATCH,
        reason="not the pinned one",
        in_reply_to=fields.get("in_reply_to", named.message_id if named else None),
        in_reply_to_digest=fields.get(
            "digest", message_digest(named) if named else None
        ),
    )
    if signer is None:
        return reply
    return reply.model_copy(update={"signature": signer.sign(signing_bytes(reply))})


def _code(refusals: IdentityRefusals, refusal: ErrorReply) -> str:
    with pytest.raises(RejectedError) as caught:
        refusals.check(refusal, DEVICE.public())
    return caught.value.code


def test_a_signed_refusal_of_the_latest_acceptance_counts_once() -> None:
    refusals = IdentityRefusals(KeyEpochConfig())
    acceptance = _acceptance()
    refusals.sent(acceptance)
    wire = decode(encode(acceptance))  # what the device names: the received copy

    refusals.check(_refusal(wire), DEVICE.public())

    assert _code(refusals, _refusal(wire)) == ErrorCode.UNAUTHORISED  # used up


def test_a_refusal_is_rejected_unless_signed_and_naming_the_latest() -> None:
    refusals = IdentityRefusals(KeyEpochConfig())
    older, latest = _acceptance(epoch=1), _acceptance(epoch=2)
    refusals.sent(older)
    refusals.sent(latest)
    altered = latest.model_copy(update={"epoch": 3})

    assert _code(refusals, _refusal(None)) == ErrorCode.UNAUTHORISED
    assert _code(refusals, _refusal(older)) == ErrorCode.UNAUTHORISED
    assert _code(refusals, _refusal(altered)) == ErrorCode.UNAUTHORISED
    assert _code(refusals, _refusal(latest, digest="0" * 64)) == ErrorCode.UNAUTHORISED
    assert _code(refusals, _refusal(latest, signer=None)) == ErrorCode.BAD_SIGNATURE
    assert _code(refusals, _refusal(latest, signer=OTHER)) == ErrorCode.BAD_SIGNATURE
    refusals.check(_refusal(latest), DEVICE.public())  # rejections used nothing up


def test_another_devices_acceptance_names_nothing() -> None:
    refusals = IdentityRefusals(KeyEpochConfig())
    theirs = _acceptance("d2")
    refusals.sent(theirs)
    assert _code(refusals, _refusal(theirs)) == ErrorCode.UNAUTHORISED


def test_re_keys_per_device_are_limited_in_a_sliding_window() -> None:
    refusals = IdentityRefusals(KeyEpochConfig(refusal_rekeys=2, refusal_window_s=100))

    assert refusals.may_rekey("d1", 0.0)
    assert refusals.may_rekey("d1", 10.0)
    assert not refusals.may_rekey("d1", 50.0)  # two in the window already
    assert refusals.may_rekey("d2", 50.0)  # each device has its own
    assert refusals.may_rekey("d1", 100.0)  # the first one left the window
    assert not refusals.may_rekey("d1", 109.0)
    assert refusals.may_rekey("d1", 110.0)


def test_no_re_keys_at_all_with_zero() -> None:
    refusals = IdentityRefusals(KeyEpochConfig(refusal_rekeys=0))
    assert not refusals.may_rekey("d1", 0.0)
    assert json.loads(refusals.to_json()) == {}


def test_re_key_times_survive_a_restart_and_bad_records_are_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = KeyEpochConfig(refusal_rekeys=1, refusal_window_s=100)
    before = IdentityRefusals(config)
    assert before.may_rekey("d1", 5.0)

    after = IdentityRefusals(config)
    after.restore(before.to_json())
    assert not after.may_rekey("d1", 50.0)
    assert after.may_rekey("d1", 105.0)

    for raw in ("[1, 2]", "{not json", '{"d1": ["x"]}', '{"d1": 3}'):
        with caplog.at_level(logging.WARNING, logger="ursa.coordinator"):
            after.restore(raw)
        assert after.may_rekey("d1", 0.0)
        after.restore(None)
    assert "unreadable refusal_rekeys record" in caplog.text
