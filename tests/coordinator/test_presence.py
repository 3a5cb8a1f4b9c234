"""Presence: a last will is a departure, an outage is not."""

from __future__ import annotations

from ursa.coordinator.presence import Presence

FLEET = [f"d{i}" for i in range(6)]


def fleet(**kwargs: float) -> Presence:
    presence = Presence(grace_s=30, burst_window_s=2, **kwargs)
    presence.restore(FLEET)
    return presence


def test_a_single_last_will_applies_at_once() -> None:
    presence = fleet()
    assert presence.left("d1", 10.0)
    assert presence.left("d2", 20.0)  # far apart: two departures, not a burst
    assert presence.online == set(FLEET) - {"d1", "d2"}
    assert not presence.holding and presence.release(100.0) == set()


def test_half_the_fleet_leaving_at_once_is_held_and_applied_after_the_grace() -> None:
    presence = fleet()
    assert presence.left("d0", 10.0)  # alone, it looked like a departure
    assert presence.left("d1", 10.5)
    assert not presence.left("d2", 11.0)  # 3 of 6 within 2 s: an outage

    assert presence.online == set(FLEET)  # the first two are taken back too
    assert presence.held == {"d0", "d1", "d2"}
    assert not presence.left("d3", 12.0)  # more of the outage: held as well
    assert presence.arrived("d0") is False  # back: no longer held
    assert presence.release(40.9) == set()
    assert presence.release(41.0) == {"d1", "d2", "d3"}
    assert presence.online == {"d0", "d4", "d5"}
    assert not presence.holding


def test_departures_wait_while_the_coordinator_is_cut_off_and_a_grace_after() -> None:
    presence = fleet()
    presence.connection_lost(100.0)
    assert not presence.left("d4", 101.0)
    assert presence.release(10_000.0) == set()  # still disconnected
    assert presence.connection_back(160.0) == 60.0
    assert presence.release(189.0) == set()
    assert presence.release(190.0) == {"d4"}


def test_arrivals_report_a_change_once() -> None:
    presence = Presence()
    assert presence.arrived("a") and not presence.arrived("a")
    assert not presence.left("b", 0.0)  # never online


def test_fleet_change_counts_departures_and_joiners_over_the_starting_fleet() -> None:
    from ursa.coordinator.presence import fleet_change

    start = {"a", "b", "c", "d"}
    assert fleet_change(start, start) == 0.0
    assert fleet_change(start, {"a", "b", "c"}) == 0.25
    assert fleet_change(start, {"a", "b", "c", "d", "e", "f"}) == 0.5
    assert fleet_change(start, {"a", "e"}) == 1.0
    assert fleet_change(start, {"a", "b", "c", "d", "e"}, joiners=False) == 0.0
    assert fleet_change(set(), {"a"}) == 1.0 and fleet_change(set(), set()) == 0.0


def test_churn_from_counts_is_the_fleet_change() -> None:
    from ursa.coordinator.presence import churn

    # started with 4, 3 of them online, 6 online in all: 1 left, 3 joined
    assert churn(4, 3, 6) == 1.0
    assert churn(4, 3, 6, joiners=False) == 0.25
    assert churn(0, 0, 1) == 1.0 and churn(0, 0, 0) == 0.0


def test_on_change_hears_every_device_entering_or_leaving() -> None:
    mirror = set(FLEET)

    def changed(device: str, online: bool) -> None:
        (mirror.add if online else mirror.discard)(device)

    presence = Presence(grace_s=30, burst_window_s=2, on_change=changed)
    presence.restore(FLEET)
    presence.left("d0", 10.0)
    presence.left("d1", 10.5)
    presence.left("d2", 11.0)  # a burst: the first two are taken back
    assert mirror == presence.online == set(FLEET)
    presence.arrived("d2")
    presence.release(41.0)
    assert mirror == presence.online == set(FLEET) - {"d0", "d1"}
    presence.arrived("d9")
    assert mirror == presence.online
