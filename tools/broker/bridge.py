"""Mosquitto bridges: a site broker per group of devices, bridged to a core broker.

The coordinator and any devices near it use the core broker; devices
elsewhere use their site's broker, whose bridge carries their traffic to the
core over one connection. Directions follow the topic tree
(`ursa.protocol.topics`):

    out (site -> core)  ursa/v1/<fed>/dev/+/up/#       device -> coordinator
    out (site -> core)  ursa/v1/<fed>/dev/+/status     retained online, last will
    in  (core -> site)  ursa/v1/<fed>/dev/<id>/down/#  one line per site device
    in  (core -> site)  ursa/v1/<fed>/global/#         retained notices, rounds

No topic goes both ways, so no message can loop between the brokers. Every
topic is bridged at QoS 1 (a bridge topic's QoS caps the QoS it carries), the
session is persistent (`cleansession false`: the core queues the site's
messages while the link is down) and `try_private true` makes the core treat
the bridge as one, so retained flags are carried over it as published (a
retained global notice stays retained on the site). The down topics are
listed per device, so the core sends a site only its own devices' messages.

On the core, the bridge is an ordinary user whose ACL (`bridge_acl`) lets it
write the up and status topics of the site's devices and read their down
topics and the global subtree, and write its own connection state. The site
section carries the bridge's password, so it goes to its own 0600 file,
`bridge/bridge.conf`, which mosquitto.conf includes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BRIDGE_DIR",
    "BridgeError",
    "SiteBridge",
    "bridge_acl",
    "bridge_section",
    "parse_address",
    "state_topic",
]

#: The site's bridge directory: `bridge.conf` (0600: it holds the bridge's
#: password), included by mosquitto.conf, and the core's CA beside it.
BRIDGE_DIR = "bridge"
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")


class BridgeError(ValueError):
    """A bridge was given a bad name, address or device list."""


@dataclass(frozen=True)
class SiteBridge:
    """A site broker's bridge to the core broker.

    `name` is the connection name, the bridge's username on the core and its
    client id there (the core forces client id = username). `devices` are the
    site's devices: the core sends their down topics over this bridge.
    """

    name: str
    host: str
    port: int
    password: str = field(repr=False)
    devices: tuple[str, ...]
    ca_file: Path | None = None
    """The core's CA certificate: set, the bridge speaks TLS to the core."""
    cert_file: Path | None = None
    """A client certificate, for a core that requires one."""
    key_file: Path | None = None
    keepalive_s: int = 60

    def __post_init__(self) -> None:
        check_name(self.name, "bridge name")
        if not _HOST_RE.fullmatch(self.host):
            raise BridgeError(f"invalid bridge host {self.host!r}")
        if not 0 < self.port < 65536:
            raise BridgeError(f"invalid bridge port {self.port}")
        if not self.password or any(c in self.password for c in "\r\n"):
            raise BridgeError("the bridge needs a one-line, non-empty password")
        if (self.cert_file is None) != (self.key_file is None):
            raise BridgeError("give both the bridge's certificate and its key")
        if self.cert_file is not None and self.ca_file is None:
            raise BridgeError("a bridge client certificate needs the core's CA")
        if not self.devices:
            raise BridgeError("a site bridge needs the site's devices")
        for device in self.devices:
            check_name(device, "device id")
        if self.keepalive_s < 5:
            raise BridgeError("Mosquitto's bridge keepalive is at least 5 s")


def parse_address(address: str) -> tuple[str, int]:
    """Split `HOST:PORT` (the last colon splits, so IPv6 needs no brackets).

    Raises:
        BridgeError: no port, or not a number.
    """
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit():
        raise BridgeError(f"bridge address must be HOST:PORT, got {address!r}")
    return host, int(port)


def check_name(value: str, what: str) -> str:
    """Return `value` if it is a valid user, device or bridge name."""
    if not _NAME_RE.fullmatch(value):
        raise BridgeError(f"invalid {what} {value!r} (allowed: [A-Za-z0-9_-]{{1,64}})")
    return value


def state_topic(name: str) -> str:
    """Where the bridge publishes its connection state: 1 up, 0 down (retained).

    Outside ursa/v1/, so no ursa client mistakes it for protocol traffic; the
    coordinator reads it (`ursa.coordinator.site_links`).
    """
    return f"ursa/bridge/{name}/state"  # name may be "+": the readers' ACL


def bridge_section(
    bridge: SiteBridge,
    *,
    federation: str,
    home: Path,
    max_packet_bytes: int,
) -> str:
    """The site's `connection` section for mosquitto.conf (holds the password).

    Args:
        bridge: the bridge.
        federation: the federation id, or `+` for any.
        home: where the bridge's CA, certificate and key will be installed.
        max_packet_bytes: the largest packet the bridge sends (`max_packet_size`
            of the core: a bigger one would cost the bridge its connection).
    """
    base = f"ursa/v1/{federation}"
    lines = [
        "# Bridge to the core broker, written by `ursa broker mosquitto-config",
        "# --bridge-to`. Holds the bridge's password: keep this file 0600.",
        f"connection {bridge.name}",
        f"address {bridge.host}:{bridge.port}",
        f"remote_clientid {bridge.name}",
        f"remote_username {bridge.name}",
        f"remote_password {bridge.password}",
        "bridge_protocol_version mqttv311",
        "try_private true",
        "cleansession false",
        "start_type automatic",
        f"keepalive_interval {bridge.keepalive_s}",
        f"bridge_max_packet_size {max_packet_bytes}",
        "notifications true",
        f"notification_topic {state_topic(bridge.name)}",
    ]
    if bridge.ca_file is not None:
        lines += [f"bridge_cafile {home / 'ca.crt'}"]
        if bridge.cert_file is not None:
            lines += [
                f"bridge_certfile {home / 'client.crt'}",
                f"bridge_keyfile {home / 'client.key'}",
            ]
        lines += ["bridge_insecure false", "bridge_tls_version tlsv1.2"]
    lines += [
        "# site -> core: what the site's devices publish (each device's own",
        "# subtree only: the site's ACL sees to that).",
        f"topic {base}/dev/+/up/# out 1",
        f"topic {base}/dev/+/status out 1",
        "# core -> site: the global subtree, and each site device's down topics.",
        f"topic {base}/global/# in 1",
    ]
    lines += [f"topic {base}/dev/{d}/down/# in 1" for d in bridge.devices]
    return "\n".join(lines) + "\n"


def bridge_acl(bridges: Mapping[str, Iterable[str]], *, federation: str) -> str:
    """The core's ACL lines for site bridges: `{bridge user: its site's devices}`.

    A bridge may write only its devices' up and status topics, read their
    down topics and the global subtree, and write its connection state.
    """
    base = f"ursa/v1/{federation}"
    lines: list[str] = []
    for name, devices in bridges.items():
        lines += ["", f"# Site bridge {name}: carries its site's devices."]
        lines += [f"user {name}"]
        lines += [f"topic write {state_topic(name)}", f"topic read {base}/global/#"]
        for device in devices:
            lines += [
                f"topic write {base}/dev/{device}/up/#",
                f"topic write {base}/dev/{device}/status",
                f"topic read {base}/dev/{device}/down/#",
            ]
    return "\n".join(lines) + ("\n" if lines else "")
