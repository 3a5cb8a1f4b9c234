"""Property-based fuzzing of the envelope and of every message kind's decoder.

Whatever the bytes, `decode` returns a message that round-trips or raises one
of the protocol's typed errors (`DecodeError`, `OversizeError`,
`VersionError`); no other exception escapes. Valid messages come from
`test_envelope.EXAMPLES` (one per kind of the discriminated union).
"""

from __future__ import annotations

from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ursa.protocol import messages as m
from ursa.protocol.envelope import DEFAULT_MAX_MESSAGE_BYTES, decode, encode
from ursa.protocol.errors import DecodeError, OversizeError, VersionError

from .test_envelope import EXAMPLES

TYPED = (DecodeError, OversizeError, VersionError)
FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
PER_KIND = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=70)
    | st.binary(max_size=70)
)
wire_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=25,
)
"""Anything msgpack can carry (str-keyed maps, as the decoder's strict keys)."""
edge_values = st.sampled_from(
    [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        float("nan"),
        float("inf"),
        float("-inf"),
        -0.0,
        1e308,
        "",
        "a" * 65,
        "a" * 257,
        m.COORDINATOR,
        "a/b",
        "+",
        "#",
        b"",
        b"\x00" * 65,
        (),
        {},
        True,
    ]
)
"""Values at the edges of the fields' ranges and patterns."""


def _kind(message: m.BaseMessage) -> str:
    kind: str = getattr(message, "kind")  # noqa: B009 -- kind is per subclass
    return kind


def _pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _decode_or_typed_error(
    data: bytes, max_size: int = DEFAULT_MAX_MESSAGE_BYTES
) -> Any:
    """Decode; a success must round-trip, a failure must be a typed error."""
    try:
        message = decode(data, max_size=max_size)
    except TYPED:
        return None
    assert isinstance(message, m.BaseMessage)
    assert decode(encode(message)) == message
    return message


@FUZZ
@given(wire_values)
def test_any_msgpack_value_decodes_or_raises_a_typed_error(value: Any) -> None:
    _decode_or_typed_error(_pack(value))


@FUZZ
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=4096))
def test_any_bytes_under_any_cap_decode_or_raise_a_typed_error(
    data: bytes, cap: int
) -> None:
    if len(data) > cap:
        with pytest.raises(OversizeError):
            decode(data, max_size=cap)
    else:
        _decode_or_typed_error(data, max_size=cap)


@FUZZ
@given(st.sampled_from(EXAMPLES), st.data())
def test_every_truncated_envelope_is_a_decode_error(
    message: m.BaseMessage, data: st.DataObject
) -> None:
    encoded = encode(message)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))

    with pytest.raises(DecodeError):
        decode(encoded[:cut])


@FUZZ
@given(
    st.sampled_from(EXAMPLES),
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete"]),
            st.integers(min_value=0),
            st.integers(min_value=0, max_value=255),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_mutated_bytes_of_a_valid_envelope_decode_or_raise_a_typed_error(
    message: m.BaseMessage, edits: list[tuple[str, int, int]]
) -> None:
    data = bytearray(encode(message))
    for op, position, value in edits:
        at = position % (len(data) + 1)
        if op == "insert":
            data.insert(at, value)
        elif data and op == "flip":
            data[at % len(data)] ^= value or 1
        elif data:
            del data[at % len(data)]

    _decode_or_typed_error(bytes(data))


@pytest.mark.parametrize("depth", [1, 10, 200, 1_000, 5_000, 100_000])
@pytest.mark.parametrize("container", ["array", "map"])
def test_deeply_nested_msgpack_is_refused_or_ignored_never_a_crash(
    depth: int, container: str
) -> None:
    opener = b"\x91" if container == "array" else b"\x81\xa1k"
    nested = opener * depth + b"\xc0"
    beat = m.Heartbeat(federation="fed-1", round=1, sender="dev-01", seq=1)
    body = encode(beat)
    assert body[0] & 0xF0 == 0x80  # a fixmap: add one more entry in place
    count = body[0] & 0x0F
    as_extra = bytes([0x80 | (count + 1)]) + body[1:] + b"\xa5extra" + nested
    as_field = bytes([0x80 | (count + 1)]) + body[1:] + b"\xa3seq" + nested

    _decode_or_typed_error(nested)
    _decode_or_typed_error(as_extra)
    with pytest.raises(DecodeError):
        decode(as_field)


def _fields(message: m.BaseMessage) -> list[str]:
    return sorted(message.model_dump(mode="python"))


@FUZZ
@given(st.sampled_from(EXAMPLES), st.data())
def test_any_fields_set_repeated_dropped_or_added_round_trip_or_are_refused(
    message: m.BaseMessage, data: st.DataObject
) -> None:
    obj = message.model_dump(mode="python")
    edits = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(_fields(message)),
                st.sampled_from(["set", "edge", "repeat", "drop"]),
            ),
            max_size=3,
        )
    )
    for name, action in edits:
        if action == "set":
            obj[name] = data.draw(wire_values)
        elif action == "edge":
            obj[name] = data.draw(edge_values)
        elif action == "repeat" and isinstance(obj.get(name), tuple | list):
            obj[name] = tuple(obj[name]) * 2  # duplicates in a device list
        else:
            obj.pop(name, None)
    extra = data.draw(st.dictionaries(st.text(max_size=12), wire_values, max_size=2))
    obj.update({k: v for k, v in extra.items() if k not in obj})

    decoded = _decode_or_typed_error(_pack(obj))

    if decoded is not None and "kind" not in {name for name, _ in edits}:
        assert type(decoded) is type(message)


@pytest.mark.parametrize("message", EXAMPLES, ids=_kind)
@PER_KIND
@given(data=st.data())
def test_each_kind_with_one_field_swapped_for_a_wrong_type_is_refused_or_valid(
    message: m.BaseMessage, data: st.DataObject
) -> None:
    obj = message.model_dump(mode="python")
    name = data.draw(st.sampled_from(_fields(message)))
    obj[name] = data.draw(wire_values | edge_values)
    if name == "kind":
        return  # another kind: covered by the any-field test above

    decoded = _decode_or_typed_error(_pack(obj))

    if decoded is not None:
        assert type(decoded) is type(message)


@pytest.mark.parametrize("message", EXAMPLES, ids=_kind)
@PER_KIND
@given(data=st.data())
def test_each_kind_with_another_kinds_fields_is_refused_or_valid(
    message: m.BaseMessage, data: st.DataObject
) -> None:
    other = data.draw(st.sampled_from(EXAMPLES))
    obj = {**other.model_dump(mode="python"), "kind": _kind(message)}

    decoded = _decode_or_typed_error(_pack(obj))

    if decoded is not None:
        assert _kind(decoded) == _kind(message)


@FUZZ
@given(st.sampled_from(EXAMPLES), st.integers(min_value=0, max_value=2**32))
def test_any_integer_protocol_version_is_ours_or_a_version_error(
    message: m.BaseMessage, version: int
) -> None:
    obj = {**message.model_dump(mode="python"), "protocol_version": version}

    if version == m.PROTOCOL_VERSION:
        assert decode(_pack(obj)) == message
    else:
        with pytest.raises(VersionError):
            decode(_pack(obj))
