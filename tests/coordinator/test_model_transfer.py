"""Model transfers: purposes, re-request answers, capped device uploads."""

from __future__ import annotations

import pytest

from ursa.coordinator.model_transfer import (
    UPDATE_PURPOSE,
    OutgoingModels,
    RequestBudgetError,
    RequestTooSoonError,
    SecondUploadError,
    TransferRejectedError,
    Uploads,
    model_purpose,
)
from ursa.protocol.chunking import split
from ursa.protocol.messages import Chunk, ChunkRequest, TransferManifest
from ursa.protocol.transfer_encoding import decode_payload


def test_a_version_is_named_in_its_purpose() -> None:
    assert model_purpose("classifier", 12) == "classifier.v12"


def test_a_re_request_gets_the_manifest_then_the_chunks() -> None:
    outgoing = OutgoingModels("f", chunk_size=4, keep=2)
    manifest, chunks = outgoing.publish("classifier", 1, b"0123456789", 1)
    request = ChunkRequest(
        federation="f", round=1, sender="d1", transfer_id=manifest.transfer_id,
        indices=(2, 0),
    )  # fmt: skip

    replies = outgoing.answer("d1", request, now=1)

    assert replies[0] == manifest
    assert [c.index for c in replies[1:]] == [2, 0]  # type: ignore[attr-defined]
    assert len(chunks) >= 3 and manifest.encoding == "planes_zlib"
    wire = b"".join(c.data for c in chunks)
    assert decode_payload(wire, "planes_zlib", max_size=10) == b"0123456789"
    outgoing.publish("classifier", 2, b"x", 2)
    assert outgoing.answer("d1", request, now=2)[0] == manifest  # the open round's base
    outgoing.publish("classifier", 3, b"y", 3)
    with pytest.raises(TransferRejectedError, match="not a current model"):
        outgoing.answer("d1", request, now=3)  # version 1 has aged out


def test_each_device_has_a_few_requests_per_version() -> None:
    outgoing = OutgoingModels("f", chunk_size=4, keep=1, max_requests=2)
    manifest, _ = outgoing.publish("classifier", 1, b"0123456789", 1)
    request = ChunkRequest(
        federation="f", round=1, sender="d1", transfer_id=manifest.transfer_id,
        indices=(0, 1, 2),
    )  # fmt: skip
    outgoing.answer("d1", request, now=4)
    outgoing.answer("d1", request, now=5)

    with pytest.raises(RequestBudgetError, match="at most 2"):
        outgoing.answer("d1", request, now=6)
    # another device's own budget
    assert len(outgoing.answer("d2", request, now=7)) == 4
    with pytest.raises(TransferRejectedError, match="unknown chunk"):
        outgoing.answer("d2", request.model_copy(update={"indices": (7,)}), now=8)
    tid = manifest.transfer_id
    assert outgoing.requests("d2", tid) == 1  # a refused request is not counted
    again, _ = outgoing.publish("classifier", 1, b"0123456789", 1)
    assert again == manifest and outgoing.requests("d1", tid) == 2  # a re-publish
    latest, _ = outgoing.publish("classifier", 2, b"0123", 2)
    assert outgoing.requests("d1", latest.transfer_id) == 0  # its own budget
    answered = outgoing.answer("d1", request.model_copy(
        update={"transfer_id": latest.transfer_id, "indices": (0,)}
    ), now=9)  # fmt: skip
    assert answered[0] == latest


def test_a_device_asking_again_too_soon_is_refused_and_not_counted() -> None:
    outgoing = OutgoingModels("f", chunk_size=4, min_interval_s=1.0)
    manifest, _ = outgoing.publish("classifier", 1, b"0123456789", 1)
    request = ChunkRequest(
        federation="f", round=1, sender="d1", transfer_id=manifest.transfer_id,
        indices=(0,),
    )  # fmt: skip
    outgoing.answer("d1", request, now=10.0)

    with pytest.raises(RequestTooSoonError, match="one per 1 s"):
        outgoing.answer("d1", request, now=10.5)
    assert outgoing.requests("d1", manifest.transfer_id) == 1
    assert outgoing.answer("d2", request, now=10.5)[0] == manifest  # its own clock
    assert outgoing.answer("d1", request, now=11.0)[0] == manifest


def test_a_version_goes_once_to_each_device_it_is_delivered_to() -> None:
    outgoing = OutgoingModels("f", chunk_size=4)
    _, chunks = outgoing.publish("classifier", 1, b"0123456789", 1)
    sent = outgoing.deliveries("classifier", 1, b"0123456789", 1, ["d1", "d2", "d1"])

    assert [(m.kind, to) for m, to in sent] == [
        (kind, device)
        for device in ("d1", "d2")
        for kind in ("transfer_manifest", *["chunk"] * len(chunks))
    ]
    assert outgoing.deliveries("classifier", 1, b"0123456789", 1, ["d1"]) == []
    later = outgoing.deliveries("classifier", 1, b"0123456789", 1, ["d1", "d3"])
    assert {to for _, to in later} == {"d3"}
    tid = sent[0][0].transfer_id  # type: ignore[attr-defined]
    assert outgoing.pushed_to(tid) == {"d1", "d2", "d3"}
    outgoing.redeliver()  # a restart: what went out may not have arrived
    assert {to for _, to in outgoing.deliveries(
        "classifier", 1, b"0123456789", 1, ["d1"]
    )} == {"d1"}  # fmt: skip


def test_a_broadcast_version_is_not_pushed_to_devices_again() -> None:
    outgoing = OutgoingModels("f", chunk_size=4)
    everyone = outgoing.deliveries("classifier", 1, b"0123456789", 1, None)
    _, chunks = outgoing.publish("classifier", 1, b"0123456789", 1)

    assert len(everyone) == 1 + len(chunks) and {to for _, to in everyone} == {None}
    assert outgoing.deliveries("classifier", 1, b"0123456789", 1, None) == []
    assert outgoing.deliveries("classifier", 1, b"0123456789", 1, ["d1"]) == []
    assert outgoing.pushed_to(everyone[0][0].transfer_id) is None  # type: ignore[attr-defined]


def _upload(
    payload: bytes, sender: str, transfer_id: str
) -> tuple[TransferManifest, list[Chunk]]:
    return split(
        payload, purpose=UPDATE_PURPOSE, federation="f", round=1, sender=sender,
        chunk_size=4, transfer_id=transfer_id,
    )  # fmt: skip


def test_one_upload_per_device_and_round() -> None:
    uploads = Uploads(max_transfer_bytes=16, max_total_bytes=32)
    first, chunks = _upload(b"abcdefghij", "d1", "t1")
    second, _ = _upload(b"0123", "d1", "t2")
    uploads.on_manifest("d1", first)
    uploads.on_manifest("d1", first)  # a retransmission is no second upload

    with pytest.raises(SecondUploadError, match="one upload per device"):
        uploads.on_manifest("d1", second)
    for chunk in chunks:
        uploads.on_chunk("d1", chunk)
    uploads.forget("t1")  # used
    with pytest.raises(SecondUploadError):
        uploads.on_manifest("d1", second)  # still one per round
    uploads.on_manifest("d2", _upload(b"z" * 16, "d2", "t3")[0])  # not held back


def test_uploads_reassemble_and_refuse_strangers_and_oversize() -> None:
    uploads = Uploads(max_transfer_bytes=16, max_total_bytes=32)
    manifest, chunks = split(
        b"abcdefghij", purpose=UPDATE_PURPOSE, federation="f", round=1, sender="d1",
        chunk_size=4, transfer_id="t1",
    )  # fmt: skip
    uploads.on_manifest("d1", manifest)
    with pytest.raises(TransferRejectedError, match="unknown transfer"):
        uploads.on_chunk("d2", chunks[0])
    request = uploads.missing_request("d1", "t1", federation="f", round_index=1)
    assert request is not None and request.indices == (0, 1, 2)

    done = [uploads.on_chunk("d1", c) for c in chunks]

    assert done == [False, False, True]
    assert uploads.payload("d1", "t1") == b"abcdefghij"
    assert uploads.payload("d2", "t1") is None
    big, _ = split(
        b"z" * 20, purpose=UPDATE_PURPOSE, federation="f", round=1, sender="d2",
        chunk_size=8, transfer_id="t2",
    )  # fmt: skip
    with pytest.raises(TransferRejectedError, match="exceeds"):
        uploads.on_manifest("d2", big)
    other = TransferManifest.model_validate(
        {**manifest.model_dump(), "purpose": "classifier.v1", "transfer_id": "t3"}
    )
    with pytest.raises(TransferRejectedError, match="uploads only"):
        uploads.on_manifest("d3", other)
