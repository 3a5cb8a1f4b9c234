"""Property-based fuzzing of the chunk reassembler (`ursa.protocol.chunking`).

Whatever arrives (duplicates, any order, garbled bytes, wrong indices,
lengths, senders or transfer ids, conflicting manifests), the `Reassembler`
either returns exactly the announced bytes or raises a typed error
(`ChunkError`; `OversizeError` for a manifest over a cap), and a transfer
garbled on the way still completes once the true chunks are re-sent.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ursa.protocol.chunking import Reassembler, split
from ursa.protocol.errors import ChunkError, OversizeError
from ursa.protocol.messages import Chunk, TransferManifest

COMMON: dict[str, Any] = {"federation": "fed", "round": 1, "sender": "dev-01"}
FUZZ = settings(max_examples=200, deadline=None)

_event = st.one_of(
    st.tuples(st.just("good"), st.integers(min_value=0)),
    st.tuples(
        st.just("flip"),
        st.integers(min_value=0),
        st.integers(min_value=0),
        st.integers(min_value=1, max_value=255),
    ),
    st.tuples(st.just("resize"), st.integers(min_value=0), st.binary(min_size=1)),
    st.tuples(st.just("index"), st.integers(min_value=0), st.integers(0, 70)),
    st.tuples(st.just("sender"), st.integers(min_value=0)),
    st.tuples(st.just("stranger"), st.integers(min_value=0)),
    st.tuples(st.just("manifest"), st.sampled_from(["same", "size", "sha", "who"])),
    st.tuples(st.just("complete")),
)


def _chunk(template: Chunk, **changes: Any) -> Chunk:
    return Chunk.model_validate({**template.model_dump(), **changes})


def _garbled(event: tuple[Any, ...], chunks: list[Chunk]) -> Chunk | None:
    """The chunk an event delivers (None: the event delivers no chunk)."""
    op = event[0]
    if op in ("manifest", "complete") or not chunks:
        return None
    chunk = chunks[event[1] % len(chunks)]
    if op == "good":
        return chunk
    if op == "flip":
        data = bytearray(chunk.data)
        data[event[2] % len(data)] ^= event[3]
        return _chunk(chunk, data=bytes(data))
    if op == "resize":
        return _chunk(chunk, data=event[2])
    if op == "index":
        return _chunk(chunk, index=event[2])
    if op == "sender":
        return _chunk(chunk, sender="dev-02")
    return _chunk(chunk, transfer_id="someone-else")


def _other_manifest(manifest: TransferManifest, variant: str) -> TransferManifest:
    if variant == "same":
        return manifest.model_copy()
    if variant == "who":
        return TransferManifest.model_validate(
            {**manifest.model_dump(), "sender": "dev-02"}
        )
    if variant == "sha":
        return TransferManifest.model_validate(
            {**manifest.model_dump(), "sha256": hashlib.sha256(b"x").hexdigest()}
        )
    size = manifest.total_size + 1
    return TransferManifest.model_validate(
        {
            **manifest.model_dump(),
            "total_size": size,
            "chunk_count": -(-size // manifest.chunk_size),
        }
    )


@FUZZ
@given(
    payload=st.binary(max_size=600),
    chunk_size=st.integers(min_value=1, max_value=64),
    events=st.lists(_event, max_size=60),
)
def test_any_delivery_reassembles_the_exact_bytes_or_raises_chunk_error(
    payload: bytes, chunk_size: int, events: list[tuple[Any, ...]]
) -> None:
    manifest, chunks = split(payload, purpose="model", chunk_size=chunk_size, **COMMON)
    tid = manifest.transfer_id
    reassembler = Reassembler()
    assert reassembler.add_manifest(manifest)
    done = False

    for event in events:
        if done:
            break
        try:
            if event[0] == "manifest":
                assert not reassembler.add_manifest(_other_manifest(manifest, event[1]))
            elif event[0] == "complete":
                assert reassembler.complete(tid) == payload
                done = True
            else:
                chunk = _garbled(event, chunks)
                if chunk is not None:
                    reassembler.add_chunk(chunk)
        except ChunkError:
            pass
        except ValidationError:
            pass  # a garbling no decoder would let through (e.g. index too big)

    for _ in range(2):  # the receiver re-requests; the sender re-sends the truth
        if done:
            break
        for chunk in chunks:
            with contextlib.suppress(ChunkError):  # a garbled copy came first
                reassembler.add_chunk(chunk)
        try:
            assert reassembler.complete(tid) == payload
            done = True
        except ChunkError:
            pass  # sha256 mismatch: the garbled chunks are dropped
    assert done
    assert reassembler.transfer_ids == ()


@st.composite
def manifests(draw: st.DrawFn) -> TransferManifest:
    total = draw(st.integers(min_value=0, max_value=300))
    size = draw(st.integers(min_value=1, max_value=40))
    content = draw(st.sampled_from([b"", b"abc", bytes(total)]))
    return TransferManifest(
        **{**COMMON, "sender": draw(st.sampled_from(["dev-01", "dev-02"]))},
        transfer_id=draw(st.sampled_from(["t1", "t2"])),
        purpose="model",
        total_size=total,
        chunk_size=size,
        chunk_count=-(-total // size),
        sha256=hashlib.sha256(content).hexdigest(),
    )


@st.composite
def chunks(draw: st.DrawFn) -> Chunk:
    return Chunk(
        **{**COMMON, "sender": draw(st.sampled_from(["dev-01", "dev-02"]))},
        transfer_id=draw(st.sampled_from(["t1", "t2", "t3"])),
        index=draw(st.integers(min_value=0, max_value=20)),
        data=draw(st.sampled_from([b"\x00" * 40, b"\x00" * 7, b"abc", b"\x00"])),
    )


@FUZZ
@given(
    st.lists(
        st.one_of(manifests(), chunks(), st.sampled_from(["t1", "t2", "t3"])),
        max_size=80,
    ),
    st.integers(min_value=0, max_value=1000),
)
def test_arbitrary_manifests_and_chunks_only_raise_typed_errors(
    events: list[Any], cap: int
) -> None:
    reassembler = Reassembler(max_transfer_bytes=cap, max_total_bytes=cap)
    announced: dict[str, TransferManifest] = {}

    for event in events:
        try:
            if isinstance(event, TransferManifest):
                if reassembler.add_manifest(event):
                    announced[event.transfer_id] = event
            elif isinstance(event, Chunk):
                reassembler.add_chunk(event)
            elif event in reassembler.transfer_ids:
                payload = reassembler.complete(event)
                manifest = announced[event]
                assert len(payload) == manifest.total_size
                assert hashlib.sha256(payload).hexdigest() == manifest.sha256
        except (ChunkError, OversizeError):
            pass
    assert reassembler.reserved_bytes <= cap
