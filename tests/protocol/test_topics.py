from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.protocol import topics as t
from ursa.protocol.errors import ProtocolError, TopicError
from ursa.protocol.messages import MESSAGE_TYPES

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
ids = st.text(alphabet=ID_CHARS, min_size=1, max_size=64).filter(
    lambda s: s != "coordinator"
)


def test_topic_strings_follow_the_tree() -> None:
    assert t.global_topic("fed", "round") == "ursa/v1/fed/global/round"
    assert t.up_topic("fed", "dev-1", "control") == "ursa/v1/fed/dev/dev-1/up/control"
    assert t.down_topic("fed", "d", "transfer") == "ursa/v1/fed/dev/d/down/transfer"
    assert t.status_topic("fed", "dev_1") == "ursa/v1/fed/dev/dev_1/status"


@pytest.mark.parametrize(
    ("topic", "parsed"),
    [
        ("ursa/v1/fed/global/round", t.Topic("fed", "global", None, None, "round")),
        ("ursa/v1/f/dev/d/up/control", t.Topic("f", "dev", "d", "up", "control")),
        ("ursa/v1/f/dev/d/down/transfer", t.Topic("f", "dev", "d", "down", "transfer")),
        ("ursa/v1/f/dev/d/status", t.Topic("f", "dev", "d", None, "status")),
    ],
)
def test_parse_topic_returns_its_parts_and_str_rebuilds_it(
    topic: str, parsed: t.Topic
) -> None:
    assert t.parse_topic(topic) == parsed
    assert str(parsed) == topic


def test_longest_topic_has_seven_levels() -> None:
    topic = t.up_topic("f" * 64, "d" * 64, "x" * 32)

    assert len(topic.split("/")) == t.MAX_LEVELS == 7
    assert t.parse_topic(topic).device == "d" * 64


@pytest.mark.parametrize(
    "bad",
    ["", "+", "#", "a/b", "a+", "a#b", "$SYS", "a b", "dev\n", "x" * 65, "ü"],
)
def test_builders_reject_injection_in_ids(bad: str) -> None:
    with pytest.raises(TopicError):
        t.up_topic(bad, "dev", "control")
    with pytest.raises(TopicError):
        t.up_topic("fed", bad, "control")
    with pytest.raises(TopicError):
        t.device_subscriptions("fed", bad)
    with pytest.raises(TopicError):
        t.coordinator_subscriptions(bad)


@pytest.mark.parametrize("bad", ["", "Round", "a/b", "+", "#", "1st", "x" * 33])
def test_builders_reject_invalid_names(bad: str) -> None:
    with pytest.raises(TopicError):
        t.global_topic("fed", bad)
    with pytest.raises(TopicError):
        t.down_topic("fed", "dev", bad)


def test_coordinator_has_no_device_subtree() -> None:
    with pytest.raises(TopicError, match="reserved"):
        t.status_topic("fed", "coordinator")
    with pytest.raises(TopicError, match="reserved"):
        t.parse_topic("ursa/v1/fed/dev/coordinator/up/control")


def test_topic_error_is_a_protocol_error() -> None:
    assert issubclass(TopicError, ProtocolError)


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "ursa",
        "ursa/v1/fed",
        "ursa/v2/fed/global/round",
        "other/v1/fed/global/round",
        "ursa/v1/fed/global/round/extra",
        "ursa/v1/fed/global/",
        "ursa/v1/fed/global/#",
        "ursa/v1/fed/global/+",
        "ursa/v1/+/global/round",
        "ursa/v1/fed/dev/+/up/control",
        "ursa/v1/fed/dev/d/sideways/control",
        "ursa/v1/fed/dev/d/up",
        "ursa/v1/fed/dev/d/status/extra",
        "ursa/v1/fed/dev/d/up/control/extra",
        "ursa/v1/fed/dev//up/control",
        "ursa/v1/fed/dev/d\n/up/control",
        "/ursa/v1/fed/global/round",
        "ursa/v1/fed/devices/d/up/x",
    ],
)
def test_parse_topic_rejects_anything_outside_the_tree(topic: str) -> None:
    with pytest.raises(TopicError):
        t.parse_topic(topic)


def test_coordinator_subscribes_to_every_up_subtree_and_status() -> None:
    assert t.coordinator_subscriptions("fed") == (
        "ursa/v1/fed/dev/+/up/#",
        "ursa/v1/fed/dev/+/status",
    )


def test_device_subscribes_to_its_down_subtree_and_global() -> None:
    assert t.device_subscriptions("fed", "dev-1") == (
        "ursa/v1/fed/dev/dev-1/down/#",
        "ursa/v1/fed/global/#",
    )


def test_shared_subscription_prefixes_the_group() -> None:
    topic_filter = t.coordinator_subscriptions("fed")[0]

    assert t.shared_subscription(topic_filter, "workers") == (
        "$share/workers/ursa/v1/fed/dev/+/up/#"
    )
    with pytest.raises(TopicError):
        t.shared_subscription(topic_filter, "a/b")


def test_acl_confines_a_device_to_its_subtree() -> None:
    lines = t.device_acl_patterns("fed")

    assert "pattern write ursa/v1/fed/dev/%u/up/#" in lines
    assert "pattern read ursa/v1/fed/dev/%u/down/#" in lines
    assert "pattern read ursa/v1/fed/global/#" in lines
    assert all("%u" in line or "/global/" in line for line in lines)
    assert not any(
        line.startswith("pattern write") and "global" in line for line in lines
    )
    assert t.federation_filter("fed") == "ursa/v1/fed/#"


def test_every_kind_maps_to_a_valid_name_with_a_qos() -> None:
    for kind in MESSAGE_TYPES:
        name = t.name_for(kind)
        assert t.parse_topic(t.global_topic("fed", name)).name == name
        assert t.qos_for(name) in (0, 1)


def test_names_route_transfers_metrics_and_retained_notices() -> None:
    assert t.name_for("chunk") == t.name_for("transfer_manifest") == t.TRANSFER
    assert t.name_for("chunk_request") == t.TRANSFER
    assert t.name_for("heartbeat") == t.METRICS
    assert t.qos_for(t.METRICS) == 0
    assert t.name_for("registration") == t.CONTROL
    assert t.qos_for(t.CONTROL) == 1
    assert t.name_for("round_announce") in t.RETAINED_GLOBAL_NAMES
    assert t.name_for("key_epoch_start") != t.name_for("agent_public_key")
    assert t.name_for("feddisk_switch") == t.PHASE in t.RETAINED_GLOBAL_NAMES
    assert t.name_for("mean_sum") == t.CONTROL  # per round: not retained
    assert t.name_for("mean_request") == t.name_for("mean_report") == t.CONTROL


@settings(max_examples=200, deadline=None)
@given(
    federation=ids,
    device=ids,
    name=st.from_regex(r"[a-z][a-z0-9_]{0,31}", fullmatch=True),
)
def test_built_topics_parse_back_to_their_parts(
    federation: str, device: str, name: str
) -> None:
    up = t.parse_topic(t.up_topic(federation, device, name))
    down = t.parse_topic(t.down_topic(federation, device, name))

    assert (up.federation, up.device, up.direction, up.name) == (
        federation,
        device,
        "up",
        name,
    )
    assert down.direction == "down"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_device_text_is_either_one_level_or_rejected(text: str) -> None:
    try:
        topic = t.up_topic("fed", text, "control")
    except TopicError:
        return
    assert len(topic.split("/")) == 7
    assert not any(ch in text for ch in "+#/$\x00\n")
    assert t.parse_topic(topic).device == text


def test_each_message_class_declares_its_topic_and_retention() -> None:
    from ursa.protocol.messages import MESSAGE_TYPES

    for kind, cls in MESSAGE_TYPES.items():
        assert t.name_for(kind) == cls.topic
        assert t.global_topic("fed", cls.topic).endswith("/" + cls.topic)
    retained = {cls.__name__ for cls in MESSAGE_TYPES.values() if cls.retained}
    assert retained == {
        "Status",
        "KeyEpochStart",
        "AgentPublicKey",
        "RegistrySum",
        "RoundAnnounce",
        "ModelAvailable",
        "CkksContextAnnounce",
        "FeddiskSwitch",
        "FederationEnd",
    }
    assert {cls.topic for cls in MESSAGE_TYPES.values()} >= {t.CONTROL, t.TRANSFER}


def test_bridge_state_topics_parse_to_site_and_state() -> None:
    topic = t.bridge_state_topic("site-a")

    assert topic == "ursa/bridge/site-a/state"
    assert t.parse_bridge_state(topic, b"1") == ("site-a", True)
    assert t.parse_bridge_state(topic, b"0") == ("site-a", False)
    assert t.parse_bridge_state(topic, b"") == ("site-a", False)
    assert t.parse_bridge_state("ursa/v1/fed/dev/d1/status", b"1") is None


@pytest.mark.parametrize(
    ("topic", "payload"),
    [("ursa/bridge/a.b/state", b"1"), ("ursa/bridge/site-a/state", b"up")],
)
def test_a_bad_bridge_state_is_a_topic_error(topic: str, payload: bytes) -> None:
    with pytest.raises(TopicError):
        t.parse_bridge_state(topic, payload)
