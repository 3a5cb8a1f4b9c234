"""Model transfers on the coordinator: global versions out in chunks, updates in.

Out: a global model version goes as one chunked transfer
(`ursa.protocol.chunking`) to the devices that need it: on their own down
topics to a round's selected devices, on the global transfer topic when every
device needs it (a federated evaluation or CLIMB's dual step reads it, the
final model, FedDisk's judging); each recipient, and the broadcast, once per
version (`OutgoingModels.deliveries`). Its transfer id is derived from
(federation, model, version) (`ursa.protocol.ids.model_transfer_id`, the
device's function too) and its purpose names the version
(``"<model>.v<version>"``), so a device that sees the chunks before the
notice, or is told only a version (a `MeanRequest`), knows what they are and
can fetch what it lacks. A fetch is a `ChunkRequest`, answered on the
device's own down topic (never broadcast: no amplification onto others) with
the manifest first (a device that missed it learns the layout), then the
chunks asked for. A 200-byte request can ask for a whole model, so only the
last two versions are answered (the newest, and the open round's base, which
a slow device may still be fetching), each device at most ``max_requests``
times per version (`RequestBudgetError`) and once per ``min_interval_s``
(`RequestTooSoonError`): what one device can make the coordinator send is
bounded by ``max_requests`` x the model's size per version. A version's
bytes go byte planes + zlib (``planes_zlib``, lossless:
`ursa.protocol.transfer_encoding`); the signed notice's sha256 is of the
decoded version.

In: a device's update larger than one inline message arrives as a manifest
(purpose ``model_update``) and chunks on its up topic, named by its
`ModelUpdate`; `Uploads` reassembles them and hands the bytes over once the
sha256 checks. Each device has one upload per round (a second transfer id is
`SecondUploadError`), capped at ``max_transfer_bytes``; the round's total cap
is only a last resort (the caller sizes it to the selected devices' caps),
so no device's upload can crowd out another's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ursa.protocol.admission_limits import MAX_TRACKED_SENDERS
from ursa.protocol.chunking import (
    DEFAULT_MAX_REQUESTS,
    Reassembler,
    RequestBudget,
    RequestLimitError,
    select_chunks,
    split,
)
from ursa.protocol.errors import ChunkError, OversizeError
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    Chunk,
    ChunkRequest,
    ModelAvailable,
    TransferManifest,
)
from ursa.protocol.transfer_encoding import PLANES_ZLIB, encode_payload

__all__ = [
    "DEFAULT_MAX_CHUNK_REQUESTS",
    "DEFAULT_MIN_REQUEST_INTERVAL_S",
    "UPDATE_PURPOSE",
    "Delivery",
    "OutgoingModels",
    "RequestBudgetError",
    "RequestTooSoonError",
    "SecondUploadError",
    "TransferRejectedError",
    "Uploads",
    "model_notice",
    "model_purpose",
]

UPDATE_PURPOSE = "model_update"
DEFAULT_KEEP_TRANSFERS = 2
"""Versions answered: the newest and the one before (the open round's base)."""
DEFAULT_MAX_CHUNK_REQUESTS = DEFAULT_MAX_REQUESTS
"""Re-requests answered per device and model version."""
DEFAULT_MIN_REQUEST_INTERVAL_S = 0.5
"""The least time between two answered requests of one device (a device asks
every ``retry_s``, 2 s by default)."""


class TransferRejectedError(ValueError):
    """A transfer message the coordinator refuses (the reason is the message)."""


class SecondUploadError(TransferRejectedError):
    """A device announced a second upload in one round (the first one stands)."""


class RequestBudgetError(TransferRejectedError):
    """A device asked for a model version more often than ``max_requests``."""


class RequestTooSoonError(TransferRejectedError):
    """A device asked again within ``min_interval_s`` of its last answer."""


def model_notice(
    federation: str, model: str, round_index: int, version: int, sha256: str
) -> ModelAvailable:
    """The retained notice: round ``round_index`` trains from ``version``.

    It names the SHA-256 of the version's bytes, so the signed notice pins
    the content, not only the version number.
    """
    return ModelAvailable(
        federation=federation,
        round=round_index,
        sender=COORDINATOR,
        model=model,
        model_version=version,
        transfer_id=model_transfer_id(federation, model, version),
        sha256=sha256,
    )


def model_purpose(model: str, version: int) -> str:
    """The manifest purpose of a global model version: ``"<model>.v<version>"``."""
    return f"{model}.v{version}"


@dataclass
class _Published:
    manifest: TransferManifest
    chunks: list[Chunk]
    reached: set[str] = field(default_factory=set)
    """Devices its chunks were pushed to on their down topics."""
    broadcast: bool = False
    """Whether its chunks went to every device on the global topic."""


Delivery = tuple[BaseMessage, str | None]
"""A message and its recipient: a device's down topic, or None (global)."""


class OutgoingModels:
    """The chunked transfers of the current global model versions, and who got them.

    The last ``keep`` versions are answered (the newest, and the one the open
    round trains from or a FedDisk loss step reads); each device at most
    ``max_requests`` times per version and once per ``min_interval_s``.
    """

    def __init__(
        self,
        federation: str,
        *,
        chunk_size: int,
        keep: int = DEFAULT_KEEP_TRANSFERS,
        max_requests: int = DEFAULT_MAX_CHUNK_REQUESTS,
        min_interval_s: float = DEFAULT_MIN_REQUEST_INTERVAL_S,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be positive")
        if min_interval_s < 0:
            raise ValueError("min_interval_s must not be negative")
        self._federation = federation
        self._chunk_size = chunk_size
        self._keep = keep
        self._budget = RequestBudget(max_requests)
        self._min_interval_s = min_interval_s
        self._answered_at: OrderedDict[str, float] = OrderedDict()
        """Device -> when its last request was answered (bounded)."""
        self._published: OrderedDict[str, _Published] = OrderedDict()

    def publish(
        self, model: str, version: int, payload: bytes, round_index: int
    ) -> tuple[TransferManifest, list[Chunk]]:
        """The manifest and chunks of a version (made once, then remembered)."""
        known = self._known(model, version, payload, round_index)
        return known.manifest, known.chunks

    def deliveries(
        self,
        model: str,
        version: int,
        payload: bytes,
        round_index: int,
        to: Iterable[str] | None,
    ) -> list[Delivery]:
        """What brings a version to ``to`` (None: every device, globally).

        Each device, and the broadcast, gets a version once (`redeliver`
        forgets that); a device is not sent what a broadcast already sent.
        """
        known = self._known(model, version, payload, round_index)
        parts: list[BaseMessage] = [known.manifest, *known.chunks]
        if to is None:
            if known.broadcast:
                return []
            known.broadcast = True
            return [(part, None) for part in parts]
        if known.broadcast:
            return []
        out: list[Delivery] = []
        for device in dict.fromkeys(to):
            if device not in known.reached:
                known.reached.add(device)
                out.extend((part, device) for part in parts)
        return out

    def redeliver(self) -> None:
        """Forget who got which version: the next `deliveries` send again."""
        for known in self._published.values():
            known.reached.clear()
            known.broadcast = False

    def pushed_to(self, transfer_id: str) -> frozenset[str] | None:
        """Devices a version was pushed to (None: broadcast, or not current)."""
        known = self._published.get(transfer_id)
        return None if known is None or known.broadcast else frozenset(known.reached)

    def requests(self, device: str, transfer_id: str) -> int:
        """Re-requests of a remembered version answered for ``device``."""
        return self._budget.used(device, transfer_id)

    def answer(
        self, device: str, request: ChunkRequest, *, now: float
    ) -> list[BaseMessage]:
        """The manifest, then the chunks ``device`` asked for (counted).

        ``now`` is any monotonic clock in seconds (the interval's).

        Raises:
            TransferRejectedError: not a current version, or an unknown index.
            RequestBudgetError: ``device`` has spent its requests for this
                version.
            RequestTooSoonError: ``device`` had a request answered less than
                ``min_interval_s`` ago.
        """
        known = self._published.get(request.transfer_id)
        if known is None:
            raise TransferRejectedError(
                f"transfer {request.transfer_id} is not a current model version"
            )
        try:
            self._budget.check(device, request.transfer_id)
        except RequestLimitError as exc:
            raise RequestBudgetError(f"{known.manifest.purpose}: {exc}") from None
        last = self._answered_at.get(device)
        if last is not None and 0 <= now - last < self._min_interval_s:
            raise RequestTooSoonError(
                f"{known.manifest.purpose}: a request answered {now - last:.2f} s "
                f"ago (at most one per {self._min_interval_s:g} s and device)"
            )
        try:
            chunks = select_chunks(known.chunks, request)
        except ChunkError as exc:
            raise TransferRejectedError(str(exc)) from None
        self._budget.spend(device, request.transfer_id)
        self._answered_at[device] = now
        self._answered_at.move_to_end(device)
        while len(self._answered_at) > MAX_TRACKED_SENDERS:
            self._answered_at.popitem(last=False)
        return [known.manifest, *chunks]

    def _known(
        self, model: str, version: int, payload: bytes, round_index: int
    ) -> _Published:
        tid = model_transfer_id(self._federation, model, version)
        known = self._published.get(tid)
        if known is None:
            manifest, chunks = split(
                encode_payload(payload, PLANES_ZLIB),
                purpose=model_purpose(model, version),
                federation=self._federation,
                round=round_index,
                sender=COORDINATOR,
                chunk_size=self._chunk_size,
                transfer_id=tid,
                encoding=PLANES_ZLIB,
            )
            known = _Published(manifest, chunks)
            self._published[tid] = known
            while len(self._published) > self._keep:
                old, _ = self._published.popitem(last=False)
                self._budget.forget(old)
        return known


class Uploads:
    """Devices' update uploads (manifest + chunks), reassembled under caps."""

    def __init__(self, *, max_transfer_bytes: int, max_total_bytes: int) -> None:
        self._reassembler = Reassembler(
            max_transfer_bytes=max_transfer_bytes, max_total_bytes=max_total_bytes
        )
        self._owner: dict[str, str] = {}
        self._upload_of: dict[str, str] = {}
        """Device -> its one transfer id this round (kept after `forget`)."""
        self._done: dict[str, bytes] = {}

    def on_manifest(self, device: str, manifest: TransferManifest) -> None:
        """Start an upload (the same manifest again is a no-op).

        Raises:
            SecondUploadError: ``device`` already announced another upload.
            TransferRejectedError: wrong purpose, oversize, or a clash.
        """
        if manifest.purpose != UPDATE_PURPOSE:
            raise TransferRejectedError(
                f"a device uploads only {UPDATE_PURPOSE!r}, not {manifest.purpose!r}"
            )
        tid = manifest.transfer_id
        first = self._upload_of.get(device)
        if first is not None and first != tid:
            raise SecondUploadError(
                f"one upload per device and round: transfer {first} came first"
            )
        owner = self._owner.get(tid)
        if owner is not None and owner != device:
            raise TransferRejectedError("transfer id already used by another device")
        if tid in self._done:
            return
        try:
            self._reassembler.add_manifest(manifest)
        except (ChunkError, OversizeError) as exc:
            raise TransferRejectedError(str(exc)) from None
        self._owner[tid] = device
        self._upload_of[device] = tid

    def on_chunk(self, device: str, chunk: Chunk) -> bool:
        """Store a chunk; True when its upload has just completed.

        Raises:
            TransferRejectedError: unknown transfer, another device's, or a bad
                chunk (a failed sha256 drops the chunks: they are asked again).
        """
        tid = chunk.transfer_id
        if tid in self._done:
            return False
        if self._owner.get(tid) != device:
            raise TransferRejectedError(f"chunk of unknown transfer {tid}")
        try:
            self._reassembler.add_chunk(chunk)
            if not self._reassembler.is_complete(tid):
                return False
            self._done[tid] = self._reassembler.complete(tid)
        except ChunkError as exc:
            raise TransferRejectedError(str(exc)) from None
        return True

    def payload(self, device: str, transfer_id: str) -> bytes | None:
        """The completed bytes of a device's upload, or None while incomplete."""
        if self._owner.get(transfer_id) != device:
            return None
        return self._done.get(transfer_id)

    def missing_request(
        self, device: str, transfer_id: str, *, federation: str, round_index: int
    ) -> ChunkRequest | None:
        """A request for an upload's missing chunks (chunk 0 before its manifest)."""
        if transfer_id in self._done:
            return None
        if self._owner.get(transfer_id) not in (None, device):
            return None
        try:
            missing = self._reassembler.missing(transfer_id)
        except ChunkError:
            missing = (0,)
        if not missing:
            return None
        return ChunkRequest(
            federation=federation,
            round=round_index,
            sender=COORDINATOR,
            transfer_id=transfer_id,
            indices=missing,
        )

    def forget(self, transfer_id: str) -> None:
        """Drop an upload (used, or its round is over)."""
        self._reassembler.discard(transfer_id)
        self._owner.pop(transfer_id, None)
        self._done.pop(transfer_id, None)

    def transfer_ids(self) -> tuple[str, ...]:
        """Uploads known (in flight or complete, not yet forgotten)."""
        return tuple(self._owner)
