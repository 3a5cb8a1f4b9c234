"""The lab's `FlickerHost`: the production `FlickerMethod` on the runtime's parts.

What reaches the method is refused through the runtime's `Rejections` (a
signed `ErrorReply`), nothing raises; the devices check the coordinator's
signature on the ring start, so a forged member list is refused.
"""

from __future__ import annotations

from typing import TypeVar

import pytest

from ursa.coordinator.methods.flicker.outcome import FlickerPhase
from ursa.crypto.identity import DeviceIdentity
from ursa.lab.simulate.flicker_fleet import FEDERATION, Fleet, build_fleet
from ursa.lab.simulate.flicker_tables import get_table
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import BaseMessage, CosineRequest, ErrorReply, RingStart
from ursa.protocol.topics import CONTROL, down_topic, up_topic

pytest.importorskip("tenseal")

M = TypeVar("M", bound=BaseMessage)
D1 = {f"dev-{i + 1}": row for i, row in enumerate(get_table("D1"))}


def _publish(fleet: Fleet, topic: str, payload: bytes) -> None:
    raw = InMemoryTransport(fleet.bus, "raw")
    raw.connect()
    raw.publish(topic, payload)
    raw.close()


def _heard_by(fleet: Fleet, device: str, kind: type[M]) -> list[M]:
    """Every ``kind`` message on ``device``'s down topics, from now on."""
    seen: list[M] = []

    def keep(topic: str, payload: bytes) -> None:
        message = decode(payload)
        if isinstance(message, kind):
            seen.append(message)

    spy = InMemoryTransport(fleet.bus, "spy")
    spy.set_handler(keep)
    spy.subscribe(f"ursa/v1/{FEDERATION}/dev/{device}/down/#")
    spy.connect()
    return seen


def test_undecodable_and_foreign_messages_are_refused_with_a_signed_reply() -> None:
    with build_fleet(D1) as fleet:
        errors = _heard_by(fleet, "dev-1", ErrorReply)
        foreign = CosineRequest(  # the coordinator's kind: no handler takes it
            federation=FEDERATION,
            round=0,
            sender="dev-1",
            run_id="r",
            step=1,
            ciphertext=b"x",
        )

        _publish(fleet, up_topic(FEDERATION, "dev-1", CONTROL), b"\x93garbage")
        _publish(fleet, up_topic(FEDERATION, "dev-1", CONTROL), encode(foreign))

        codes = [(r.device, r.code) for r in fleet.coordinator.rejections]
        assert codes == [("dev-1", "malformed"), ("dev-1", "unauthorised")]
        assert [e.code for e in errors] == ["malformed", "unauthorised"]
        assert all(e.signature for e in errors)
        assert fleet.coordinator.phase is FlickerPhase.IDLE
        assert fleet.bus.handler_errors == 0


def test_a_device_refuses_a_ring_start_another_key_signed() -> None:
    with build_fleet(D1) as fleet:
        starts = _heard_by(fleet, "dev-2", RingStart)

        def hold_ring_starts(s: str, r: str, t: str, p: bytes) -> bool:
            return r in D1 and decode(p).kind == "ring_start"

        fleet.bus.drop_filter = hold_ring_starts  # the context still arrives
        fleet.coordinator.start(list(D1))
        fleet.bus.drop_filter = None
        (start,) = starts
        mallory = DeviceIdentity.generate("coordinator")
        forged = start.model_copy(
            update={"signature": mallory.sign(signing_bytes(start))}
        )

        _publish(fleet, down_topic(FEDERATION, "dev-2", CONTROL), encode(forged))
        _publish(fleet, down_topic(FEDERATION, "dev-2", CONTROL), encode(start))

        rejected = fleet.participants["dev-2"].rejections
        assert [kind for kind, _ in rejected] == ["ring_start"]
        assert "not signed by the coordinator" in rejected[0][1]
