"""Whether a host name or address is this machine's loopback.

Plaintext MQTT, and a broker listener without TLS, are acceptable only on
loopback: anywhere else device passwords and every message cross a network
the operator may not control. Only literals count (``localhost``,
127.0.0.0/8, ``::1``): a name is not resolved, since what it resolves to at
config time says nothing about what it resolves to later.
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (brackets allowed)."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
