"""Chunked transfer, pure: split a payload into manifest + chunks, reassemble it.

A payload larger than one message goes as a `TransferManifest` (size, chunk
layout, sha256) followed by `Chunk`s; the receiver re-requests what is missing
(`ChunkRequest`), and the sender answers with `select_chunks`. A `Reassembler`
accepts chunks in any order and any number of times, checks every index and
length against the manifest, verifies the sha256 on completion, and caps the
bytes it will hold (per transfer and in total) so that announcing huge
transfers cannot exhaust a device's memory. A sender answers re-requests
within a `RequestBudget` (a few per receiver and transfer), since a
200-byte request can ask for a whole payload. No I/O and no clock: the
caller decides when a stale transfer is `discard`ed.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ursa.protocol.errors import ChunkError, OversizeError
from ursa.protocol.messages import (
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_COUNT,
    MAX_CHUNK_SIZE,
    MAX_TRANSFER_BYTES,
    Chunk,
    ChunkRequest,
    TransferManifest,
)
from ursa.protocol.messages.transfer import TransferEncoding

DEFAULT_MAX_TRANSFER_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_TOTAL_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_TRANSFERS = 256
DEFAULT_MAX_REQUESTS = 8
"""Re-requests answered per receiver and transfer. An honest receiver asks
once when it missed the broadcast, again only when answers were lost."""
REMEMBERED_COMPLETED = 1024
"""Completed transfer ids remembered, so that late duplicates are ignored quietly."""


def split(
    payload: bytes,
    *,
    purpose: str,
    federation: str,
    round: int,
    sender: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    transfer_id: str | None = None,
    encoding: TransferEncoding = "identity",
) -> tuple[TransferManifest, list[Chunk]]:
    """Split a payload into a manifest and its chunks (an empty payload has none).

    ``payload`` is the bytes on the wire, already in ``encoding`` (which the
    manifest names; `ursa.protocol.transfer_encoding`).

    Raises:
        ChunkError: `chunk_size` outside [1, MAX_CHUNK_SIZE] or too many chunks.
        OversizeError: the payload exceeds MAX_TRANSFER_BYTES.
    """
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ChunkError(f"chunk_size {chunk_size} not in [1, {MAX_CHUNK_SIZE}]")
    if len(payload) > MAX_TRANSFER_BYTES:
        raise OversizeError("transfer", len(payload), MAX_TRANSFER_BYTES)
    count = -(-len(payload) // chunk_size)
    if count > MAX_CHUNK_COUNT:
        raise ChunkError(f"{count} chunks exceed {MAX_CHUNK_COUNT}; use larger chunks")
    tid = transfer_id if transfer_id is not None else uuid.uuid4().hex
    manifest = TransferManifest(
        federation=federation,
        round=round,
        sender=sender,
        transfer_id=tid,
        purpose=purpose,
        total_size=len(payload),
        chunk_size=chunk_size,
        chunk_count=count,
        sha256=hashlib.sha256(payload).hexdigest(),
        encoding=encoding,
    )
    chunks = [
        Chunk(
            federation=federation,
            round=round,
            sender=sender,
            transfer_id=tid,
            index=i,
            data=payload[i * chunk_size : (i + 1) * chunk_size],
        )
        for i in range(count)
    ]
    return manifest, chunks


def select_chunks(chunks: Sequence[Chunk], request: ChunkRequest) -> list[Chunk]:
    """The chunks a `ChunkRequest` asks for, in the requested order.

    Raises:
        ChunkError: the request names another transfer or an unknown index.
    """
    by_index = {c.index: c for c in chunks if c.transfer_id == request.transfer_id}
    unknown = [i for i in request.indices if i not in by_index]
    if unknown:
        raise ChunkError(
            f"request for transfer {request.transfer_id} names {len(unknown)} "
            f"unknown chunk(s), first {unknown[0]}"
        )
    return [by_index[i] for i in request.indices]


class RequestLimitError(ChunkError):
    """A receiver asked for a transfer more often than its `RequestBudget`."""


class RequestBudget:
    """How many re-requests of one transfer each receiver has had answered.

    Counts are kept per transfer id; `forget` drops a transfer's (when it is
    no longer served), so the table is bounded by transfers x receivers.
    """

    def __init__(self, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
        if max_requests < 1:
            raise ValueError("max_requests must be positive")
        self._max = max_requests
        self._counts: dict[str, dict[str, int]] = {}

    @property
    def max_requests(self) -> int:
        """Answers per receiver and transfer."""
        return self._max

    def used(self, receiver: str, transfer_id: str) -> int:
        """Requests of ``transfer_id`` answered for ``receiver`` so far."""
        return self._counts.get(transfer_id, {}).get(receiver, 0)

    def check(self, receiver: str, transfer_id: str) -> None:
        """Raise `RequestLimitError` if ``receiver`` has spent its requests."""
        used = self.used(receiver, transfer_id)
        if used >= self._max:
            raise RequestLimitError(
                f"{used} requests for transfer {transfer_id} answered already "
                f"(at most {self._max} per device and version)"
            )

    def spend(self, receiver: str, transfer_id: str) -> None:
        """Count one answered request."""
        counts = self._counts.setdefault(transfer_id, {})
        counts[receiver] = counts.get(receiver, 0) + 1

    def forget(self, transfer_id: str) -> None:
        """Drop a transfer's counts (it is no longer answered)."""
        self._counts.pop(transfer_id, None)


@dataclass
class _Transfer:
    manifest: TransferManifest
    chunks: dict[int, bytes] = field(default_factory=dict)


class Reassembler:
    """Collects chunks of concurrent transfers, keyed by transfer id.

    A transfer starts with its manifest; chunks must come from the manifest's
    sender. Duplicates (same index, same bytes) are ignored; a different
    manifest or different bytes under a known id are errors.
    """

    def __init__(
        self,
        *,
        max_transfer_bytes: int = DEFAULT_MAX_TRANSFER_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        max_transfers: int = DEFAULT_MAX_TRANSFERS,
    ) -> None:
        self._max_transfer_bytes = max_transfer_bytes
        self._max_total_bytes = max_total_bytes
        self._max_transfers = max_transfers
        self._transfers: dict[str, _Transfer] = {}
        self._completed: OrderedDict[str, None] = OrderedDict()

    @property
    def reserved_bytes(self) -> int:
        """Bytes reserved by the manifests of transfers in flight."""
        return sum(t.manifest.total_size for t in self._transfers.values())

    @property
    def transfer_ids(self) -> tuple[str, ...]:
        """Ids of transfers in flight (manifest received, not yet completed)."""
        return tuple(self._transfers)

    def manifest(self, transfer_id: str) -> TransferManifest:
        """The manifest of a transfer in flight (ChunkError if unknown)."""
        return self._get(transfer_id).manifest

    def add_manifest(self, manifest: TransferManifest) -> bool:
        """Start a transfer; False if it is already known (same manifest) or done.

        Raises:
            ChunkError: a different manifest under a known transfer id.
            OversizeError: the transfer would exceed a size or count cap.
        """
        tid = manifest.transfer_id
        if tid in self._completed:
            return False
        known = self._transfers.get(tid)
        if known is not None:
            if _layout(known.manifest) != _layout(manifest):
                raise ChunkError(f"transfer {tid}: manifest differs from the first")
            return False
        if manifest.total_size > self._max_transfer_bytes:
            raise OversizeError(
                "transfer", manifest.total_size, self._max_transfer_bytes
            )
        in_flight = self.reserved_bytes + manifest.total_size
        if in_flight > self._max_total_bytes:
            raise OversizeError("transfers in flight", in_flight, self._max_total_bytes)
        if len(self._transfers) >= self._max_transfers:
            raise OversizeError(
                "transfer count", len(self._transfers) + 1, self._max_transfers
            )
        self._transfers[tid] = _Transfer(manifest)
        return True

    def add_chunk(self, chunk: Chunk) -> bool:
        """Store a chunk; False for a duplicate or a chunk of a completed transfer.

        Raises:
            ChunkError: unknown transfer (no manifest yet: re-request it later),
                another sender, index out of range, wrong length, or different
                bytes than an earlier copy of the same chunk.
        """
        if chunk.transfer_id in self._completed:
            return False
        transfer = self._get(chunk.transfer_id)
        manifest = transfer.manifest
        where = f"transfer {chunk.transfer_id} chunk {chunk.index}"
        if chunk.sender != manifest.sender:
            raise ChunkError(f"{where}: sender differs from the manifest's")
        if chunk.index >= manifest.chunk_count:
            raise ChunkError(f"{where}: index out of range [0, {manifest.chunk_count})")
        expected = manifest.chunk_length(chunk.index)
        if len(chunk.data) != expected:
            raise ChunkError(f"{where}: {len(chunk.data)} bytes, expected {expected}")
        previous = transfer.chunks.get(chunk.index)
        if previous is not None:
            if previous != chunk.data:
                raise ChunkError(f"{where}: differs from an earlier copy")
            return False
        transfer.chunks[chunk.index] = chunk.data
        return True

    def missing(self, transfer_id: str) -> tuple[int, ...]:
        """Indices not yet received, ascending (ChunkError if unknown)."""
        transfer = self._get(transfer_id)
        count = transfer.manifest.chunk_count
        return tuple(i for i in range(count) if i not in transfer.chunks)

    def is_complete(self, transfer_id: str) -> bool:
        """Whether every chunk of a transfer in flight has arrived."""
        transfer = self._get(transfer_id)
        return len(transfer.chunks) == transfer.manifest.chunk_count

    def chunk_request(
        self,
        transfer_id: str,
        *,
        federation: str,
        round: int,
        sender: str,
        max_indices: int = MAX_CHUNK_COUNT,
    ) -> ChunkRequest | None:
        """A request for (up to `max_indices` of) the missing chunks, or None."""
        missing = self.missing(transfer_id)[:max_indices]
        if not missing:
            return None
        return ChunkRequest(
            federation=federation,
            round=round,
            sender=sender,
            transfer_id=transfer_id,
            indices=missing,
        )

    def complete(self, transfer_id: str) -> bytes:
        """Join and verify a finished transfer, then forget it.

        Raises:
            ChunkError: chunks are missing, or the sha256 does not match; on a
                mismatch the chunks are dropped (the manifest is kept) so that
                `missing()` asks for all of them again.
        """
        transfer = self._get(transfer_id)
        manifest = transfer.manifest
        lacking = manifest.chunk_count - len(transfer.chunks)
        if lacking:
            raise ChunkError(f"transfer {transfer_id}: {lacking} chunk(s) missing")
        payload = b"".join(transfer.chunks[i] for i in range(manifest.chunk_count))
        if hashlib.sha256(payload).hexdigest() != manifest.sha256:
            transfer.chunks.clear()
            raise ChunkError(f"transfer {transfer_id}: sha256 mismatch")
        del self._transfers[transfer_id]
        self._completed[transfer_id] = None
        if len(self._completed) > REMEMBERED_COMPLETED:
            self._completed.popitem(last=False)
        return payload

    def discard(self, transfer_id: str) -> None:
        """Forget a transfer in flight, releasing its reservation (no-op if unknown)."""
        self._transfers.pop(transfer_id, None)

    def _get(self, transfer_id: str) -> _Transfer:
        transfer = self._transfers.get(transfer_id)
        if transfer is None:
            raise ChunkError(f"unknown transfer {transfer_id!r} (no manifest)")
        return transfer


def _layout(manifest: TransferManifest) -> tuple[object, ...]:
    """The fields that define a transfer (not message id, time or round)."""
    return (
        manifest.sender,
        manifest.purpose,
        manifest.total_size,
        manifest.chunk_size,
        manifest.chunk_count,
        manifest.sha256,
        manifest.encoding,
    )
