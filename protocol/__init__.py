"""Wire messages, topics, envelope and chunking, transports (MQTT, in-memory)."""

from ursa.protocol.envelope import decode, encode, signing_bytes, to_log_json
from ursa.protocol.errors import (
    ChunkError,
    DecodeError,
    OversizeError,
    ProtocolError,
    TopicError,
    VersionError,
)
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    MESSAGE_ADAPTER,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    BaseMessage,
    ErrorCode,
    ErrorReply,
    Message,
)
from ursa.protocol.mqtt import MqttConfig, MqttTransport
from ursa.protocol.router import Dispatch, NotReadyError, RejectedError, Router
from ursa.protocol.transport import Transport, TransportError

__all__ = [
    "MESSAGE_ADAPTER",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "BaseMessage",
    "ChunkError",
    "DecodeError",
    "Dispatch",
    "ErrorCode",
    "ErrorReply",
    "InMemoryBus",
    "InMemoryTransport",
    "Message",
    "MqttConfig",
    "MqttTransport",
    "NotReadyError",
    "OversizeError",
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
