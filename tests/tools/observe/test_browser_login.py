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

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.telemetry import Telemetry
from ursa.tools.observe.access import COOKIE_NAME
from ursa.tools.observe.server import Listen, ObserveServer

pytestmark = pytest.mark.slow

TOKEN = "browser-token-0123456789"
REBOUND = "rebind.test"


def _status() -> ServiceStatus:
    telemetry = Telemetry()
    telemetry.round_completed(1, ("d1",))
    return fixed_status(telemetry)


_ON_FDS_3_AND_4 = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)  # the pipe's ends where Chromium expects them (sh cannot name fds past 9)


class _DevTools:
    """One Chromium, driven over its DevTools pipe (fds 3 and 4)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_chrome, self._send = os.pipe()
        self._recv, from_chrome = os.pipe()
        args = [
            "--headless",
            "--no-sandbox",  # root in CI containers
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        ends = [str(to_chrome), str(from_chrome)]
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ON_FDS_3_AND_4, *ends, binary, *args],
            pass_fds=(to_chrome, from_chrome),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer = b""
        self._next_id = 0

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str = ""
    ) -> dict[str, Any]:
        """Send one command; its result (events in between are dropped).

        Raises:
            RuntimeError: the browser answered with an error.
        """
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method}
        message["params"] = params or {}
        if session:
            message["sessionId"] = session
        os.write(self._send, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(answer["error"].get("message", "error"))
                result: dict[str, Any] = answer.get("result", {})
                return result

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._recv], [], [], 60)
            chunk = os.read(self._recv, 1 << 16) if ready else b""
            if not chunk:
                raise AssertionError("Chromium stopped answering its DevTools pipe")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\0")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError, RuntimeError):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        os.close(self._send)
        os.close(self._recv)


class _Page:
    """One tab of `_DevTools`."""

    def __init__(self, browser: _DevTools) -> None:
        self._browser = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})
        attached = browser.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        self._session: str = attached["sessionId"]

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self._browser.call(method, params, self._session)

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (None while it navigates)."""
        try:
            answer = self.call(
                "Runtime.evaluate", {"expression": expression, "returnByValue": True}
            )
        except RuntimeError:  # the context went with a navigation
            return None
        return answer.get("result", {}).get("value")

    def wait_for(self, expression: str, expected: Any, what: str) -> None:
        _wait(lambda: self.evaluate(expression) == expected, what)


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[_DevTools]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (.ci/setup installs Debian's)")
    devtools = _DevTools(binary, tmp_path / "chromium-profile")
    try:
        yield devtools
    finally:
        devtools.close()


STATE = "document.body ? document.body.dataset.state : null"


def test_chromium_signs_in_with_the_form_and_the_dashboard_reads_by_cookie(
    browser: _DevTools,
) -> None:
    with ObserveServer(_status, Listen("127.0.0.1", 0), token=TOKEN) as view:
        page = _Page(browser)
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
    browser: _DevTools,
) -> None:
    with ObserveServer(_status, Listen("127.0.0.1", 0)) as view:  # no token
        page = _Page(browser)
        page.call("Page.navigate", {"url": f"http://{REBOUND}:{view.port}/"})
        page.wait_for("document.readyState", "complete", "the refusal page")
        assert page.evaluate("document.body.innerText").strip() == "unexpected Host"
        page.call("Page.navigate", {"url": view.url})  # the same port by its IP
        page.wait_for(STATE, "ready", "the dashboard on 127.0.0.1")
