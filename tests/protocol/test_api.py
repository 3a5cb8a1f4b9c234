"""The public API of `ursa.protocol`, pinned."""

from __future__ import annotations

import ursa.protocol as protocol


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(protocol.__all__) == [
        "BaseMessage",
        "ChunkError",
        "DecodeError",
        "Dispatch",
        "ErrorCode",
        "ErrorReply",
        "InMemoryBus",
        "InMemoryTransport",
        "MESSAGE_ADAPTER",
        "MESSAGE_TYPES",
        "Message",
        "MqttConfig",
        "MqttTransport",
        "NotReadyError",
        "OversizeError",
        "PROTOCOL_VERSION",
        "ProtocolError",
        "RejectedError",
        "Router",
        "TopicError",
        "Transport",
        "TransportError",
        "VersionError",
        "decode",
        "encode",
        "signing_bytes",
        "to_log_json",
    ]
    for name in protocol.__all__:
        assert getattr(protocol, name) is not None
