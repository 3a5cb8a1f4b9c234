from __future__ import annotations

import base64
import json
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ursa.protocol import messages as m
from ursa.protocol.envelope import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SIGNING_DOMAIN,
    decode,
    encode,
    message_digest,
    signing_bytes,
    to_log_json,
)
from ursa.protocol.errors import (
    DecodeError,
    OversizeError,
    ProtocolError,
    VersionError,
)

DEV: dict[str, Any] = {"federation": "fed-1", "round": 4, "sender": "dev-01"}
COORD: dict[str, Any] = {"federation": "fed-1", "round": 4, "sender": m.COORDINATOR}
KEY = bytes(range(32))
RUN: dict[str, Any] = {"run_id": "r1", "step": 2}
LAYOUT: dict[str, Any] = {"block_slots": 4, "per_ciphertext": 16, "ciphertexts": 1}
SIG = bytes(range(64))
SECRET = b"SECRET-KEY-MATERIAL-0123456789"
CT = SECRET * 17  # ciphertext-sized, with a marker to look for in logs
_DROP = object()  # marks a field to remove from an envelope


def _examples() -> list[m.BaseMessage]:
    keys = m.DeviceKeys(device_id="dev-02", x25519_public=KEY, ed25519_public=KEY)
    return [
        m.Hello(
            **DEV,
            device_id="dev-01",
            x25519_public=KEY,
            ed25519_public=KEY,
            capabilities=("selection", "train"),
        ),
        m.EnrolResult(
            **COORD,
            device_id="dev-01",
            accepted=True,
            epoch=1,
            coordinator_keys=m.IdentityKeys(
                device_id=m.COORDINATOR, x25519_public=KEY, ed25519_public=KEY
            ),
        ),
        m.ErrorReply(
            **COORD, code=m.ErrorCode.MALFORMED, reason="bad", in_reply_to="abc"
        ),
        m.Status(**DEV, online=True, state="training"),
        m.Heartbeat(**DEV, seq=7),
        m.KeyEpochStart(
            **COORD,
            epoch=1,
            agent="dev-03",
            agent_keys=m.DeviceKeys(
                device_id="dev-03", x25519_public=KEY, ed25519_public=KEY
            ),
            num_classes=10,
            groups=(1, 2, 10),
            sigma=(0.5, 0.3, 0.0),
            max_parties=200,
            methods=("dubhe", "climb"),
            signature=SIG,
        ),
        m.SealRequest(**COORD, epoch=1, page=2, pages=3, recipients=(keys,)),
        m.AgentPublicKey(**DEV, epoch=1, public_key=CT[:256], signature=SIG),
        m.SealedSecretKey(**DEV, epoch=1, recipient="dev-02", box=CT),
        m.SealedKeys(
            **DEV, epoch=1, page=0, boxes=(m.SealedBox(recipient="dev-02", box=CT),)
        ),
        m.Registration(**DEV, epoch=1, registry=CT),
        m.RankRequest(
            **COORD,
            epoch=1,
            page=1,
            pages=2,
            entries=(m.RankEntry(registry=CT, rank_key=bytes(range(32))),),
        ),
        m.SealedRanks(**DEV, epoch=1, page=1, boxes=(m.RankBox(entry=0, box=CT[:69]),)),
        m.SealedRank(**COORD, epoch=1, box=CT[:69]),
        m.RegistrySum(**COORD, epoch=1, registry_sum=CT, num_parties=30),
        m.RegistryCheck(**COORD, epoch=1, page=0, pages=2, registries=(CT, CT)),
        m.RegistryVerdict(**DEV, epoch=1, page=0, entries=2, bad=(1,), signature=SIG),
        m.RoundAnnounce(
            **COORD,
            epoch=1,
            k=20,
            tries=5,
            deadline_s=10.0,
            model_version=3,
            model_transfer_id="t-model-3",
        ),
        m.Volunteer(**DEV, draws=(True, False, True, False, False)),
        m.TryAssignment(**COORD, try_indices=(0, 2)),
        m.EncryptedDistribution(**DEV, distribution=CT),
        m.TrySums(**COORD, sums=(CT, CT, CT), member_counts=(20, 20, 20)),
        m.AgentAnswer(**DEV, best_try=2, bad_tries=(0,), signature=SIG),
        m.SelectionResult(**COORD, selected=("dev-01", "dev-02"), try_index=2),
        m.TransferManifest(
            **COORD,
            transfer_id="t1",
            purpose="model",
            total_size=300,
            chunk_size=256,
            chunk_count=2,
            sha256="ab" * 32,
        ),
        m.Chunk(**COORD, transfer_id="t1", index=1, data=CT),
        m.ChunkRequest(**DEV, transfer_id="t1", indices=(0, 3)),
        m.ModelAvailable(
            **COORD,
            model="classifier",
            model_version=3,
            transfer_id="t",
            sha256="ab" * 32,
        ),
        m.ModelUpdate(
            **DEV,
            base_version=3,
            num_examples=120,
            weights=CT,
            metrics=(("loss", 0.5), ("samples", 120.0)),
        ),
        m.MeanRequest(
            **COORD, purpose=m.CLIMB_DUAL, epoch=1, model="clf", model_version=3
        ),
        m.MeanReport(
            **DEV,
            purpose=m.MADE_LOSS,
            epoch=1,
            model="made",
            model_version=4,
            ciphertext=CT,
        ),
        m.MeanSum(
            **COORD,
            purpose=m.CLIMB_DUAL,
            epoch=1,
            model="clf",
            model_version=3,
            ciphertext=CT,
            num_parties=20,
        ),
        m.MeanResult(
            **DEV,
            purpose=m.FLEET_EVAL,
            epoch=1,
            model="clf",
            model_version=3,
            values=(8.0, 9.0, 10.0, 12.0, 2.0),
            num_parties=3,
            signature=SIG,
        ),
        m.MadeVerdict(
            **DEV, epoch=1, model_version=4, stop=True, best_version=3, signature=SIG
        ),
        m.FeddiskSwitch(**COORD, made_model="made", made_version=3, model="classifier"),
        m.FederationEnd(
            **COORD,
            rounds=9,
            model="classifier",
            model_version=9,
            transfer_id="t9",
            weights=b"w",
            metrics={"accuracy": 0.9},
            signature=b"s" * 64,
        ),
        m.CkksContextAnnounce(**COORD, transfer_id="ckks-ctx"),
        m.RingStart(**COORD, ring_id="r1", order=("a", "b", "c"), hop_deadline_s=5.0),
        m.RingHop(
            **DEV, ring_id="r1", hop_index=1, recipient="b", contributors=("a",), box=CT
        ),
        m.RingResult(**DEV, ring_id="r1", contributors=("a", "b", "c"), total=CT),
        m.CosineRequest(**COORD, **RUN, ciphertext=CT),
        m.CosineReply(**DEV, **RUN, masked_product=CT),
        m.ResampleRequest(**COORD, **RUN, nabla_client=0.05),
        m.CountUpdate(**DEV, **RUN, delta=CT, saturated=False),
        m.RedundancyOffer(
            **DEV,
            **RUN,
            **LAYOUT,
            recipient="dev-02",
            recipients=("dev-02", "dev-03"),
            box=CT,
        ),
        m.RedundancyAsk(
            **COORD, **RUN, **LAYOUT, origin="dev-01", vector_slots=256, box=CT
        ),
        m.RedundancyReply(**DEV, **RUN, part=0, parts=4, products=CT, box=CT),
        m.RedundancyResult(
            **COORD,
            **RUN,
            peers=("dev-02", "dev-03"),
            vector_slots=256,
            peer="dev-03",
            box=CT,
            signs=CT,
        ),
        *_secure_aggregation_examples(keys),
    ]


def _secure_aggregation_examples(keys: m.DeviceKeys) -> list[m.BaseMessage]:
    head = {"model": "classifier", "model_version": 3}
    sig = b"\x07" * 64
    return [
        m.SecAggSetup(
            **COORD,
            **head,
            participants=("dev-01", "dev-02", "dev-03"),
            threshold=2,
            degree=2,
            weighting="fedavg",
            max_examples=100,
            clip_norm=10.0,
            signature=sig,
        ),
        m.SecAggKeys(
            **DEV, **head, c_public=KEY, s_public=b"\x02" * 32, advert_signature=sig
        ),
        m.SecAggRoster(
            **COORD,
            **head,
            participants=("dev-01", "dev-02"),
            peers=(
                m.PeerKeys(
                    identity=keys, c_public=KEY, s_public=KEY, advert_signature=sig
                ),
            ),
        ),
        m.SecAggShares(**DEV, **head, boxes=(m.ShareBox(peer="dev-02", box=CT),)),
        m.SecAggShareBundle(
            **COORD, **head, boxes=(m.ShareBox(peer="dev-02", box=CT),)
        ),
        m.MaskedUpdate(**DEV, model="classifier", base_version=3, vector=CT),
        m.SecAggUnmask(
            **COORD, **head, survivors=("dev-01", "dev-02"), dropped=("dev-03",)
        ),
        m.SecAggUnmaskShares(
            **DEV,
            **head,
            shares=(
                m.RevealedShare(owner="dev-02", secret="b", index=2, data=KEY + b"ab"),
                m.RevealedShare(owner="dev-03", secret="s", index=1, data=KEY + b"ab"),
            ),
        ),
    ]


EXAMPLES = _examples()


def _kind(message: m.BaseMessage) -> str:
    kind: str = getattr(message, "kind")  # noqa: B009 -- kind is per subclass
    return kind


def _envelope(message: m.BaseMessage, **changes: Any) -> bytes:
    obj = message.model_dump(mode="python")
    obj.update(changes)
    for key in [k for k, v in changes.items() if v is _DROP]:
        del obj[key]
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def test_examples_cover_every_message_kind() -> None:
    assert sorted(_kind(e) for e in EXAMPLES) == sorted(m.MESSAGE_TYPES)


@pytest.mark.parametrize("message", EXAMPLES, ids=_kind)
def test_every_kind_round_trips_through_the_envelope(message: m.BaseMessage) -> None:
    data = encode(message)
    decoded = decode(data)

    assert decoded == message
    assert type(decoded) is type(message)
    assert encode(decoded) == data
    assert signing_bytes(decoded) == signing_bytes(message)


def test_a_registration_carries_a_one_time_key_only_under_the_stratified_draw() -> None:
    key = bytes(range(32))
    with_key = m.Registration(**DEV, epoch=2, registry=CT, rank_key=key)
    assert decode(encode(with_key)) == with_key
    assert key in encode(with_key)
    assert m.Registration(**DEV, epoch=2, registry=CT).rank_key is None
    with pytest.raises(ValidationError):
        m.Registration(**DEV, epoch=2, registry=CT, rank_key=key[:31])


def test_bytes_travel_raw_not_base64() -> None:
    message = m.Registration(**DEV, epoch=1, registry=CT)

    data = encode(message)

    assert CT in data
    assert len(data) < len(CT) + 200


def test_a_full_size_chunk_fits_the_default_message_cap() -> None:
    chunk = m.Chunk(
        **COORD, transfer_id="t" * 64, index=0, data=bytes(m.MAX_CHUNK_SIZE)
    )

    assert len(encode(chunk)) <= DEFAULT_MAX_MESSAGE_BYTES
    assert decode(encode(chunk)) == chunk


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x92\x01", b"\xdb\xff\xff\xff\xff", b"\x81\xa4kind"],
    ids=["empty", "reserved-byte", "truncated-array", "truncated-str", "no-value"],
)
def test_malformed_msgpack_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError, match="malformed msgpack"):
        decode(data)


def test_truncated_and_padded_encodings_raise_decode_error() -> None:
    data = encode(EXAMPLES[0])

    with pytest.raises(DecodeError):
        decode(data[:-5])
    with pytest.raises(DecodeError):
        decode(data + b"\x00")


@pytest.mark.parametrize("value", [[1, 2], "hello", 42, None, b"raw"])
def test_envelope_that_is_not_a_map_raises_decode_error(value: object) -> None:
    with pytest.raises(DecodeError, match="not a map"):
        decode(msgpack.packb(value, use_bin_type=True))


def test_map_with_non_string_keys_raises_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode(msgpack.packb({1: "x", "kind": "heartbeat"}, use_bin_type=True))


@pytest.mark.parametrize("kind", ["nope", "", 7, None, "HELLO", "hello\n"])
def test_unknown_kind_raises_decode_error_with_the_message_id(kind: object) -> None:
    beat = m.Heartbeat(**DEV, seq=1)

    with pytest.raises(DecodeError, match="unknown message kind") as info:
        decode(_envelope(beat, kind=kind))
    assert info.value.message_id == beat.message_id
    assert info.value.kind is None


def test_missing_kind_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="unknown message kind"):
        decode(_envelope(m.Heartbeat(**DEV, seq=1), kind=_DROP))


@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 7, 8, 99])
def test_other_protocol_version_raises_version_error(version: int) -> None:
    with pytest.raises(VersionError) as info:
        decode(_envelope(m.Heartbeat(**DEV, seq=1), protocol_version=version))
    assert info.value.version == version
    assert info.value.supported == m.PROTOCOL_VERSION == 10


@pytest.mark.parametrize("version", ["1", 1.0, True, None])
def test_non_integer_protocol_version_raises_decode_error(version: object) -> None:
    with pytest.raises(DecodeError, match="protocol_version"):
        decode(_envelope(m.Heartbeat(**DEV, seq=1), protocol_version=version))


def test_oversize_input_is_rejected_before_parsing() -> None:
    with pytest.raises(OversizeError) as info:
        decode(b"\xc1" * 101, max_size=100)
    assert (info.value.size, info.value.limit) == (101, 100)


def test_encode_refuses_a_message_over_the_cap() -> None:
    message = m.Registration(**DEV, epoch=1, registry=CT)

    with pytest.raises(OversizeError):
        encode(message, max_size=len(CT))


@pytest.mark.parametrize("field", ["federation", "round", "sender", "seq"])
def test_missing_field_raises_decode_error_naming_it(field: str) -> None:
    with pytest.raises(DecodeError, match=f"invalid heartbeat: {field}") as info:
        decode(_envelope(m.Heartbeat(**DEV, seq=1), **{field: _DROP}))
    assert info.value.kind == "heartbeat"


@pytest.mark.parametrize("sender", ["a/b", "a+b", "#", "", "x" * 65])
def test_invalid_device_id_raises_decode_error(sender: str) -> None:
    with pytest.raises(DecodeError, match="sender"):
        decode(_envelope(m.Heartbeat(**DEV, seq=1), sender=sender))


def test_reserved_name_is_not_a_device_id_on_the_wire() -> None:
    message = m.SealedSecretKey(**DEV, epoch=1, recipient="dev-02", box=b"x")

    with pytest.raises(DecodeError, match="recipient"):
        decode(_envelope(message, recipient=m.COORDINATOR))


@pytest.mark.parametrize(
    "changes",
    [{"round": "4"}, {"seq": 1.0}, {"round": True}, {"federation": b"fed-1"}],
)
def test_wire_values_are_not_coerced(changes: dict[str, Any]) -> None:
    with pytest.raises(DecodeError):
        decode(_envelope(m.Heartbeat(**DEV, seq=1), **changes))


def test_str_is_not_accepted_for_a_bytes_field() -> None:
    message = m.Registration(**DEV, epoch=1, registry=b"ct")

    with pytest.raises(DecodeError, match="registry"):
        decode(_envelope(message, registry="ct"))


def test_unknown_fields_from_newer_peers_are_ignored() -> None:
    beat = m.Heartbeat(**DEV, seq=1)

    assert decode(_envelope(beat, added_in_v1_5=[1, 2])) == beat


def test_decode_error_reason_never_quotes_the_payload() -> None:
    too_big = m.SealedSecretKey(**DEV, epoch=1, recipient="dev-02", box=b"x")

    with pytest.raises(DecodeError) as info:
        decode(_envelope(too_big, box=SECRET * 1000, recipient="SECRET/x"))
    assert "SECRET" not in str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_only_ever_raise_protocol_errors(data: bytes) -> None:
    try:
        decoded = decode(data)
    except ProtocolError:
        return
    assert isinstance(decoded, m.BaseMessage)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(EXAMPLES),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=255),
)
def test_corrupted_encodings_decode_or_raise_protocol_errors(
    message: m.BaseMessage, position: int, value: int
) -> None:
    data = bytearray(encode(message))
    data[position % len(data)] = value

    try:
        decoded = decode(bytes(data))
    except ProtocolError:
        return
    assert isinstance(decoded, m.BaseMessage)


@pytest.mark.parametrize("message", EXAMPLES, ids=_kind)
def test_log_json_never_contains_raw_bytes(message: m.BaseMessage) -> None:
    line = to_log_json(message)

    parsed = json.loads(line)
    assert parsed["kind"] == _kind(message)
    for marker in (SECRET, KEY, SIG):
        for rendering in (
            marker.decode("latin-1"),
            marker.hex(),
            base64.b64encode(marker).decode(),
            base64.b64encode(marker[1:]).decode(),
        ):
            assert rendering not in line


def test_log_json_shows_length_and_hash_prefix_of_bytes() -> None:
    parsed = json.loads(to_log_json(m.Registration(**DEV, epoch=1, registry=CT)))

    assert parsed["registry"].startswith(f"<{len(CT)} bytes sha256:")
    assert parsed["sender"] == "dev-01"


def test_a_message_digest_survives_the_wire_and_names_the_content() -> None:
    answer = m.AgentAnswer(**DEV, best_try=2)
    signed = answer.model_copy(update={"signature": SIG})
    other = m.AgentAnswer.model_validate({**answer.model_dump(), "best_try": 3})

    assert message_digest(decode(encode(signed))) == message_digest(answer)
    assert message_digest(other) != message_digest(answer)
    assert len(message_digest(answer)) == 64


def test_signing_bytes_cover_everything_but_the_signature() -> None:
    answer = m.AgentAnswer(**DEV, best_try=2)
    signed = answer.model_copy(update={"signature": SIG})
    other = m.AgentAnswer.model_validate({**answer.model_dump(), "best_try": 3})

    assert signing_bytes(signed) == signing_bytes(answer)
    assert signing_bytes(other) != signing_bytes(answer)
    assert signing_bytes(answer).startswith(SIGNING_DOMAIN)
    assert SIG not in signing_bytes(signed)
