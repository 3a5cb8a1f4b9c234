"""Chunked transfers: manifests, chunks and re-requests (one topic keeps order)."""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    MAX_CHUNK_COUNT,
    MAX_CHUNK_SIZE,
    MAX_TRANSFER_BYTES,
    TRANSFER,
    BaseMessage,
    Blob,
    Id,
    Name,
    Sha256Hex,
    unique_entries,
)

TransferEncoding = Literal["identity", "planes_zlib"]
"""How the chunks' bytes encode the payload (`ursa.protocol.transfer_encoding`)."""


class TransferManifest(BaseMessage):
    """Announces a payload sent as chunks: size, chunk layout and sha256.

    ``total_size`` and ``sha256`` are of the bytes on the wire; ``encoding``
    says how they decode to the payload (a global model: ``planes_zlib``).
    """

    kind: Literal["transfer_manifest"] = "transfer_manifest"
    topic: ClassVar[str] = TRANSFER
    transfer_id: Id
    purpose: Name
    total_size: Annotated[int, Field(ge=0, le=MAX_TRANSFER_BYTES)]
    chunk_size: Annotated[int, Field(ge=1, le=MAX_CHUNK_SIZE)]
    chunk_count: Annotated[int, Field(ge=0, le=MAX_CHUNK_COUNT)]
    sha256: Sha256Hex
    encoding: TransferEncoding = "identity"

    @_model_validator(mode="after")
    def _layout(self) -> Self:
        if self.chunk_count != math.ceil(self.total_size / self.chunk_size):
            raise ValueError("chunk_count must be ceil(total_size / chunk_size)")
        return self

    def chunk_length(self, index: int) -> int:
        """Exact byte length of chunk `index` (the last one may be shorter)."""
        if not 0 <= index < self.chunk_count:
            raise IndexError(f"chunk index {index} not in [0, {self.chunk_count})")
        return min(self.chunk_size, self.total_size - index * self.chunk_size)


class Chunk(BaseMessage):
    """One slice of a transfer; idempotent by (transfer_id, index)."""

    kind: Literal["chunk"] = "chunk"
    topic: ClassVar[str] = TRANSFER
    transfer_id: Id
    index: Annotated[int, Field(ge=0, lt=MAX_CHUNK_COUNT)]
    data: Blob


class ChunkRequest(BaseMessage):
    """Receiver to sender: re-send these chunks of a transfer."""

    kind: Literal["chunk_request"] = "chunk_request"
    topic: ClassVar[str] = TRANSFER
    transfer_id: Id
    indices: Annotated[
        tuple[Annotated[int, Field(ge=0, lt=MAX_CHUNK_COUNT)], ...],
        Field(min_length=1, max_length=MAX_CHUNK_COUNT),
        AfterValidator(unique_entries),
    ]
