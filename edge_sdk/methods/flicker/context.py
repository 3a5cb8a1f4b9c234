"""Download of the coordinator's CKKS public context (a chunked transfer).

The coordinator announces the transfer id (`CkksContextAnnounce`, retained),
then sends the manifest (purpose ``ckks_context``) and the chunks. The
download accepts only that purpose, caps the size before storing anything
(a context with Galois keys, ~35 MB, is refused at the manifest), verifies
the sha256 through `Reassembler`, and loads the bytes with
`CkksPublicContext.from_bytes` (which refuses a context carrying a secret
key). A device that missed chunks asks for them (`chunk_request`): all the
missing ones once the manifest is known, else chunk 0 (the answer brings the
manifest); a new request waits until the previous one is answered.
"""

from __future__ import annotations

from ursa.crypto.ckks import CkksPublicContext
from ursa.crypto.errors import CryptoError
from ursa.protocol.chunking import Reassembler
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    Chunk,
    ChunkRequest,
    CkksContextAnnounce,
    TransferManifest,
)
from ursa.protocol.topics import CKKS_CONTEXT

__all__ = ["DEFAULT_MAX_CONTEXT_BYTES", "ContextDownload", "ContextError"]

DEFAULT_MAX_CONTEXT_BYTES = 1024 * 1024
"""Largest public context a device downloads (ursa's is ~465 KB)."""


class ContextError(ValueError):
    """A context transfer that cannot be completed as announced."""


class ContextDownload:
    """The announced CKKS public context, as far as it has arrived."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_CONTEXT_BYTES) -> None:
        self.transfer_id: str | None = None
        self.context: CkksPublicContext | None = None
        self.size = 0
        self._reassembler = Reassembler(
            max_transfer_bytes=max_bytes, max_total_bytes=max_bytes
        )
        self._outstanding: set[int] = set()

    def on_announce(self, message: CkksContextAnnounce) -> bool:
        """Expect a transfer; True if it replaces the current one (a new key)."""
        if message.transfer_id == self.transfer_id:
            return False
        if self.transfer_id is not None:
            self._reassembler.discard(self.transfer_id)
        self.transfer_id, self.context, self.size = message.transfer_id, None, 0
        self._outstanding = set()
        return True

    def claims(self, message: TransferManifest | Chunk) -> bool:
        """Whether a transfer message is the context's (else a model's)."""
        if isinstance(message, TransferManifest):
            return message.purpose == CKKS_CONTEXT
        return self.transfer_id is not None and message.transfer_id == self.transfer_id

    def on_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Take a manifest or chunk; True when the context has just completed.

        Manifests of other purposes and chunks of other transfers (models)
        are ignored.

        Raises:
            ContextError: oversize, inconsistent or corrupt transfer, or bytes
                that are not a public CKKS context.
        """
        if isinstance(message, TransferManifest):
            if message.purpose != CKKS_CONTEXT:
                return False
            if self.transfer_id is None:
                self.transfer_id = message.transfer_id
        tid = message.transfer_id
        if tid != self.transfer_id or self.context is not None:
            return False
        try:
            if isinstance(message, TransferManifest):
                self._reassembler.add_manifest(message)
                return False
            if tid not in self._reassembler.transfer_ids:
                return False  # no manifest yet: `chunk_request` asks again
            self._outstanding.discard(message.index)
            self._reassembler.add_chunk(message)
            if not self._reassembler.is_complete(tid):
                return False
            data = self._reassembler.complete(tid)
            self.context = CkksPublicContext.from_bytes(data)
        except (ProtocolError, CryptoError) as exc:
            raise ContextError(f"CKKS context transfer {tid}: {exc}") from None
        self.size = len(data)
        return True

    def chunk_request(self, *, federation: str, sender: str) -> ChunkRequest | None:
        """A request for what is missing; None if complete, unknown or still asked."""
        tid = self.transfer_id
        if tid is None or self.context is not None or self._outstanding:
            return None
        try:
            missing = self._reassembler.missing(tid)
        except ProtocolError:
            missing = (0,)  # no manifest yet: the answer brings it
        if not missing:
            return None
        self._outstanding = set(missing)
        return ChunkRequest(
            federation=federation,
            round=0,
            sender=sender,
            transfer_id=tid,
            indices=missing,
        )
