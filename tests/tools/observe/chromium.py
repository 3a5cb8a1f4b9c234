"""Headless Chromium driven over its DevTools pipe, for the HTTP view's browser tests.

Chromium runs with ``--remote-debugging-pipe`` (JSON messages ending in NUL
on fds 3 and 4), so no WebSocket client is needed; the ``browser`` fixture
(``conftest.py``) starts one, or skips where Chromium is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REBOUND = "rebind.test"
"""A name the browser resolves to 127.0.0.1 (what a DNS-rebinding page does)."""
STATE = "document.body ? document.body.dataset.state : null"
"""The dashboard's ``data-state``: loading, ready, error (or login)."""


_ON_FDS_3_AND_4 = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)  # the pipe's ends where Chromium expects them (sh cannot name fds past 9)


class DevTools:
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


class Page:
    """One tab of `DevTools`."""

    def __init__(self, browser: DevTools) -> None:
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
        wait(lambda: self.evaluate(expression) == expected, what)


def wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")
