from __future__ import annotations

import hashlib
import random
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.protocol.chunking import Reassembler, select_chunks, split
from ursa.protocol.envelope import decode, encode
from ursa.protocol.errors import ChunkError, OversizeError
from ursa.protocol.messages import (
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_COUNT,
    MAX_CHUNK_SIZE,
    BaseMessage,
    Chunk,
    TransferManifest,
)

COMMON: dict[str, Any] = {"federation": "fed", "round": 1, "sender": "coordinator"}
M = TypeVar("M", bound=BaseMessage)


def _wire(message: M) -> M:
    decoded = decode(encode(message))
    assert isinstance(decoded, type(message))
    return decoded


def _payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def _split(payload: bytes, chunk_size: int) -> tuple[TransferManifest, list[Chunk]]:
    return split(payload, purpose="model", chunk_size=chunk_size, **COMMON)


@st.composite
def boundary_sizes(draw: st.DrawFn) -> tuple[int, int]:
    chunk_size = draw(st.integers(min_value=1, max_value=64))
    whole = draw(st.integers(min_value=0, max_value=5))
    offset = draw(st.sampled_from([-1, 0, 1]))
    return chunk_size, max(0, whole * chunk_size + offset)


@settings(max_examples=150, deadline=None)
@given(
    sizes=boundary_sizes(),
    seed=st.integers(min_value=0, max_value=2**32),
    duplicates=st.integers(min_value=0, max_value=4),
)
def test_split_and_reassemble_in_any_order_with_duplicates(
    sizes: tuple[int, int], seed: int, duplicates: int
) -> None:
    chunk_size, size = sizes
    payload = _payload(size, seed)
    manifest, chunks = _split(payload, chunk_size)
    rng = random.Random(seed)
    delivery = chunks + [rng.choice(chunks) for _ in range(duplicates if chunks else 0)]
    rng.shuffle(delivery)
    reassembler = Reassembler()

    assert reassembler.add_manifest(manifest)
    added = [reassembler.add_chunk(c) for c in delivery]

    assert sum(added) == len(chunks) == -(-size // chunk_size)
    assert reassembler.missing(manifest.transfer_id) == ()
    assert reassembler.complete(manifest.transfer_id) == payload
    assert reassembler.transfer_ids == ()


@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        DEFAULT_CHUNK_SIZE - 1,
        DEFAULT_CHUNK_SIZE,
        DEFAULT_CHUNK_SIZE + 1,
        3 * DEFAULT_CHUNK_SIZE + 5,
    ],
)
def test_default_chunk_size_boundaries(size: int) -> None:
    payload = _payload(size)
    manifest, chunks = split(payload, purpose="model", **COMMON)
    reassembler = Reassembler()
    reassembler.add_manifest(_wire(manifest))

    for chunk in reversed(chunks):
        reassembler.add_chunk(_wire(chunk))

    assert manifest.chunk_size == DEFAULT_CHUNK_SIZE
    assert all(len(c.data) <= DEFAULT_CHUNK_SIZE for c in chunks)
    assert reassembler.complete(manifest.transfer_id) == payload


def test_empty_payload_has_no_chunks_and_completes_at_once() -> None:
    manifest, chunks = _split(b"", 16)
    reassembler = Reassembler()
    reassembler.add_manifest(manifest)

    assert chunks == []
    assert reassembler.is_complete(manifest.transfer_id)
    assert reassembler.complete(manifest.transfer_id) == b""
    assert manifest.sha256 == hashlib.sha256(b"").hexdigest()


def test_missing_chunks_are_reported_requested_and_filled() -> None:
    payload = _payload(100)
    manifest, chunks = _split(payload, 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    for chunk in chunks:
        if chunk.index not in (2, 7, 9):
            receiver.add_chunk(chunk)

    assert receiver.missing(manifest.transfer_id) == (2, 7, 9)
    assert not receiver.is_complete(manifest.transfer_id)
    with pytest.raises(ChunkError, match="3 chunk"):
        receiver.complete(manifest.transfer_id)
    request = receiver.chunk_request(
        manifest.transfer_id, federation="fed", round=1, sender="dev-1"
    )
    assert request is not None
    assert request.indices == (2, 7, 9)
    resent = select_chunks(chunks, _wire(request))
    assert [c.index for c in resent] == [2, 7, 9]

    for chunk in resent:
        receiver.add_chunk(chunk)

    assert (
        receiver.chunk_request(
            manifest.transfer_id, federation="fed", round=1, sender="dev-1"
        )
        is None
    )
    assert receiver.complete(manifest.transfer_id) == payload


def test_chunk_request_can_be_limited() -> None:
    manifest, _ = _split(_payload(100), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)

    request = receiver.chunk_request(
        manifest.transfer_id, federation="fed", round=1, sender="d", max_indices=4
    )

    assert request is not None
    assert request.indices == (0, 1, 2, 3)


def test_select_chunks_rejects_unknown_indices() -> None:
    manifest, chunks = _split(_payload(30), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    request = receiver.chunk_request(
        manifest.transfer_id, federation="fed", round=1, sender="d"
    )
    assert request is not None

    with pytest.raises(ChunkError, match="unknown chunk"):
        select_chunks(chunks[:2], request)


def test_sha_mismatch_raises_and_asks_for_every_chunk_again() -> None:
    payload = _payload(50)
    manifest, chunks = _split(payload, 10)
    forged = manifest.model_copy(update={"sha256": hashlib.sha256(b"x").hexdigest()})
    receiver = Reassembler()
    receiver.add_manifest(forged)
    for chunk in chunks:
        receiver.add_chunk(chunk)

    with pytest.raises(ChunkError, match="sha256 mismatch"):
        receiver.complete(manifest.transfer_id)
    assert receiver.missing(manifest.transfer_id) == (0, 1, 2, 3, 4)


def test_tampered_chunk_of_the_right_length_fails_the_hash() -> None:
    manifest, chunks = _split(_payload(30), 10)
    chunks[1] = chunks[1].model_copy(update={"data": bytes(10)})
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    for chunk in chunks:
        receiver.add_chunk(chunk)

    with pytest.raises(ChunkError, match="sha256"):
        receiver.complete(manifest.transfer_id)


def test_chunk_index_out_of_range_is_rejected() -> None:
    manifest, chunks = _split(_payload(30), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    beyond = chunks[0].model_copy(update={"index": 3})

    with pytest.raises(ChunkError, match="out of range"):
        receiver.add_chunk(beyond)


@pytest.mark.parametrize(("index", "length"), [(0, 9), (0, 11), (2, 10), (2, 4)])
def test_chunk_of_the_wrong_length_is_rejected(index: int, length: int) -> None:
    manifest, chunks = _split(_payload(25), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    wrong = chunks[index].model_copy(update={"data": bytes(length)})

    with pytest.raises(ChunkError, match="expected"):
        receiver.add_chunk(wrong)


def test_chunk_before_its_manifest_is_rejected() -> None:
    _, chunks = _split(_payload(30), 10)

    with pytest.raises(ChunkError, match="no manifest"):
        Reassembler().add_chunk(chunks[0])


def test_chunk_from_another_sender_is_rejected() -> None:
    manifest, chunks = _split(_payload(30), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)

    with pytest.raises(ChunkError, match="sender"):
        receiver.add_chunk(chunks[0].model_copy(update={"sender": "intruder"}))


def test_conflicting_duplicate_chunk_is_rejected() -> None:
    manifest, chunks = _split(_payload(30), 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    receiver.add_chunk(chunks[0])

    assert (
        receiver.add_chunk(chunks[0].model_copy(update={"message_id": "again"}))
        is False
    )
    with pytest.raises(ChunkError, match="earlier copy"):
        receiver.add_chunk(chunks[0].model_copy(update={"data": bytes(10)}))


def test_manifest_is_idempotent_but_a_different_one_is_rejected() -> None:
    manifest, _ = _split(_payload(30), 10)
    receiver = Reassembler()

    assert receiver.add_manifest(manifest) is True
    assert receiver.add_manifest(manifest.model_copy(update={"round": 5})) is False
    with pytest.raises(ChunkError, match="manifest differs"):
        receiver.add_manifest(manifest.model_copy(update={"sha256": "0" * 64}))


def test_late_duplicates_of_a_completed_transfer_are_ignored() -> None:
    payload = _payload(30)
    manifest, chunks = _split(payload, 10)
    receiver = Reassembler()
    receiver.add_manifest(manifest)
    for chunk in chunks:
        receiver.add_chunk(chunk)
    receiver.complete(manifest.transfer_id)

    assert receiver.add_chunk(chunks[0]) is False
    assert receiver.add_manifest(manifest) is False
    assert receiver.transfer_ids == ()


def test_unknown_transfer_queries_raise_chunk_error() -> None:
    receiver = Reassembler()

    for query in (receiver.missing, receiver.complete, receiver.manifest):
        with pytest.raises(ChunkError, match="unknown transfer"):
            query("nope")


def test_per_transfer_cap_is_enforced_at_the_manifest() -> None:
    manifest, _ = _split(_payload(101), 10)

    with pytest.raises(OversizeError):
        Reassembler(max_transfer_bytes=100).add_manifest(manifest)


def test_total_cap_counts_reservations_and_discard_releases_them() -> None:
    first, _ = _split(_payload(60, 1), 10)
    second, _ = _split(_payload(60, 2), 10)
    receiver = Reassembler(max_total_bytes=100)
    receiver.add_manifest(first)

    assert receiver.reserved_bytes == 60
    with pytest.raises(OversizeError, match="in flight"):
        receiver.add_manifest(second)
    receiver.discard(first.transfer_id)
    assert receiver.reserved_bytes == 0
    assert receiver.add_manifest(second)


def test_transfer_count_is_capped() -> None:
    receiver = Reassembler(max_transfers=2)
    for seed in range(2):
        receiver.add_manifest(_split(_payload(5, seed), 10)[0])

    with pytest.raises(OversizeError, match="transfer count"):
        receiver.add_manifest(_split(_payload(5, 9), 10)[0])


@pytest.mark.parametrize("chunk_size", [0, -1, MAX_CHUNK_SIZE + 1])
def test_split_rejects_chunk_sizes_out_of_range(chunk_size: int) -> None:
    with pytest.raises(ChunkError, match="chunk_size"):
        _split(b"abc", chunk_size)


def test_split_rejects_more_chunks_than_a_manifest_can_describe() -> None:
    with pytest.raises(ChunkError, match="chunks exceed"):
        _split(bytes(MAX_CHUNK_COUNT + 1), 1)


def test_split_uses_the_given_transfer_id_and_common_fields() -> None:
    manifest, chunks = split(
        b"abcdef", purpose="ckks_context", chunk_size=4, transfer_id="ctx-1", **COMMON
    )

    assert manifest.transfer_id == "ctx-1"
    assert {c.transfer_id for c in chunks} == {"ctx-1"}
    assert [c.data for c in chunks] == [b"abcd", b"ef"]
    assert manifest.purpose == "ckks_context"
    assert all(c.sender == "coordinator" and c.round == 1 for c in chunks)


def test_a_request_budget_counts_per_receiver_and_transfer() -> None:
    from ursa.protocol.chunking import RequestBudget, RequestLimitError

    budget = RequestBudget(2)
    for _ in range(2):
        budget.check("d1", "t")
        budget.spend("d1", "t")
    with pytest.raises(RequestLimitError, match="at most 2"):
        budget.check("d1", "t")
    budget.check("d2", "t")  # another receiver
    budget.check("d1", "u")  # another transfer
    assert budget.used("d1", "t") == 2 and budget.max_requests == 2
    budget.forget("t")
    assert budget.used("d1", "t") == 0
    with pytest.raises(ValueError, match="positive"):
        RequestBudget(0)
