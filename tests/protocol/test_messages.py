from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from ursa.protocol import messages as m
from ursa.protocol.envelope import decode, encode, signing_bytes

DEV: dict[str, Any] = {"federation": "fed-1", "round": 2, "sender": "dev-01"}
COORD: dict[str, Any] = {"federation": "fed-1", "round": 2, "sender": m.COORDINATOR}
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def _keys(device_id: str, key: bytes = KEY) -> m.DeviceKeys:
    return m.DeviceKeys(device_id=device_id, x25519_public=key, ed25519_public=key)


def _epoch(**overrides: Any) -> m.KeyEpochStart:
    fields: dict[str, Any] = {
        "epoch": 1,
        "agent": "dev-07",
        "agent_keys": _keys("dev-07"),
        "num_classes": 10,
        "groups": (1, 2, 10),
        "sigma": (0.5, 0.3, 0.0),
        "max_parties": 1000,
        "methods": ("dubhe",),
    }
    fields.update(overrides)
    return m.KeyEpochStart(**COORD, **fields)


def test_union_lists_every_message_class_once_with_distinct_kinds() -> None:
    classes = get_args(get_args(m.Message)[0])
    kinds = [get_args(c.model_fields["kind"].annotation)[0] for c in classes]

    assert len(set(kinds)) == len(kinds) == len(m.MESSAGE_TYPES)
    assert all(m.MESSAGE_TYPES[k] is c for k, c in zip(kinds, classes, strict=True))
    assert all(issubclass(c, m.BaseMessage) for c in classes)


def test_common_fields_have_defaults_for_id_time_and_version() -> None:
    first = m.Heartbeat(**DEV, seq=1)
    second = m.Heartbeat(**DEV, seq=1)

    assert first.protocol_version == m.PROTOCOL_VERSION == 10
    assert first.message_id != second.message_id
    assert len(first.message_id) == 32
    assert first.sent_at > 0


def test_messages_are_frozen_and_ignore_unknown_fields() -> None:
    beat = m.Heartbeat.model_validate({**DEV, "seq": 1, "from_the_future": True})

    with pytest.raises(ValidationError):
        beat.seq = 2  # type: ignore[misc, unused-ignore]
    assert not hasattr(beat, "from_the_future")


@pytest.mark.parametrize(
    "bad_id",
    ["", "a/b", "a+b", "#", "$SYS", "a b", "dev\n", "é", "x" * 65, "coordinator"],
)
def test_device_ids_reject_topic_metacharacters_and_the_reserved_name(
    bad_id: str,
) -> None:
    with pytest.raises(ValidationError):
        m.SealedSecretKey(**COORD, epoch=1, recipient=bad_id, box=b"x")


@pytest.mark.parametrize("bad_id", ["", "fed/1", "fed+", "fed#", "f" * 65, "x\n"])
def test_federation_and_sender_ids_are_validated(bad_id: str) -> None:
    with pytest.raises(ValidationError):
        m.Heartbeat(federation=bad_id, round=0, sender="dev-01", seq=0)
    with pytest.raises(ValidationError):
        m.Heartbeat(federation="fed", round=0, sender=bad_id, seq=0)


def test_negative_round_is_rejected() -> None:
    with pytest.raises(ValidationError):
        m.Heartbeat(federation="fed", round=-1, sender="dev-01", seq=0)


def test_hello_sender_must_be_the_enrolling_device() -> None:
    m.Hello(**DEV, device_id="dev-01", x25519_public=KEY, ed25519_public=KEY)

    with pytest.raises(ValidationError, match="sender must equal device_id"):
        m.Hello(**DEV, device_id="dev-02", x25519_public=KEY, ed25519_public=KEY)


def test_hello_keys_must_be_32_bytes() -> None:
    with pytest.raises(ValidationError):
        m.Hello(**DEV, device_id="dev-01", x25519_public=KEY[:31], ed25519_public=KEY)


def test_key_epoch_accepts_the_dubhe_default_registry_parameters() -> None:
    epoch = _epoch()

    assert epoch.groups == (1, 2, 10)
    assert epoch.signature == b""


@pytest.mark.parametrize(
    "overrides",
    [
        {"groups": (2, 1, 10)},
        {"groups": (1, 1, 10)},
        {"groups": (1, 2)},
        {"sigma": (0.5, 0.0)},
        {"sigma": (0.5, 0.3, 0.1)},
        {"sigma": (1.5, 0.3, 0.0)},
        {"sigma": (float("nan"), 0.3, 0.0)},
        {"num_classes": 1, "groups": (1,), "sigma": (0.0,)},
        {"max_parties": 0},
        {"agent": m.COORDINATOR},
        {"agent_keys": _keys("dev-08")},
    ],
)
def test_key_epoch_rejects_inconsistent_registry_parameters(
    overrides: dict[str, Any],
) -> None:
    with pytest.raises(ValidationError):
        _epoch(**overrides)


@pytest.mark.parametrize("length", [1, 32, 63, 65])
def test_signature_is_empty_or_exactly_64_bytes(length: int) -> None:
    with pytest.raises(ValidationError):
        m.AgentAnswer(**DEV, best_try=0, signature=bytes(length))
    assert len(m.AgentAnswer(**DEV, best_try=0, signature=bytes(64)).signature) == 64


def test_selection_result_rejects_duplicates_and_empty_lists() -> None:
    with pytest.raises(ValidationError, match="unique"):
        m.SelectionResult(**COORD, selected=("a", "b", "a"))
    with pytest.raises(ValidationError):
        m.SelectionResult(**COORD, selected=())


def test_ring_needs_at_least_three_distinct_devices() -> None:
    m.RingStart(**COORD, ring_id="r1", order=("a", "b", "c"), hop_deadline_s=5.0)

    with pytest.raises(ValidationError):
        m.RingStart(**COORD, ring_id="r1", order=("a", "b"), hop_deadline_s=5.0)


def test_seal_request_rejects_a_device_listed_twice() -> None:
    keys = m.DeviceKeys(device_id="a", x25519_public=KEY, ed25519_public=KEY)

    with pytest.raises(ValidationError, match="unique"):
        m.SealRequest(**COORD, epoch=1, recipients=(keys, keys))


def test_a_seal_request_page_lies_within_its_pages_and_its_size() -> None:
    keys = tuple(
        m.DeviceKeys(device_id=f"d{i}", x25519_public=KEY, ed25519_public=KEY)
        for i in range(m.SEAL_PAGE_SIZE + 1)
    )
    m.SealRequest(**COORD, epoch=1, page=1, pages=2, recipients=keys[:-1])

    with pytest.raises(ValidationError, match="page 2 of 2"):
        m.SealRequest(**COORD, epoch=1, page=2, pages=2, recipients=keys[:1])
    with pytest.raises(ValidationError):
        m.SealRequest(**COORD, epoch=1, page=0, pages=1, recipients=keys)


def test_sealed_keys_name_each_recipient_once() -> None:
    box = m.SealedBox(recipient="a", box=b"x")

    with pytest.raises(ValidationError, match="unique"):
        m.SealedKeys(**COORD, epoch=1, page=0, boxes=(box, box))
    with pytest.raises(ValidationError):
        m.SealedKeys(**COORD, epoch=1, page=0, boxes=())


def test_try_sums_need_one_member_count_per_sum() -> None:
    with pytest.raises(ValidationError, match="one entry per sum"):
        m.TrySums(**COORD, sums=(b"a", b"b"), member_counts=(5,))


def test_volunteer_needs_between_one_and_max_tries_draws() -> None:
    with pytest.raises(ValidationError):
        m.Volunteer(**DEV, draws=())
    with pytest.raises(ValidationError):
        m.Volunteer(**DEV, draws=(True,) * (m.MAX_TRIES + 1))


def test_model_update_needs_exactly_one_of_transfer_and_inline_weights() -> None:
    m.ModelUpdate(**DEV, base_version=1, num_examples=10, weights=b"w")
    m.ModelUpdate(**DEV, base_version=1, num_examples=10, transfer_id="t1")

    neither: dict[str, Any] = {}
    both: dict[str, Any] = {"weights": b"w", "transfer_id": "t1"}
    for extra in (neither, both):
        with pytest.raises(ValidationError, match="exactly one"):
            m.ModelUpdate(**DEV, base_version=1, num_examples=10, **extra)


def test_inline_blobs_are_non_empty_and_at_most_one_chunk() -> None:
    with pytest.raises(ValidationError):
        m.Registration(**DEV, epoch=1, registry=b"")
    with pytest.raises(ValidationError):
        m.Registration(**DEV, epoch=1, registry=bytes(m.MAX_CHUNK_SIZE + 1))


@pytest.mark.parametrize(
    ("total", "size", "count"), [(0, 10, 0), (1, 10, 1), (10, 10, 1), (11, 10, 2)]
)
def test_manifest_chunk_count_is_the_ceiling(total: int, size: int, count: int) -> None:
    manifest = m.TransferManifest(
        **COORD,
        transfer_id="t1",
        purpose="model",
        total_size=total,
        chunk_size=size,
        chunk_count=count,
        sha256="0" * 64,
    )

    assert sum(manifest.chunk_length(i) for i in range(count)) == total
    with pytest.raises(ValidationError, match="ceil"):
        manifest.model_validate({**manifest.model_dump(), "chunk_count": count + 1})


def test_manifest_chunk_length_rejects_indices_out_of_range() -> None:
    manifest = m.TransferManifest(
        **COORD,
        transfer_id="t1",
        purpose="model",
        total_size=25,
        chunk_size=10,
        chunk_count=3,
        sha256="a" * 64,
    )

    assert [manifest.chunk_length(i) for i in range(3)] == [10, 10, 5]
    with pytest.raises(IndexError):
        manifest.chunk_length(3)


def test_manifest_rejects_a_malformed_sha256() -> None:
    with pytest.raises(ValidationError):
        m.TransferManifest(
            **COORD,
            transfer_id="t1",
            purpose="model",
            total_size=1,
            chunk_size=1,
            chunk_count=1,
            sha256="A" * 64,
        )


def test_error_reply_accepts_error_codes_and_new_code_names() -> None:
    reply = m.ErrorReply(**COORD, code=m.ErrorCode.WRONG_ROUND, reason="round 1 over")

    assert reply.code == "wrong_round"
    assert m.ErrorReply(**COORD, code="added_later", reason="").code == "added_later"
    with pytest.raises(ValidationError):
        m.ErrorReply(**COORD, code="Not A Code", reason="")


def test_a_refusal_names_its_message_by_id_and_digest() -> None:
    digest = "ab" * 32
    reply = m.ErrorReply(
        **DEV, code="x", reason="", in_reply_to="m1", in_reply_to_digest=digest
    )

    assert decode(encode(reply)) == reply
    assert m.ErrorReply(**DEV, code="x", reason="").in_reply_to_digest is None
    with pytest.raises(ValidationError, match="without in_reply_to"):
        m.ErrorReply(**DEV, code="x", reason="", in_reply_to_digest=digest)
    for bad in ("AB" * 32, "ab" * 31, "zz" * 32):
        with pytest.raises(ValidationError):
            m.ErrorReply(
                **DEV, code="x", reason="", in_reply_to="m1", in_reply_to_digest=bad
            )
    with pytest.raises(ValidationError):
        m.ErrorReply(**DEV, code="x", reason="", signature=b"short")


def test_key_epoch_carries_the_agent_keys_under_the_signature() -> None:
    epoch = _epoch()
    swapped = epoch.model_copy(update={"agent_keys": _keys("dev-07", OTHER_KEY)})

    assert decode(encode(epoch)) == epoch
    assert signing_bytes(swapped) != signing_bytes(epoch)
    with pytest.raises(ValidationError):
        m.KeyEpochStart.model_validate(
            {k: v for k, v in epoch.model_dump().items() if k != "agent_keys"}
        )


def test_identity_keys_allow_the_coordinator_but_device_keys_do_not() -> None:
    coordinator = m.IdentityKeys(
        device_id=m.COORDINATOR, x25519_public=KEY, ed25519_public=KEY
    )
    assert coordinator.device_id == m.COORDINATOR
    with pytest.raises(ValidationError):
        _keys(m.COORDINATOR)
    with pytest.raises(ValidationError):
        m.DeviceKeys(device_id="a", x25519_public=KEY[:31], ed25519_public=KEY)


def test_enrol_result_carries_the_coordinator_keys_only_on_acceptance() -> None:
    keys = m.IdentityKeys(
        device_id=m.COORDINATOR, x25519_public=KEY, ed25519_public=KEY
    )
    result = m.EnrolResult(
        **COORD, device_id="dev-01", accepted=True, coordinator_keys=keys
    )
    assert decode(encode(result)) == result
    assert (
        m.EnrolResult(**COORD, device_id="dev-01", accepted=True).coordinator_keys
        is None
    )

    with pytest.raises(ValidationError, match="device_id 'coordinator'"):
        m.EnrolResult(
            **COORD,
            device_id="dev-01",
            accepted=True,
            coordinator_keys=keys.model_copy(update={"device_id": "dev-02"}),
        )
    with pytest.raises(ValidationError, match="refusal"):
        m.EnrolResult(
            **COORD, device_id="dev-01", accepted=False, coordinator_keys=keys
        )


def test_flicker_steps_name_their_run_and_a_positive_step() -> None:
    request = m.CosineRequest(**COORD, run_id="ring-1", step=3, ciphertext=b"c")
    reply = m.CountUpdate(**DEV, run_id="ring-1", step=1, delta=b"d", saturated=True)

    assert (request.run_id, request.step, request.round) == ("ring-1", 3, 2)
    assert decode(encode(reply)) == reply
    for bad in ({"step": 0}, {"run_id": "a/b"}, {"run_id": ""}):
        with pytest.raises(ValidationError):
            m.ResampleRequest.model_validate(
                {**COORD, "run_id": "r", "step": 1, "nabla_client": 0.05, **bad}
            )
    with pytest.raises(ValidationError):
        m.CosineReply(**DEV, masked_product=b"x")  # type: ignore[call-arg]


RUN: dict[str, Any] = {"run_id": "ring-1", "step": 2}
LAYOUT: dict[str, Any] = {"block_slots": 4, "per_ciphertext": 16, "ciphertexts": 1}


def test_redundancy_offer_names_a_peer_of_its_peer_list_but_not_its_sender() -> None:
    offer = m.RedundancyOffer(
        **DEV, **RUN, **LAYOUT, recipient="dev-02", recipients=("dev-02",), box=b"b"
    )
    assert decode(encode(offer)) == offer
    for bad in (
        {"recipient": "dev-03"},
        {"recipients": ("dev-02", "dev-01")},
        {"recipients": ("dev-02", "dev-02")},
        {"block_slots": 3},
        {"per_ciphertext": 0},
        {"ciphertexts": m.MAX_REDUNDANCY_CIPHERTEXTS + 1},
    ):
        fields = {"recipient": "dev-02", "recipients": ("dev-02",), "box": b"b"}
        with pytest.raises(ValidationError):
            m.RedundancyOffer.model_validate({**DEV, **RUN, **LAYOUT, **fields, **bad})


def test_redundancy_reply_carries_the_box_in_part_zero_only() -> None:
    first = m.RedundancyReply(**DEV, **RUN, part=0, parts=2, products=b"p", box=b"b")
    second = m.RedundancyReply(**DEV, **RUN, part=1, parts=2, products=b"p")

    assert (first.box, second.box) == (b"b", None)
    for bad in (
        {"part": 0, "box": None},
        {"part": 1, "box": b"b"},
        {"part": 2, "box": None},
    ):
        with pytest.raises(ValidationError):
            m.RedundancyReply.model_validate(
                {**DEV, **RUN, "parts": 2, "products": b"p", **bad}
            )


def test_redundancy_result_names_one_peer_of_its_list_or_none() -> None:
    common = {**COORD, **RUN, "vector_slots": 64}
    empty = m.RedundancyResult(**common, peers=())
    one = m.RedundancyResult(
        **common, peers=("dev-02",), peer="dev-02", box=b"b", signs=b"s"
    )

    assert empty.peer is None and decode(encode(one)) == one
    for bad in (
        {"peers": ("dev-02",)},
        {"peers": (), "peer": "dev-02", "box": b"b", "signs": b"s"},
        {"peers": ("dev-02",), "peer": "dev-03", "box": b"b", "signs": b"s"},
        {"peers": ("dev-02",), "peer": "dev-02", "box": b"b"},
        {"peers": (), "vector_slots": 48},
    ):
        with pytest.raises(ValidationError):
            m.RedundancyResult.model_validate({**common, **bad})


def test_the_run_is_a_common_field_covered_by_the_signature() -> None:
    beat = m.Heartbeat(**DEV, seq=1)
    assert beat.run == ""  # a sender that joined no run yet
    in_run = beat.model_copy(update={"run": "0123abcd"})
    assert decode(encode(in_run)).run == "0123abcd"
    assert signing_bytes(in_run) != signing_bytes(beat)
    with pytest.raises(ValidationError):
        m.Heartbeat(**DEV, run="not a run!", seq=1)
    with pytest.raises(ValidationError):
        m.Heartbeat(**DEV, run="x" * 65, seq=1)


def test_the_agent_splits_a_page_of_boxes_by_its_byte_budget() -> None:
    from ursa.protocol.messages import (
        MAX_BOX_BYTES,
        SEALED_KEYS_BUDGET,
        SealedBox,
        split_boxes,
    )

    boxes = [SealedBox(recipient=f"d{i}", box=bytes(MAX_BOX_BYTES)) for i in range(40)]

    parts = split_boxes(boxes)

    assert [b for part in parts for b in part] == boxes
    assert all(sum(len(b.box) for b in p) <= SEALED_KEYS_BUDGET for p in parts)
    assert len(parts) == 3  # 16 + 16 + 8


def _spec(*tensors: tuple[str, tuple[int, ...], str]) -> m.ModelSpec:
    return m.ModelSpec.of("classifier", tensors)


def test_the_model_spec_is_signed_with_the_epoch_and_round_trips() -> None:
    spec = _spec(("fc.weight", (3, 8), "float"), ("bn.num_batches_tracked", (), "int"))
    notice = _epoch(model_spec=spec)

    back = decode(encode(notice))
    assert isinstance(back, m.KeyEpochStart) and back.model_spec == spec
    assert back.model_spec.triples() == (
        ("fc.weight", (3, 8), "float"),
        ("bn.num_batches_tracked", (), "int"),
    )
    assert signing_bytes(_epoch(model_spec=spec)) != signing_bytes(
        _epoch(model_spec=_spec(("fc.weight", (10, 8), "float")))
    )
    assert _epoch().model_spec is None  # a federation that trains no model


@pytest.mark.parametrize(
    "tensors",
    [
        (),  # no tensor
        (("w", (3,), "float"), ("w", (3,), "float")),  # a name twice
        (("", (3,), "float"),),
        (("w" * 257, (3,), "float"),),
        (("w", (1,) * 9, "float"),),  # too many dimensions
        (("w", (2**32,), "float"),),
        (("w", (-1,), "float"),),
        (("w", (2**18, 2**18 + 1), "float"),),  # more than 2^36 values
        (("w", (3,), "complex"),),
    ],
)
def test_a_model_spec_past_its_bounds_is_refused(tensors: Any) -> None:
    with pytest.raises(ValidationError):
        m.ModelSpec(
            model="classifier",
            tensors=tuple({"name": n, "shape": s, "kind": k} for n, s, k in tensors),
        )


def test_a_model_spec_lists_at_most_4096_tensors_of_bounded_names() -> None:
    many = tuple((f"t{i}", (1,), "float") for i in range(m.MAX_SPEC_TENSORS + 1))
    with pytest.raises(ValidationError):
        _spec(*many)
    long_names = tuple((f"{i:04d}" + "n" * 200, (1,), "float") for i in range(700))
    with pytest.raises(ValidationError, match="tensor names longer than"):
        _spec(*long_names)
    largest = _spec(*((f"{i:0200d}", (2,) * 8, "float") for i in range(640)))
    assert len(encode(_epoch(model_spec=largest))) < 256 * 1024
