"""Loopback is a literal: localhost, 127.0.0.0/8, ::1; names are not resolved."""

from __future__ import annotations

import pytest

from ursa.protocol.loopback import is_loopback


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", "127.0.0.1", "127.255.0.9",
             "::1", "[::1]"],
)  # fmt: skip
def test_loopback_literals(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "10.0.0.1", "192.168.1.2", "broker", "localhost.evil",
             "127.0.0.1.nip.io", "", "fe80::1"],
)  # fmt: skip
def test_everything_else_is_not(host: str) -> None:
    assert not is_loopback(host)
