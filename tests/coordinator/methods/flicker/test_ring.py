"""FLICKER's ring over the `Relay` primitive: hop checks, skips, records."""

from __future__ import annotations

import json

import pytest

from ursa.coordinator.methods.flicker.ring import FlickerRing, RingError

ORDER = ("a", "b", "c", "d")


def test_hops_follow_the_order_and_the_last_device_sends_the_result() -> None:
    ring = FlickerRing.start("r1", ORDER, now=0.0, hop_deadline_s=10.0)

    ring.accept_hop("r1", "a", ("a",), 0, "b", 1.0)
    ring.accept_hop("r1", "b", ("a", "b"), 1, "c", 2.0)
    ring.accept_hop("r1", "c", ("a", "b", "c"), 2, "d", 3.0)
    ring.accept_result("r1", "d", ORDER, 4.0)

    assert not ring.relay.is_open
    with pytest.raises(RingError):
        ring.accept_result("r1", "d", ORDER, 5.0)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("r2", "a", ("a",), 0, "b"), "late"),
        (("r1", "b", ("b",), 0, "c"), "late"),
        (("r1", "a", ("a", "b"), 0, "b"), "malformed"),
        (("r1", "a", ("a",), 1, "b"), "malformed"),
        (("r1", "a", ("a",), 0, "c"), "malformed"),
    ],
)
def test_a_misrouted_forged_or_late_hop_is_refused(
    args: tuple[str, str, tuple[str, ...], int, str], code: str
) -> None:
    ring = FlickerRing.start("r1", ORDER, now=0.0, hop_deadline_s=10.0)

    with pytest.raises(RingError) as refused:
        ring.accept_hop(*args, 1.0)
    assert refused.value.code == code


def test_a_silent_holder_is_skipped_and_its_predecessor_reseals() -> None:
    ring = FlickerRing.start("r1", ORDER, now=0.0, hop_deadline_s=10.0)
    ring.accept_hop("r1", "a", ("a",), 0, "b", 1.0)

    assert ring.skip_overdue(5.0) is None
    assert ring.skip_overdue(11.0) == "b"
    ring.accept_hop("r1", "a", ("a",), 0, "c", 12.0)

    assert ring.live == ("a", "c", "d") and ring.silent == ("b",)
    with pytest.raises(RingError, match="only 2 live devices"):
        ring.skip_overdue(100.0)


def test_the_record_survives_json_and_the_ring_goes_on() -> None:
    ring = FlickerRing.start("r1", ORDER, now=0.0, hop_deadline_s=10.0)
    ring.accept_hop("r1", "a", ("a",), 0, "b", 1.0)
    ring.skip_overdue(11.0)

    again = FlickerRing.from_record(json.loads(json.dumps(ring.to_record())))
    again.accept_hop("r1", "a", ("a",), 0, "c", 12.0)

    assert again.silent == ("b",) and again.relay.contributors() == ("a", "c")


def test_a_last_will_skips_the_holder_at_once_and_a_later_member_when_reached() -> None:
    ring = FlickerRing.start("r1", ORDER, now=0.0, hop_deadline_s=10.0)
    ring.accept_hop("r1", "a", ("a",), 0, "b", 1.0)

    assert ring.device_left("a", 2.0) is False  # its counts are in the sum
    assert ring.device_left("b", 2.0) is True  # the holder: a re-seals to c
    ring.accept_hop("r1", "a", ("a",), 0, "c", 3.0)
    assert ring.live == ("a", "c", "d") and ring.silent == ("b",)
    with pytest.raises(RingError, match="only 2 live devices"):
        ring.device_left("d", 4.0)
