from __future__ import annotations

import logging

import pytest

from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.outbox import Outbox, Outgoing
from ursa.protocol.transport import TransportError


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int, bool]] = []
        self.outbox: Outbox | None = None
        self.fail_topic: str | None = None

    def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        if topic == self.fail_topic:
            raise TransportError("broker gone")
        self.sent.append((topic, payload, qos, retain))
        if topic == "a" and self.outbox is not None:
            # a handler that queues and flushes while a flush is under way
            self.outbox.put("c", b"3", 1)
            self.outbox.flush(self)  # type: ignore[arg-type]


def test_flush_publishes_in_order_including_what_a_nested_flush_queued() -> None:
    outbox = Outbox("t")
    recorder = _Recorder()
    recorder.outbox = outbox
    outbox.put("a", b"1", 1)
    outbox.put("b", b"2", 0, retain=True)
    outbox.flush(recorder)  # type: ignore[arg-type]
    assert [s[0] for s in recorder.sent] == ["a", "b", "c"]
    assert recorder.sent[1] == ("b", b"2", 0, True)
    assert len(outbox) == 0


def test_a_failed_publish_is_logged_and_the_rest_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = Outbox("dev1")
    recorder = _Recorder()
    recorder.fail_topic = "a"
    outbox.put("a", b"1", 1)
    outbox.put_item(Outgoing("b", b"2", 1))
    with caplog.at_level(logging.ERROR, logger="ursa.protocol.outbox"):
        outbox.flush(recorder)  # type: ignore[arg-type]
    assert [s[0] for s in recorder.sent] == ["b"]
    assert "dev1: publish to a failed" in caplog.text


def test_after_close_queued_and_failing_publishes_are_dropped_without_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbox = Outbox("dev1")
    recorder = _Recorder()
    with caplog.at_level(logging.DEBUG, logger="ursa.protocol.outbox"):
        outbox.put("x", b"1", 1)
        outbox.close()
        outbox.put("y", b"2", 1)  # a handler answering while the owner stops
        outbox.flush(recorder)  # type: ignore[arg-type]
    assert recorder.sent == [] and len(outbox) == 0
    assert "dropped on close" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_flush_without_a_transport_keeps_the_queue() -> None:
    outbox = Outbox("t")
    outbox.put("a", b"1", 1)
    outbox.flush(None)
    assert len(outbox) == 1


def test_flush_over_the_in_memory_bus_delivers() -> None:
    bus = InMemoryBus()
    got: list[str] = []
    rx = InMemoryTransport(bus, "rx")
    rx.set_handler(lambda topic, payload: got.append(topic))
    rx.connect()
    rx.subscribe("x/#")
    tx = InMemoryTransport(bus, "tx")
    tx.connect()
    outbox = Outbox("tx")
    outbox.put("x/1", b"", 1)
    outbox.flush(tx)
    assert got == ["x/1"]
