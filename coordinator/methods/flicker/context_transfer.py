"""The coordinator's CKKS public context as one chunked transfer.

Every device of a FLICKER run downloads the public context (no Galois keys,
~465 KB) before it can add to the ring: `FlickerSession` announces it
(`CkksContextAnnounce`, retained), sends the manifest and chunks to all, and
answers a device's `ChunkRequest` for it, within a re-request budget per
device (`RequestBudget`: `select_chunks` could otherwise be asked for the
whole context again and again).
"""

from __future__ import annotations

import hashlib

from ursa.protocol.chunking import RequestBudget, split
from ursa.protocol.messages import COORDINATOR, ChunkRequest
from ursa.protocol.topics import CKKS_CONTEXT

__all__ = ["ContextTransfer"]


class ContextTransfer:
    """The CKKS public context as one chunked transfer (manifest + chunks)."""

    def __init__(self, data: bytes, federation: str, chunk_size: int) -> None:
        """Split ``data`` into chunks of ``chunk_size`` bytes.

        The transfer id is the context's hash: a restarted coordinator with the
        same key announces the same transfer, which devices keep.
        """
        self.manifest, self.chunks = split(
            data,
            purpose=CKKS_CONTEXT,
            federation=federation,
            round=0,
            sender=COORDINATOR,
            chunk_size=chunk_size,
            transfer_id=hashlib.sha256(data).hexdigest()[:32],
        )
        self.published = False
        self.requests = RequestBudget()
        """Re-requests answered per device (`select_chunks` can send it all)."""

    def is_for(self, request: ChunkRequest) -> bool:
        """Whether a chunk request asks for this transfer."""
        return request.transfer_id == self.manifest.transfer_id
