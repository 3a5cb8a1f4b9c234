"""Relay: a token along an ordered ring, silent devices skipped."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.relay import Relay
from ursa.protocol.messages import ErrorCode
from ursa.protocol.router import RejectedError

RING = ("d0", "d1", "d2", "d3")


class Turns:
    def __init__(self) -> None:
        self.told: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, holder: str, contributors: tuple[str, ...]) -> None:
        self.told.append((holder, contributors))


def open_ring(turns: Turns, **kw: int) -> Relay:
    return Relay.open("ring/1", RING, now=0.0, hop_timeout_s=5.0, on_turn=turns, **kw)


def reloaded(relay: Relay) -> Relay:
    return Relay.from_record(json.loads(json.dumps(relay.to_record())))


def test_the_token_goes_round_in_order() -> None:
    turns = Turns()
    relay = open_ring(turns)

    assert turns.told == [("d0", ("d0",))]
    assert [relay.offer(d, 1.0) for d in RING] == ["d1", "d2", "d3", None]
    assert relay.status is PhaseStatus.DONE and relay.chain == list(RING)


def test_only_the_holder_may_send() -> None:
    relay = open_ring(Turns())
    with pytest.raises(RejectedError) as info:
        relay.offer("d1", 1.0)
    assert info.value.code == ErrorCode.LATE


def test_a_silent_holder_is_skipped_and_its_predecessor_resends() -> None:
    turns = Turns()
    relay = open_ring(turns)
    relay.offer("d0", 1.0)

    assert relay.poll(5.9, turns) is PhaseStatus.OPEN
    relay.poll(6.0, turns)  # d1 silent

    assert relay.silent == {"d1"} and turns.told[-1] == ("d0", ("d0",))
    assert relay.offer("d0", 7.0) == "d2", "the resend skips d1"
    assert relay.chain == ["d0"]
    assert relay.offer("d2", 8.0) == "d3"
    assert relay.contributors() == ("d0", "d2", "d3")


def test_a_holder_silent_while_resending_loses_its_hop() -> None:
    turns = Turns()
    relay = open_ring(turns)
    relay.offer("d0", 1.0)
    relay.offer("d1", 2.0)
    relay.poll(7.0, turns)  # d2 silent: d1 resends
    relay.poll(12.0, turns)  # d1 silent too: d0 resends

    assert relay.chain == ["d0"] and turns.told[-1] == ("d0", ("d0",))
    assert relay.successor("d0") == "d3"


def test_a_last_will_skips_the_holder_now_and_others_when_reached() -> None:
    turns = Turns()
    relay = open_ring(turns)
    relay.device_left("d2", 0.5, turns)
    relay.device_left("d0", 0.5, turns)

    assert turns.told[-1] == ("d1", ("d1",))
    assert relay.offer("d1", 1.0) == "d3"


def test_too_few_live_devices_fall_back() -> None:
    turns = Turns()
    relay = open_ring(turns, min_live=3)
    relay.device_left("d3", 0.0, turns)
    assert relay.is_open
    relay.poll(5.0, turns)

    assert relay.status is PhaseStatus.FALLBACK and relay.holder is None
    with pytest.raises(RejectedError):
        relay.offer("d1", 6.0)


def test_a_restored_ring_resumes_mid_way() -> None:
    turns = Turns()
    relay = open_ring(turns)
    relay.offer("d0", 1.0)
    relay.device_left("d2", 1.5, turns)

    restored = reloaded(relay)
    restored.restarted(100.0, turns)

    assert restored.to_record() == {**relay.to_record(), "deadline_at": 105.0}
    assert turns.told[-1] == ("d1", ("d0", "d1"))
    assert restored.offer("d1", 101.0) == "d3"
    assert restored.offer("d3", 102.0) is None and restored.chain == ["d0", "d1", "d3"]


def test_a_ring_needs_distinct_devices() -> None:
    with pytest.raises(ValueError):
        Relay.open("r", ("a", "a"), now=0.0, hop_timeout_s=1.0, on_turn=Turns())
