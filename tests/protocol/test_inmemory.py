"""InMemoryBus / InMemoryTransport: routing, retained, sessions, wills, faults."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.transport import (
    InvalidTopicError,
    NotConnectedError,
    PayloadTooLargeError,
    Transport,
    TransportError,
    TransportState,
)

Inbox = list[tuple[str, bytes]]


@pytest.fixture
def bus() -> Iterator[InMemoryBus]:
    with InMemoryBus(max_payload_bytes=1000) as bus:
        yield bus


def connect(
    bus: InMemoryBus,
    client_id: str,
    *patterns: str,
    will: tuple[str, bytes, bool] | None = None,
    clean_session: bool = False,
) -> tuple[InMemoryTransport, Inbox]:
    inbox: Inbox = []
    transport = InMemoryTransport(
        bus, client_id, will=will, clean_session=clean_session
    )
    transport.set_handler(lambda topic, payload: inbox.append((topic, payload)))
    for pattern in patterns:
        transport.subscribe(pattern)
    transport.connect()
    return transport, inbox


def test_is_a_transport(bus: InMemoryBus) -> None:
    assert isinstance(InMemoryTransport(bus, "d"), Transport)


def test_routes_by_wildcard_filters_and_delivers_before_publish_returns(
    bus: InMemoryBus,
) -> None:
    _, coordinator = connect(bus, "coord", "ursa/v1/+/dev/+/up/#")
    _, dev1 = connect(bus, "dev1", "ursa/v1/f/dev/dev1/down/#", "ursa/v1/f/global/#")
    _, dev2 = connect(bus, "dev2", "ursa/v1/f/dev/dev2/down/#")
    sender, _ = connect(bus, "sender")

    sender.publish("ursa/v1/f/dev/dev1/up/reply", b"u")
    sender.publish("ursa/v1/f/dev/dev1/down/cmd", b"d1")
    sender.publish("ursa/v1/f/global/round", b"g")

    assert coordinator == [("ursa/v1/f/dev/dev1/up/reply", b"u")]
    assert dev1 == [
        ("ursa/v1/f/dev/dev1/down/cmd", b"d1"),
        ("ursa/v1/f/global/round", b"g"),
    ]
    assert dev2 == []


def test_overlapping_filters_deliver_one_copy(bus: InMemoryBus) -> None:
    _, inbox = connect(bus, "a", "x/#", "x/+", "x/y")
    sender, _ = connect(bus, "b")
    sender.publish("x/y", b"1")
    assert inbox == [("x/y", b"1")]


def test_retained_message_reaches_late_subscribers_until_cleared(
    bus: InMemoryBus,
) -> None:
    sender, _ = connect(bus, "coord")
    sender.publish("g/status", b"running", retain=True)

    _, early = connect(bus, "dev1", "g/#")
    sender.publish("g/status", b"", retain=True)  # clears (and is delivered)
    _, late = connect(bus, "dev2", "g/#")

    assert early == [("g/status", b"running"), ("g/status", b"")]
    assert late == []
    assert bus.retained == {}


def test_kill_publishes_the_will_and_close_does_not(bus: InMemoryBus) -> None:
    _, observer = connect(bus, "obs", "s/+")
    polite, _ = connect(bus, "dev1", will=("s/dev1", b"offline", True))
    crashing, _ = connect(bus, "dev2", will=("s/dev2", b"offline", True))

    polite.close()
    crashing.kill()

    assert observer == [("s/dev2", b"offline")]
    assert bus.retained == {"s/dev2": b"offline"}
    assert crashing.state is TransportState.CLOSED
    with pytest.raises(NotConnectedError):
        crashing.publish("s/dev2", b"x")


def test_payload_above_the_cap_raises_and_sends_nothing(bus: InMemoryBus) -> None:
    _, inbox = connect(bus, "a", "#")
    sender, _ = connect(bus, "b")
    with pytest.raises(PayloadTooLargeError):
        sender.publish("t", bytes(1001))
    sender.publish("t", bytes(1000))
    assert inbox == [("t", bytes(1000))]
    assert sender.stats.messages_sent == 1


def test_bad_topics_raise(bus: InMemoryBus) -> None:
    sender, _ = connect(bus, "a")
    with pytest.raises(InvalidTopicError):
        sender.publish("a/+", b"")
    with pytest.raises(InvalidTopicError):
        sender.subscribe("a/#/b")


def test_persistent_session_queues_qos1_while_offline(bus: InMemoryBus) -> None:
    device, _ = connect(bus, "dev1", "down/#")
    device.kill()
    sender, _ = connect(bus, "coord")
    sender.publish("down/a", b"kept", qos=1)
    sender.publish("down/b", b"lost", qos=0)

    _, inbox = connect(bus, "dev1")  # new transport, same client id, no subscribe

    assert inbox == [("down/a", b"kept")]


def test_clean_session_forgets_subscriptions(bus: InMemoryBus) -> None:
    device, _ = connect(bus, "dev1", "down/#", clean_session=True)
    device.close()
    sender, _ = connect(bus, "coord")
    sender.publish("down/a", b"x")
    _, inbox = connect(bus, "dev1", clean_session=True)
    sender.publish("down/b", b"y")
    assert inbox == []


def test_same_client_id_takes_the_session_over(bus: InMemoryBus) -> None:
    old, old_inbox = connect(bus, "dev1", "t")
    new, new_inbox = connect(bus, "dev1")
    sender, _ = connect(bus, "coord")
    sender.publish("t", b"x")
    assert not old.is_connected
    assert new.is_connected
    assert old_inbox == []
    assert new_inbox == [("t", b"x")]


def test_publish_inside_a_handler_is_delivered_after_it_returns(
    bus: InMemoryBus,
) -> None:
    order: list[str] = []
    echo = InMemoryTransport(bus, "echo")

    def reply(topic: str, payload: bytes) -> None:
        order.append(f"start {topic}")
        echo.publish("reply", payload)
        order.append(f"end {topic}")

    echo.set_handler(reply)
    echo.subscribe("request")
    echo.connect()
    _, inbox = connect(bus, "client", "reply")
    client = InMemoryTransport(bus, "c2")
    client.connect()

    client.publish("request", b"ping")

    assert order == ["start request", "end request"]
    assert inbox == [("reply", b"ping")]


def test_drop_filter_partitions_a_device(bus: InMemoryBus) -> None:
    _, coordinator = connect(bus, "coord", "up/#")
    dev1, dev1_inbox = connect(bus, "dev1", "down/#")
    dev2, _ = connect(bus, "dev2")
    bus.drop_filter = lambda sender, receiver, topic, payload: (
        "dev1"
        in (
            sender,
            receiver,
        )
    )

    dev1.publish("up/dev1", b"lost")
    dev2.publish("up/dev2", b"ok")
    dev2.publish("down/dev1", b"lost too")

    assert coordinator == [("up/dev2", b"ok")]
    assert dev1_inbox == []


def test_handler_errors_are_counted_and_delivery_goes_on(bus: InMemoryBus) -> None:
    failing = InMemoryTransport(bus, "bad")
    failing.set_handler(lambda topic, payload: 1 / 0)  # type: ignore[func-returns-value]
    failing.subscribe("t")
    failing.connect()
    _, inbox = connect(bus, "good", "t")
    sender, _ = connect(bus, "s")

    sender.publish("t", b"1")

    assert bus.handler_errors == 1
    assert inbox == [("t", b"1")]


def test_connect_twice_raises(bus: InMemoryBus) -> None:
    transport, _ = connect(bus, "a")
    with pytest.raises(TransportError):
        transport.connect()


def test_stats_count_both_directions(bus: InMemoryBus) -> None:
    receiver, _ = connect(bus, "r", "t")
    sender, _ = connect(bus, "s")
    sender.publish("t", b"abc")
    sender.publish("t", b"de")
    assert sender.stats.messages_sent == 2
    assert sender.stats.bytes_sent == 5
    assert receiver.stats.messages_received == 2
    assert receiver.stats.bytes_received == 5


def test_threaded_mode_delivers_on_the_dispatcher_thread() -> None:
    with InMemoryBus(synchronous=False) as bus:
        threads: list[str] = []
        receiver = InMemoryTransport(bus, "r")
        receiver.set_handler(
            lambda t, p: threads.append(threading.current_thread().name)
        )
        receiver.subscribe("t")
        receiver.connect()
        sender = InMemoryTransport(bus, "s")
        sender.connect()

        for _ in range(50):
            sender.publish("t", b"x")
        sender.flush(5.0)

        assert threads == ["ursa-inmemory-bus"] * 50


def test_stored_retained_messages_go_to_the_retained_handler() -> None:
    bus = InMemoryBus()
    publisher = InMemoryTransport(bus, "pub")
    publisher.connect()
    publisher.publish("a/stored", b"old", retain=True)
    live: list[str] = []
    stored: list[str] = []
    reader = InMemoryTransport(bus, "reader")
    reader.set_handler(lambda topic, payload: live.append(topic))
    reader.set_retained_handler(lambda topic, payload: stored.append(topic))
    reader.subscribe("a/#")
    reader.connect()
    publisher.publish("a/live", b"new", retain=True)  # live: the main handler
    bus.flush(1.0)
    reader.subscribe("a/#")  # again: the broker sends what is stored again
    bus.flush(1.0)

    assert live == ["a/live"]
    assert sorted(stored) == ["a/live", "a/stored", "a/stored"]
    reader.set_retained_handler(None)  # the default: everything to the handler
    reader.subscribe("a/#")
    bus.flush(1.0)
    assert sorted(live) == ["a/live", "a/live", "a/stored"]
