"""Wait: one device's answer with a check, a deadline and a fallback."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.phase import PhaseRecordError, PhaseStatus
from ursa.coordinator.wait import Wait
from ursa.protocol.messages import ErrorCode, MadeVerdict, MeanReport
from ursa.protocol.router import RejectedError


def verdict(sender: str = "agent", best: int = 1) -> MadeVerdict:
    return MadeVerdict(
        federation="fed",
        round=2,
        sender=sender,
        epoch=1,
        model_version=1,
        stop=False,
        best_version=best,
    )


def no_newer(message: MadeVerdict) -> None:
    if message.best_version > 1:
        raise RejectedError(ErrorCode.MALFORMED, "newer")


def reloaded(wait: Wait[MadeVerdict]) -> Wait[MadeVerdict]:
    return Wait.from_record(json.loads(json.dumps(wait.to_record())), MadeVerdict)


def code(wait: Wait[MadeVerdict], message: MadeVerdict) -> str:
    with pytest.raises(RejectedError) as info:
        wait.offer(message.sender, message, no_newer)
    return info.value.code


def test_the_awaited_device_answers_once_after_its_check() -> None:
    wait: Wait[MadeVerdict] = Wait.open("verdict/2", "agent", now=0.0, timeout_s=5.0)

    assert code(wait, verdict(sender="d1")) == ErrorCode.UNAUTHORISED
    assert code(wait, verdict(best=2)) == ErrorCode.MALFORMED
    assert wait.is_open
    wait.offer("agent", verdict(), no_newer)

    assert wait.status is PhaseStatus.DONE
    assert wait.answer is not None and wait.answer.best_version == 1
    assert code(wait, verdict()) == ErrorCode.LATE


def test_the_deadline_falls_back() -> None:
    wait: Wait[MadeVerdict] = Wait.open("verdict/2", "agent", now=0.0, timeout_s=5.0)

    assert wait.poll(4.9) is PhaseStatus.OPEN
    assert wait.poll(5.0) is PhaseStatus.FALLBACK and wait.answer is None
    assert code(wait, verdict()) == ErrorCode.LATE


def test_a_restored_wait_resumes_with_a_fresh_deadline_and_keeps_its_answer() -> None:
    wait: Wait[MadeVerdict] = Wait.open("verdict/2", "agent", now=0.0, timeout_s=5.0)

    restored = reloaded(wait)
    restored.restarted(100.0)
    assert restored.poll(104.0) is PhaseStatus.OPEN
    restored.offer("agent", verdict())

    again = reloaded(restored)
    assert again.status is PhaseStatus.DONE and again.answer == restored.answer
    with pytest.raises(PhaseRecordError):
        Wait.from_record(restored.to_record(), MeanReport)
