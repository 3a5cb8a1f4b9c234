"""The MQTT topic tree (at most 7 levels), its names, subscriptions and ACLs.

    ursa/v1/<federation>/global/<name>              coordinator -> all
    ursa/v1/<federation>/dev/<device>/up/<name>     device -> coordinator
    ursa/v1/<federation>/dev/<device>/down/<name>   coordinator -> one device
    ursa/v1/<federation>/dev/<device>/status        retained online; will offline

Outside the tree, each Mosquitto bridge of a site broker publishes its link
state on ``ursa/bridge/<site>/state`` (retained ``1``, will ``0``); the
coordinator reads it (`BRIDGE_STATE_FILTER`, `parse_bridge_state`).

Federation and device ids match `[A-Za-z0-9_-]{1,64}` and names
`[a-z][a-z0-9_]{0,31}`, so no `+`, `#`, `/` or `$` can be injected into a
topic. A device publishes only under its own subtree; `device_acl_patterns`
gives the Mosquitto pattern ACL (`%u` = username = device id) that enforces it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

from ursa.protocol.errors import TopicError
from ursa.protocol.messages import (
    CKKS_CONTEXT,
    CONTROL,
    COORDINATOR,
    EPOCH,
    ID_PATTERN,
    MESSAGE_TYPES,
    METRICS,
    MODEL,
    PHASE,
    PUBLIC_KEY,
    REGISTRY,
    ROUND,
    STATUS,
    TRANSFER,
)

ROOT: Final = "ursa"
VERSION_LEVEL: Final = "v1"
GLOBAL: Final = "global"
DEV: Final = "dev"
UP: Final = "up"
DOWN: Final = "down"
BRIDGE: Final = "bridge"
BRIDGE_STATE_FILTER: Final = f"{ROOT}/{BRIDGE}/+/state"
"""Every site bridge's link state (outside ursa/v1/: no protocol traffic)."""

RETAINED_GLOBAL_NAMES = frozenset(
    {STATUS} | {cls.topic for cls in MESSAGE_TYPES.values() if cls.retained}
)
"""Global names published retained (read off the message classes), so a device
that (re)connects catches up; the coordinator's status is retained too."""

__all__ = [
    "BRIDGE_STATE_FILTER",
    "CKKS_CONTEXT",
    "CONTROL",
    "EPOCH",
    "METRICS",
    "MODEL",
    "PHASE",
    "PUBLIC_KEY",
    "REGISTRY",
    "RETAINED_GLOBAL_NAMES",
    "ROUND",
    "STATUS",
    "TRANSFER",
    "Topic",
    "bridge_state_topic",
    "coordinator_subscriptions",
    "device_acl_patterns",
    "device_subscriptions",
    "down_topic",
    "federation_filter",
    "global_topic",
    "name_for",
    "parse_bridge_state",
    "parse_topic",
    "qos_for",
    "shared_subscription",
    "status_topic",
    "up_topic",
]

MAX_LEVELS = 7
_ID_RE = re.compile(ID_PATTERN)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

Scope = Literal["global", "dev"]
Direction = Literal["up", "down"]


@dataclass(frozen=True, slots=True)
class Topic:
    """A parsed ursa topic; `str(topic)` gives the topic string back."""

    federation: str
    scope: Scope
    device: str | None
    direction: Direction | None
    name: str

    def __str__(self) -> str:
        base = f"{ROOT}/{VERSION_LEVEL}/{self.federation}"
        if self.scope == GLOBAL:
            return f"{base}/{GLOBAL}/{self.name}"
        if self.direction is None:
            return f"{base}/{DEV}/{self.device}/{STATUS}"
        return f"{base}/{DEV}/{self.device}/{self.direction}/{self.name}"


def name_for(kind: str) -> str:
    """The topic name a message kind is published under (its class declares it).

    Raises:
        KeyError: not a message kind.
    """
    return MESSAGE_TYPES[kind].topic


def qos_for(name: str) -> Literal[0, 1]:
    """QoS for a topic name: 0 for metrics, 1 for everything else."""
    return 0 if name == METRICS else 1


def global_topic(federation: str, name: str) -> str:
    """`ursa/v1/<federation>/global/<name>`."""
    return f"{_prefix(federation)}/{GLOBAL}/{_check_name(name)}"


def up_topic(federation: str, device: str, name: str) -> str:
    """`ursa/v1/<federation>/dev/<device>/up/<name>` (device to coordinator)."""
    return f"{_device_base(federation, device)}/{UP}/{_check_name(name)}"


def down_topic(federation: str, device: str, name: str) -> str:
    """`ursa/v1/<federation>/dev/<device>/down/<name>` (coordinator to device)."""
    return f"{_device_base(federation, device)}/{DOWN}/{_check_name(name)}"


def status_topic(federation: str, device: str) -> str:
    """`ursa/v1/<federation>/dev/<device>/status` (retained, and the last will)."""
    return f"{_device_base(federation, device)}/{STATUS}"


def bridge_state_topic(site: str) -> str:
    """`ursa/bridge/<site>/state`: a site bridge's link, 1 up, 0 down (retained)."""
    return f"{ROOT}/{BRIDGE}/{_check_id(site, 'site')}/state"


def parse_bridge_state(topic: str, payload: bytes) -> tuple[str, bool] | None:
    """``(site, up)`` for a bridge state message; None for any other topic.

    An empty payload (a cleared retain) reads as down: the link is not known up.

    Raises:
        TopicError: a bridge state topic with a bad site name or payload.
    """
    levels = topic.split("/")
    if len(levels) != 4 or levels[:2] != [ROOT, BRIDGE] or levels[3] != "state":
        return None
    site = _check_id(levels[2], "site")
    if payload not in (b"0", b"1", b""):
        raise TopicError(f"bridge {site}: state payload must be 0 or 1")
    return site, payload == b"1"


def coordinator_subscriptions(federation: str) -> tuple[str, ...]:
    """Filters the coordinator subscribes to: every device's up subtree and status."""
    base = f"{_prefix(federation)}/{DEV}/+"
    return (f"{base}/{UP}/#", f"{base}/{STATUS}")


def device_subscriptions(federation: str, device: str) -> tuple[str, ...]:
    """Filters a device subscribes to: its own down subtree and the global one."""
    return (
        f"{_device_base(federation, device)}/{DOWN}/#",
        f"{_prefix(federation)}/{GLOBAL}/#",
    )


def shared_subscription(topic_filter: str, group: str) -> str:
    """An MQTT 5 shared subscription `$share/<group>/<filter>` for worker pools."""
    return f"$share/{_check_id(group, 'group')}/{topic_filter}"


def federation_filter(federation: str) -> str:
    """`ursa/v1/<federation>/#`: everything in one federation (coordinator ACL)."""
    return f"{_prefix(federation)}/#"


def device_acl_patterns(federation: str) -> tuple[str, ...]:
    """Mosquitto `pattern` ACL lines confining each device (`%u`) to its subtree."""
    base = f"{_prefix(federation)}/{DEV}/%u"
    return (
        f"pattern write {base}/{UP}/#",
        f"pattern readwrite {base}/{STATUS}",
        f"pattern read {base}/{DOWN}/#",
        f"pattern read {_prefix(federation)}/{GLOBAL}/#",
    )


def parse_topic(topic: str) -> Topic:
    """Parse a concrete topic string (no wildcards) back into its parts.

    Raises:
        TopicError: not an ursa v1 topic, too many levels, or an invalid part.
    """
    levels = topic.split("/")
    if len(levels) > MAX_LEVELS or len(levels) < 5:
        raise TopicError(f"topic has {len(levels)} levels, expected 5 to {MAX_LEVELS}")
    if levels[0] != ROOT or levels[1] != VERSION_LEVEL:
        raise TopicError(f"topic is not under {ROOT}/{VERSION_LEVEL}/")
    federation = _check_id(levels[2], "federation")
    rest = levels[3:]
    if rest[0] == GLOBAL and len(rest) == 2:
        return Topic(federation, GLOBAL, None, None, _check_name(rest[1]))
    if rest[0] == DEV and len(rest) == 3 and rest[2] == STATUS:
        return Topic(federation, DEV, _check_device(rest[1]), None, STATUS)
    if rest[0] == DEV and len(rest) == 4 and rest[2] in (UP, DOWN):
        direction: Direction = UP if rest[2] == UP else DOWN
        device = _check_device(rest[1])
        return Topic(federation, DEV, device, direction, _check_name(rest[3]))
    raise TopicError("topic does not match global/<name>, dev/<id>/(up|down)/<name>")


def _prefix(federation: str) -> str:
    return f"{ROOT}/{VERSION_LEVEL}/{_check_id(federation, 'federation')}"


def _device_base(federation: str, device: str) -> str:
    return f"{_prefix(federation)}/{DEV}/{_check_device(device)}"


def _check_id(value: str, what: str) -> str:
    if not _ID_RE.fullmatch(value):
        raise TopicError(f"invalid {what} id (allowed: {ID_PATTERN})")
    return value


def _check_device(value: str) -> str:
    _check_id(value, "device")
    if value == COORDINATOR:
        raise TopicError(f"{COORDINATOR!r} is reserved and has no device subtree")
    return value


def _check_name(value: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise TopicError(f"invalid topic name (allowed: {_NAME_RE.pattern})")
    return value
