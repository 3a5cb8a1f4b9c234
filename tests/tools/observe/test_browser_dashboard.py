"""Headless Chromium reads the dashboard of a finished federation and of a demo's start.

A finished federation (stage done, its broker link closed after a clean
finish) must look finished, not failed: its completed rounds and enrolled
devices, a broker dot that is not red, each device's selected / trained /
failed rounds, the ||p_o - p_u||_1 values a harness added (lower is better),
a crypto card that says whose time it shows, and round tick values. A
device failing its rounds or sitting the key epoch out stands out in the
devices table (its reason on hover) and in the failing / sitting out card.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.tools.observe.chromium import STATE, DevTools, Page
from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.device_health import DeviceHealth
from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.telemetry import Telemetry
from ursa.coordinator.training import TrainingRoundReport
from ursa.tools.observe.server import Listen, ObserveServer

pytestmark = pytest.mark.slow

L1 = (0.52, 0.31, 0.44)


def _finished() -> ServiceStatus:
    """Three rounds done, d3 selected in each and never trained; the link closed."""
    telemetry = Telemetry()
    telemetry.add_round_figures("l1_to_uniform")
    for index, l1 in enumerate(L1, start=1):
        telemetry.stage_changed("selecting", index)
        telemetry.annotate_round(index, l1_to_uniform=l1)
        record = TrainingRoundReport(
            round=index,
            base_version=index - 1,
            version=index,
            selected=("d1", "d3"),
            contributed=("d1",),
            dropped=(),
            before_training={},
            elapsed_s=1.0,
            metrics={"accuracy": 0.5 + index / 10},
            failed=("d3",),
        )
        telemetry.training_round(record)
        telemetry.round_completed(index, record.selected)
    status = fixed_status(telemetry, round_index=4)
    return dataclasses.replace(
        status, stage="done", round=3, rounds_total=3, connected=False
    )


def _text(page: Page, element: str) -> Any:
    return page.evaluate(f"document.getElementById({json.dumps(element)}).textContent")


def _column(page: Page, index: int) -> Any:
    return page.evaluate(
        "Array.from(document.querySelectorAll('#devices-table tbody tr'))"
        f".map(function (r) {{ return r.cells[{index}].textContent; }})"
    )


def test_a_finished_federation_looks_finished_with_its_figures(
    browser: DevTools,
) -> None:
    with ObserveServer(_finished, Listen("127.0.0.1", 0)) as view:
        page = Page(browser)
        page.call("Page.navigate", {"url": view.url})
        page.wait_for(STATE, "ready", "the dashboard drawn from /api/status")

        assert page.evaluate("document.getElementById('link').className") == (
            "dot closed"
        )  # grey, not the red of a lost broker
        assert "finished: 3 completed" in _text(page, "round-sub")
        assert _text(page, "devices") == "2 / 3"
        assert page.evaluate(
            "document.getElementById('chart-l1').dataset.points"
        ) == str(len(L1))
        assert page.evaluate(
            "document.getElementById('empty-l1').classList.contains('hidden')"
        )
        assert "lower is better" in page.evaluate(
            "document.getElementById('chart-l1').parentNode.textContent"
        )
        assert "coordinator's process only" in _text(page, "crypto-sub")
        headers = page.evaluate(
            "Array.from(document.querySelectorAll('#devices-table th'))"
            ".map(function (h) { return h.textContent; })"
        )
        assert headers[3:] == ["selected", "trained", "failed"]
        assert _column(page, 0) == ["d1", "d2", "d3"]
        assert _column(page, 3) == ["3", "0", "3"]  # selected
        assert _column(page, 4) == ["3", "0", "0"]  # trained
        assert _column(page, 5) == ["0", "0", "3"]  # failed
        accuracy_ticks = page.evaluate(
            "document.getElementById('chart-accuracy').dataset.yticks"
        )
        assert accuracy_ticks == "0.0,0.2,0.4,0.6,0.8,1.0"
        l1_ticks = page.evaluate("document.getElementById('chart-l1').dataset.yticks")
        assert l1_ticks == "0.0,0.2,0.4,0.6"  # not 0.13, 0.26, 0.39
        rounds = page.evaluate("document.getElementById('chart-l1').dataset.xticks")
        assert rounds == "1,2,3"  # whole rounds only


def test_before_round_one_the_demo_says_the_figure_comes_with_the_rounds(
    browser: DevTools,
) -> None:
    telemetry = Telemetry()
    telemetry.add_round_figures("l1_to_uniform")
    starting = fixed_status(telemetry, round_index=1)
    with ObserveServer(lambda: starting, Listen("127.0.0.1", 0)) as view:
        page = Page(browser)
        page.call("Page.navigate", {"url": view.url})
        page.wait_for(STATE, "ready", "the dashboard drawn from /api/status")

        said = _text(page, "empty-l1")
        assert "Not known here" not in said and "when a round completes" in said
        assert page.evaluate("document.getElementById('link').className") == "dot up"


def test_failing_and_sitting_out_devices_stand_out_with_their_reason(
    browser: DevTools,
) -> None:
    why = "model_mismatch: tensor 'fc.weight': shape (3, 8) here, (10, 8) there"
    health = DeviceHealth(failing={"d3": 2}, sitting_out={"d1": why})
    troubled = dataclasses.replace(fixed_status(), health=health)
    with ObserveServer(lambda: troubled, Listen("127.0.0.1", 0)) as view:
        page = Page(browser)
        page.call("Page.navigate", {"url": view.url})
        page.wait_for(STATE, "ready", "the dashboard drawn from /api/status")

        assert _text(page, "trouble") == "1 / 1"
        assert "trouble" in page.evaluate(
            "document.getElementById('trouble').className"
        )
        assert _column(page, 1) == [
            "online, sitting out",
            "online",
            "offline, failing",
        ]
        health_of = page.evaluate(
            "Array.from(document.querySelectorAll('#devices-table tbody tr'))"
            ".map(function (r) { return r.cells[1].dataset.health; })"
        )
        assert health_of == ["sitting-out", "ok", "failing"]
        titles = page.evaluate(
            "Array.from(document.querySelectorAll('#devices-table tbody tr'))"
            ".map(function (r) { return r.cells[1].title; })"
        )
        assert titles == [
            f"sits the key epoch out: {why}",
            "",
            "failed 2 selected rounds in a row",
        ]


def test_a_healthy_fleet_shows_no_trouble(browser: DevTools) -> None:
    with ObserveServer(fixed_status, Listen("127.0.0.1", 0)) as view:
        page = Page(browser)
        page.call("Page.navigate", {"url": view.url})
        page.wait_for(STATE, "ready", "the dashboard drawn from /api/status")

        assert _text(page, "trouble") == "0 / 0"
        assert page.evaluate("document.getElementById('trouble').className") == (
            "value"
        )
        assert _column(page, 1) == ["online", "online", "offline"]
