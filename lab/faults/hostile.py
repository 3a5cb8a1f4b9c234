"""Hostile input for a running fleet: a flood and malformed messages.

A test publishes these with a device identity's broker credentials (the ACL
lets a device write only its own ``up`` and ``status`` topics), so they reach
the coordinator's admission exactly as a compromised device's would. Pure
payload building plus one publishing loop; no judging (the fleet judges).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import msgpack

from ursa.protocol.envelope import encode
from ursa.protocol.messages import Heartbeat
from ursa.protocol.topics import up_topic
from ursa.protocol.transport import Transport, TransportError

__all__ = ["flood", "malformed_payloads"]

BATCH = 200
"""Heartbeats published back to back before a 0.1 s rest (~2000/s)."""
NESTING = 10_000
"""Depth of the nested msgpack array (beyond msgpack's own recursion limit)."""


def flood(
    transport: Transport, federation: str, device: str, stop: threading.Event
) -> int:
    """Publish heartbeats as `device` until `stop` is set; return how many went out.

    Each is a valid, distinct message (its own id and sequence number), so
    only the per-device rate limit can stop them cheaply.
    """
    topic = up_topic(federation, device, Heartbeat.topic)
    sent = 0
    while not stop.is_set():
        beat = Heartbeat(federation=federation, round=1, sender=device, seq=sent)
        try:
            transport.publish(topic, encode(beat), qos=0)
        except TransportError:
            stop.wait(0.01)  # the client's queue is full: let it drain
            continue
        sent += 1
        if sent % BATCH == 0:
            stop.wait(0.1)
    return sent


def malformed_payloads(
    federation: str, device: str, *, oversize_bytes: int, replays: Sequence[bytes]
) -> list[tuple[str, bytes]]:
    """Labelled payloads no receiver may act on, as sent by `device`.

    Garbage bytes, a truncated envelope, a payload of `oversize_bytes`, a map
    with every field of the wrong type, out-of-range values, an unknown kind,
    a future protocol version, deeply nested msgpack, another federation's
    message, another device's name as sender, and `replays` (messages
    captured from the run, other devices' or the coordinator's).
    """
    beat = Heartbeat(federation=federation, round=1, sender=device, seq=1)
    valid = beat.model_dump(mode="python")

    def packed(**changes: object) -> bytes:
        data: bytes = msgpack.packb({**valid, **changes}, use_bin_type=True)
        return data

    whole = encode(beat)
    nested = b"\x91" * NESTING + b"\xc0"  # [[[...[nil]...]]]
    cases = [
        ("garbage", bytes(range(256)) * 4),
        ("not msgpack", b"\xc1\xc1\xc1"),
        ("truncated", whole[: len(whole) // 2]),
        ("not a map", msgpack.packb([1, 2, 3])),
        ("oversize", b"\x00" * oversize_bytes),
        ("wrong types", packed(round="one", seq=b"\x00", sent_at="now")),
        ("out of range", packed(round=-5, seq=-1, sent_at=-1.0)),
        ("unknown kind", packed(kind="gimme_the_model")),
        ("future version", packed(protocol_version=999)),
        ("nested", nested),
        ("other federation", packed(federation="elsewhere")),
        ("other sender", packed(sender="d00", message_id="m" * 16)),
    ]
    cases += [(f"replay {i}", payload) for i, payload in enumerate(replays)]
    return [(label, bytes(payload)) for label, payload in cases]
