"""The msgpack envelope: message <-> bytes, signing bytes, and a log rendering.

On the wire a message is one msgpack map of its fields (`model_dump`), with
ciphertexts, keys and tensors as raw msgpack `bin`. Decoding checks the size
before parsing, parses with lists as tuples, and validates in pydantic's
strict mode (no "1" -> 1 or str <-> bytes coercion from the network).
Whatever the input, `decode` returns a message or raises a `ProtocolError`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import msgpack
from pydantic import ValidationError

from ursa.protocol.errors import DecodeError, OversizeError, VersionError
from ursa.protocol.messages import (
    COORDINATOR,
    ID_PATTERN,
    MAX_CHUNK_SIZE,
    MESSAGE_ADAPTER,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    BaseMessage,
    Chunk,
    Message,
)

DEFAULT_MAX_MESSAGE_BYTES = 2 * MAX_CHUNK_SIZE
"""Cap on one encoded message; a full chunk plus its envelope fits with room."""
SIGNING_DOMAIN = b"ursa-signature-v1\x00"
LOG_HASH_HEX_CHARS = 12

_ID_RE = re.compile(ID_PATTERN)


def encode(message: BaseMessage, *, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> bytes:
    """Encode a message as a msgpack map.

    Raises:
        OversizeError: the encoding exceeds `max_size` (send it as a transfer).
    """
    data: bytes = msgpack.packb(message.model_dump(mode="python"), use_bin_type=True)
    if len(data) > max_size:
        raise OversizeError(f"encoded {message_kind(message)}", len(data), max_size)
    return data


def decode(data: bytes, *, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """Decode and validate one message from untrusted bytes.

    Raises:
        OversizeError: `data` is longer than `max_size` (checked before parsing).
        DecodeError: not msgpack, not a map, unknown kind or invalid fields.
        VersionError: a known kind with a `protocol_version` other than ours.
    """
    if len(data) > max_size:
        raise OversizeError("message", len(data), max_size)
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for hostile input
        raise DecodeError(f"malformed msgpack ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise DecodeError(f"envelope is a {type(obj).__name__}, not a map")
    kind = obj.get("kind")
    raw_id = obj.get("message_id")
    message_id = (
        raw_id if isinstance(raw_id, str) and _ID_RE.fullmatch(raw_id) else None
    )
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        shown = f" {kind!r}" if isinstance(kind, str) and _ID_RE.fullmatch(kind) else ""
        raise DecodeError(f"unknown message kind{shown}", message_id=message_id)
    version = obj.get("protocol_version")
    if type(version) is int and version != PROTOCOL_VERSION:
        raise VersionError(version, PROTOCOL_VERSION)
    try:
        return MESSAGE_ADAPTER.validate_python(obj, strict=True)
    except ValidationError as exc:
        raise DecodeError(
            f"invalid {kind}: {_summarise(exc)}", kind=kind, message_id=message_id
        ) from None


def signing_bytes(message: BaseMessage) -> bytes:
    """Bytes an Ed25519 signature covers: a domain tag and the message sans signature.

    Deterministic across a wire round trip (fields dump in declaration order),
    so `signing_bytes(decode(encode(m))) == signing_bytes(m)`.
    """
    body = message.model_dump(mode="python", exclude={"signature"})
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return SIGNING_DOMAIN + packed


def signed_by_coordinator(message: BaseMessage) -> bool:
    """Whether `message` must carry the coordinator's signature to be acted on.

    Every message the coordinator sends but a `Chunk`: the coordinator signs
    them all at one point and a device checks them all at one point, so a
    notice no one listed cannot travel unsigned. A chunk's bytes are bound by
    the SHA-256 its signed `TransferManifest` names (and a model's by the
    signed `ModelAvailable` too); a chunk that does not match is dropped and
    asked for again.
    """
    return message.sender == COORDINATOR and not isinstance(message, Chunk)


def message_digest(message: BaseMessage) -> str:
    """SHA-256 hex of `signing_bytes`: names one message's content on the wire.

    A signed refusal carries it next to the refused message's id, so the
    coordinator can match it with what it really sent (`ErrorReply`).
    """
    return hashlib.sha256(signing_bytes(message)).hexdigest()


def to_log_json(message: BaseMessage) -> str:
    """Render a message as one JSON line for logs; bytes become length + hash prefix.

    Byte fields (ciphertexts, keys, sealed boxes, weights) never appear, only
    `"<N bytes sha256:abcdef012345>"`, so secrets cannot reach a log.
    """
    return json.dumps(_redact(message.model_dump(mode="python")), ensure_ascii=True)


def message_kind(message: BaseMessage) -> str:
    """The `kind` tag of a message instance."""
    kind: str = getattr(message, "kind", type(message).__name__)
    return kind


def _is_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def _redact(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        digest = hashlib.sha256(raw).hexdigest()[:LOG_HASH_HEX_CHARS]
        return f"<{len(raw)} bytes sha256:{digest}>"
    if isinstance(value, dict):
        return {str(k): _redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v) for v in value]
    return value


def _summarise(exc: ValidationError) -> str:
    """First validation problem as `field.path: message`, without input values."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"][1:]) or "<message>"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"
