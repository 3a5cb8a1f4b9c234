"""The typed router: one owner per kind, parking on NotReadyError, rejections."""

from __future__ import annotations

import pytest

from ursa.protocol.messages import Heartbeat, MeanReport, RoundAnnounce, Volunteer
from ursa.protocol.router import Dispatch, NotReadyError, RejectedError, Router


def _volunteer(round_index: int = 1) -> Volunteer:
    return Volunteer(federation="f", round=round_index, sender="d1", draws=(True,))


def _heartbeat() -> Heartbeat:
    return Heartbeat(federation="f", round=0, sender="d1", seq=1)


def test_dispatch_calls_the_handler_of_the_class() -> None:
    router = Router("test")
    seen: list[Volunteer] = []
    router.register(Volunteer, seen.append, owner="dubhe")
    message = _volunteer()
    assert router.dispatch(message) is Dispatch.HANDLED
    assert seen == [message]
    assert router.dispatch(_heartbeat()) is Dispatch.UNHANDLED
    assert router.handles(Volunteer) and not router.handles(Heartbeat)
    assert router.owner(Volunteer) == "dubhe"


def test_a_second_owner_is_refused_naming_both() -> None:
    router = Router("test")
    router.register(Volunteer, lambda m: None, owner="dubhe")
    with pytest.raises(ValueError, match=r"'dubhe'.*'random'"):
        router.register(Volunteer, lambda m: None, owner="random")


def test_not_ready_parks_the_newest_and_retry_runs_it() -> None:
    router = Router("test")
    ready = False
    seen: list[int] = []

    def on_volunteer(message: Volunteer) -> None:
        if not ready:
            raise NotReadyError
        seen.append(message.round)

    router.register(Volunteer, on_volunteer, owner="dubhe")
    assert router.dispatch(_volunteer(1)) is Dispatch.PARKED
    assert router.dispatch(_volunteer(2)) is Dispatch.PARKED
    assert router.is_parked(Volunteer)
    errors: list[Exception] = []
    assert router.retry_parked(lambda m, e: errors.append(e)) == 0  # still not ready
    assert router.is_parked(Volunteer)
    ready = True
    assert router.retry_parked(lambda m, e: errors.append(e)) == 1
    assert seen == [2] and not errors and not router.is_parked(Volunteer)


def test_rejections_propagate_and_retried_ones_reach_on_error() -> None:
    router = Router("test")
    calls = 0

    def on_volunteer(message: Volunteer) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise NotReadyError
        raise RejectedError("wrong_round", "round 1 not open")

    router.register(Volunteer, on_volunteer, owner="dubhe")
    assert router.dispatch(_volunteer()) is Dispatch.PARKED
    errors: list[Exception] = []
    router.retry_parked(lambda m, e: errors.append(e))
    assert len(errors) == 1 and isinstance(errors[0], RejectedError)
    assert errors[0].code == "wrong_round"
    with pytest.raises(RejectedError):
        router.dispatch(_volunteer())


def test_retry_resolves_chains_across_kinds() -> None:
    """A parked message that becomes ready only after another parked one ran."""
    router = Router("test")
    have_announce = False
    order: list[str] = []

    def on_announce(message: RoundAnnounce) -> None:
        nonlocal have_announce
        have_announce = True
        order.append("announce")

    def on_volunteer(message: Volunteer) -> None:
        if not have_announce:
            raise NotReadyError
        order.append("volunteer")

    router.register(Volunteer, on_volunteer, owner="dubhe")
    router.register(RoundAnnounce, on_announce, owner="dubhe")
    router.dispatch(_volunteer())
    announce = RoundAnnounce(
        federation="f",
        round=1,
        sender="coordinator",
        epoch=1,
        k=1,
        tries=1,
        deadline_s=1.0,
    )
    assert router.dispatch(announce) is Dispatch.HANDLED
    assert router.retry_parked(lambda m, e: None) == 1
    assert order == ["announce", "volunteer"]


def _report(purpose: str) -> MeanReport:
    return MeanReport(
        federation="f",
        round=1,
        sender="d1",
        purpose=purpose,
        epoch=1,
        model="m",
        model_version=0,
        ciphertext=b"c",
    )


def test_a_shared_kind_is_routed_by_purpose_one_owner_each() -> None:
    router = Router("test")
    climb: list[MeanReport] = []
    evaluation: list[MeanReport] = []
    router.register(MeanReport, climb.append, owner="climb", purpose="climb.dual")
    router.register(MeanReport, evaluation.append, owner="eval", purpose="eval.classes")
    assert router.dispatch(_report("climb.dual")) is Dispatch.HANDLED
    assert router.dispatch(_report("eval.classes")) is Dispatch.HANDLED
    assert router.dispatch(_report("made.loss")) is Dispatch.UNHANDLED
    assert [m.purpose for m in climb] == ["climb.dual"]
    assert [m.purpose for m in evaluation] == ["eval.classes"]
    assert router.handles(MeanReport)
    assert router.owner(MeanReport, "eval.classes") == "eval"
    assert router.owner(MeanReport) is None


def test_a_purpose_has_one_owner_and_a_kind_is_not_routed_both_ways() -> None:
    router = Router("test")
    router.register(MeanReport, lambda m: None, owner="climb", purpose="climb.dual")
    with pytest.raises(ValueError, match=r"purpose 'climb\.dual'.*'climb'.*'other'"):
        router.register(MeanReport, lambda m: None, owner="other", purpose="climb.dual")
    with pytest.raises(ValueError, match=r"'climb'.*'whole'"):
        router.register(MeanReport, lambda m: None, owner="whole")
    whole = Router("test")
    whole.register(MeanReport, lambda m: None, owner="whole")
    with pytest.raises(ValueError, match=r"'whole'.*'eval'"):
        whole.register(MeanReport, lambda m: None, owner="eval", purpose="eval.classes")


def test_parked_messages_of_two_purposes_do_not_replace_each_other() -> None:
    router = Router("test")
    ready = False
    seen: list[str] = []

    def handle(message: MeanReport) -> None:
        if not ready:
            raise NotReadyError
        seen.append(message.purpose)

    router.register(MeanReport, handle, owner="a", purpose="a.x")
    router.register(MeanReport, handle, owner="b", purpose="b.x")
    assert router.dispatch(_report("a.x")) is Dispatch.PARKED
    assert router.dispatch(_report("b.x")) is Dispatch.PARKED
    assert router.is_parked(MeanReport)
    ready = True
    assert router.retry_parked(lambda m, e: None) == 2
    assert sorted(seen) == ["a.x", "b.x"]
