"""Mosquitto bridge sections (site side) and bridge users' ACLs (core side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ursa.tools.broker.bridge import (
    BridgeError,
    SiteBridge,
    bridge_acl,
    bridge_section,
    parse_address,
    state_topic,
)


def _bridge(**overrides: Any) -> SiteBridge:
    settings: dict[str, Any] = {
        "name": "site-a",
        "host": "core.example",
        "port": 8883,
        "password": "pw-secret",
        "devices": ("d1", "d2"),
    }
    settings.update(overrides)
    return SiteBridge(**settings)


def _section(bridge: SiteBridge, federation: str = "fed") -> list[str]:
    text = bridge_section(
        bridge, federation=federation, home=Path("/etc/b"), max_packet_bytes=4096
    )
    return text.splitlines()


def test_directions_follow_the_topic_tree_at_qos_1() -> None:
    topics = [line for line in _section(_bridge()) if line.startswith("topic ")]
    assert topics == [
        "topic ursa/v1/fed/dev/+/up/# out 1",
        "topic ursa/v1/fed/dev/+/status out 1",
        "topic ursa/v1/fed/global/# in 1",
        "topic ursa/v1/fed/dev/d1/down/# in 1",
        "topic ursa/v1/fed/dev/d2/down/# in 1",
    ]
    assert not any(" both " in t for t in topics)  # nothing can loop


def test_the_session_is_persistent_private_and_names_the_bridge() -> None:
    lines = _section(_bridge())
    for expected in (
        "connection site-a",
        "address core.example:8883",
        "remote_clientid site-a",
        "remote_username site-a",
        "remote_password pw-secret",
        "cleansession false",
        "try_private true",
        "bridge_max_packet_size 4096",
        "notifications true",
        f"notification_topic {state_topic('site-a')}",
    ):
        assert expected in lines
    assert not any(line.startswith("bridge_cafile") for line in lines)


def test_tls_points_at_the_copied_ca_and_client_certificate() -> None:
    lines = _section(
        _bridge(
            ca_file=Path("/x/ca.crt"),
            cert_file=Path("/x/c.crt"),
            key_file=Path("/x/c.key"),
        )
    )
    assert "bridge_cafile /etc/b/ca.crt" in lines
    assert "bridge_certfile /etc/b/client.crt" in lines
    assert "bridge_keyfile /etc/b/client.key" in lines
    assert "bridge_insecure false" in lines


def test_any_federation_is_a_wildcard_level() -> None:
    assert "topic ursa/v1/+/global/# in 1" in _section(_bridge(), federation="+")


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "site/a"},
        {"host": "core example"},
        {"port": 0},
        {"password": ""},
        {"password": "two\nlines"},
        {"devices": ()},
        {"devices": ("d#",)},
        {"cert_file": Path("c.crt")},
        {"ca_file": None, "cert_file": Path("c"), "key_file": Path("k")},
        {"keepalive_s": 1},
    ],
)
def test_bad_bridges_are_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(BridgeError):
        _bridge(**overrides)


def test_the_password_stays_out_of_repr() -> None:
    assert "pw-secret" not in repr(_bridge())


def test_bridge_acl_lets_a_bridge_carry_only_its_sites_devices() -> None:
    text = bridge_acl({"site-a": ["d1"], "site-b": ["d2"]}, federation="fed")
    blocks = text.split("\nuser ")[1:]
    site_a = blocks[0].splitlines()
    assert site_a[0] == "site-a"
    assert site_a[1:] == [
        "topic write ursa/bridge/site-a/state",
        "topic read ursa/v1/fed/global/#",
        "topic write ursa/v1/fed/dev/d1/up/#",
        "topic write ursa/v1/fed/dev/d1/status",
        "topic read ursa/v1/fed/dev/d1/down/#",
        "",
        "# Site bridge site-b: carries its site's devices.",
    ]
    assert "d2" not in blocks[0] and "d2/up/#" in blocks[1]
    assert bridge_acl({}, federation="fed") == ""


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("core.lan:8883", ("core.lan", 8883)),
        ("10.0.0.1:1883", ("10.0.0.1", 1883)),
        ("[::1]:1883", ("::1", 1883)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["core.lan", "core.lan:", ":1883", "a:b"])
def test_parse_address_wants_host_and_port(address: str) -> None:
    with pytest.raises(BridgeError):
        parse_address(address)
