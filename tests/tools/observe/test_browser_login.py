"""Headless Chromium signs in to the dashboard, and a rebinding name is refused.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-
pipe``: JSON messages ending in NUL on fds 3 and 4), so the test needs no
WebSocket client. It types the token into the login form as an operator
would, follows the redirect, and checks that the dashboard renders from
``/api/status`` with only the HttpOnly cookie, that the token is in no URL,
page or script-visible cookie, and that a name mapped to 127.0.0.1 (what a
DNS-rebinding page makes the browser do) gets 421.
"""

from __future__ import annotations

import pytest

from tests.tools.observe.chromium import REBOUND, STATE, DevTools, Page
from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.telemetry import Telemetry
from ursa.tools.observe.access import COOKIE_NAME
from ursa.tools.observe.server import Listen, ObserveServer

pytestmark = pytest.mark.slow

TOKEN = "browser-token-0123456789"


def _status() -> ServiceStatus:
    telemetry = Telemetry()
    telemetry.round_completed(1, ("d1",))
    return fixed_status(telemetry)


def test_chromium_signs_in_with_the_form_and_the_dashboard_reads_by_cookie(
    browser: DevTools,
) -> None:
    with ObserveServer(_status, Listen("127.0.0.1", 0), token=TOKEN) as view:
        page = Page(browser)
        page.call("Page.navigate", {"url": view.url})
        page.wait_for(STATE, "login", "the login page")

        def sign_in(token: str) -> None:
            page.evaluate("document.getElementById('token').focus()")
            page.call("Input.insertText", {"text": token})
            page.evaluate("document.getElementById('login').requestSubmit()")

        sign_in("not-the-token")
        page.wait_for(
            "document.querySelector('.login-error') !== null", True, "the refusal"
        )
        sign_in(TOKEN)
        page.wait_for(STATE, "ready", "the dashboard drawn from /api/status")

        assert page.evaluate("location.href") == view.url  # no token, no query
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script sees it
        assert page.evaluate("document.body.dataset.rounds") == "1"
        html = page.evaluate("document.documentElement.outerHTML")
        assert "<td>d1</td>" in html and TOKEN not in html
        (cookie,) = browser.call("Storage.getCookies")["cookies"]
        assert cookie["name"] == COOKIE_NAME and cookie["value"] != TOKEN
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/" and not cookie["secure"]  # plain HTTP here


def test_chromium_on_a_rebound_name_gets_421_and_no_status(
    browser: DevTools,
) -> None:
    with ObserveServer(_status, Listen("127.0.0.1", 0)) as view:  # no token
        page = Page(browser)
        page.call("Page.navigate", {"url": f"http://{REBOUND}:{view.port}/"})
        page.wait_for("document.readyState", "complete", "the refusal page")
        assert page.evaluate("document.body.innerText").strip() == "unexpected Host"
        page.call("Page.navigate", {"url": view.url})  # the same port by its IP
        page.wait_for(STATE, "ready", "the dashboard on 127.0.0.1")
