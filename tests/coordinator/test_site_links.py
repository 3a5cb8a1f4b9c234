"""Site bridges' link states: the pure record, and what the service does with them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ursa.coordinator.config import SelectionConfig
from ursa.coordinator.live_status import service_status
from ursa.coordinator.site_links import SiteLink, SiteLinks
from ursa.protocol.topics import bridge_state_topic


def test_a_link_back_up_reports_how_long_it_was_down() -> None:
    links = SiteLinks()

    assert links.update("site-a", True, 10.0) == 0.0  # first seen: up
    assert links.update("site-a", False, 20.0) == 0.0
    assert links.down == ("site-a",)
    assert links.update("site-a", False, 25.0) == 0.0  # a retained repeat
    assert links.update("site-a", True, 32.5) == 12.5
    assert links.down == ()
    assert links.snapshot() == {"site-a": SiteLink(True, 32.5)}


def test_a_link_first_seen_down_counts_from_when_it_was_seen() -> None:
    links = SiteLinks()

    links.update("site-b", False, 3.0)

    assert links.update("site-b", True, 7.0) == 4.0


SILENT = SelectionConfig(explicit_replies_below=0)
"""Silence means no: the volunteering window stays open until its deadline."""


def _window_open_after(fed: Any, outage_s: float) -> bool:
    """Whether volunteering is still open just past its deadline, after an outage."""
    fed.start(settle=False)
    assert fed.volunteering()
    link = bridge_state_topic("site-a")
    fed.raw.publish(link, b"1")
    fed.raw.publish(link, b"0")
    fed.clock.advance(outage_s)
    fed.raw.publish(link, b"1")
    fed.tick(fed.config.deadlines.volunteer_s - outage_s + 1)
    return bool(fed.volunteering()) and fed.coordinator.state.round == 1


def test_a_site_link_outage_gives_the_open_window_its_time_back(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    assert _window_open_after(federation(num_devices=10, selection=SILENT), 5.0)
    assert "site link site-a is down" in caplog.text
    assert "site link site-a is back after 5 s" in caplog.text


def test_without_a_link_outage_the_window_closes_at_its_deadline(
    federation: Any,
) -> None:
    assert not _window_open_after(federation(num_devices=10, selection=SILENT), 0.0)


def test_the_status_shows_each_site_link(federation: Any) -> None:
    fed = federation(num_devices=10, selection=SILENT)
    fed.start(settle=False)
    fed.clock.advance(2)
    fed.raw.publish(bridge_state_topic("site-b"), b"0")

    doc = service_status(fed.coordinator).to_json()

    assert doc["site_links"] == {"site-b": {"up": False, "since": fed.clock()}}


def test_a_malformed_link_state_is_logged_and_ignored(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=10, selection=SILENT)
    fed.start(settle=False)

    fed.raw.publish(bridge_state_topic("site-a"), b"maybe")
    fed.raw.publish("ursa/bridge/bad.name/state", b"1")

    assert fed.coordinator.site_links == {}
    assert fed.volunteering()  # the coordinator is still serving
    assert "bridge site-a: state payload must be 0 or 1" in caplog.text
    assert "invalid site id" in caplog.text
