"""Global model versions downloaded by a device: chunked transfers, kept in memory.

A global version arrives as a chunked transfer whose purpose is
``"<model>.v<version>"`` and whose id is derived from (federation, model,
version) (`ursa.protocol.ids.model_transfer_id`, the coordinator's). Chunks of a newer
version of the device's model are reassembled (capped at ``max_model_bytes``)
and checked by sha256, then decoded (``planes_zlib``: inflated to at most
``max_model_bytes``); the training rounds then check the arrays against the
trainer and the data (``fits``) before the version is kept. The
coordinator pushes a version only to the devices it knows need it (a
round's selected devices; every device when all read it), so a version the
device needs (`want`: it is selected, a mean asks at that version, the
final model) but was not sent, or lacks chunks of, is fetched
(`ChunkRequest`, chunk 0 when the manifest is unknown: the answer brings
it) at most every ``retry_s``; the first ask waits ``retry_s`` too, so a push
already on its way is not asked for twice.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.stats import TrainingStats
from ursa.edge_sdk.trainer import ModelTrainer, Trainer
from ursa.models.weights import Arrays, WeightsError, arrays_from_bytes
from ursa.protocol.chunking import Reassembler
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import Chunk, ChunkRequest, TransferManifest
from ursa.protocol.transfer_encoding import decode_payload

__all__ = [
    "DEFAULT_MAX_MODEL_BYTES",
    "DEFAULT_RETRY_S",
    "ModelDownloads",
    "model_trainer_of",
]

logger = logging.getLogger("ursa.edge_sdk")

DEFAULT_MAX_MODEL_BYTES = 64 * 1024 * 1024
DEFAULT_RETRY_S = 2.0
_PURPOSE_RE = re.compile(r"^(?P<model>[a-z][a-z0-9_.-]*)\.v(?P<version>\d+)$")


def model_trainer_of(trainer: Trainer) -> ModelTrainer | None:
    """``trainer`` if it trains a model (else the device only selects)."""
    return trainer if isinstance(trainer, ModelTrainer) else None


@dataclass
class _Wanted:
    version: int
    transfer_id: str
    asked_at: float


class ModelDownloads:
    """The latest global version of the trainer's model, and the one on its way.

    Args:
        link: Who the device is and how its `ChunkRequest` leaves.
        trainer: Whose ``model`` names the transfers taken (it may change:
            FedDisk's phase 2 trains another model).
        stats: Counts the versions downloaded.
        fits: Whether a complete version fits the device (else it was refused
            and `refuse` called by the training rounds).
        ready: Called with each new version kept.
    """

    retry_s: float = DEFAULT_RETRY_S
    """The least wait between two requests for the wanted version's chunks."""
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES

    def __init__(
        self,
        *,
        link: DeviceLink,
        trainer: Trainer,
        stats: TrainingStats,
        fits: Callable[[int, Arrays], bool],
        ready: Callable[[int], None],
    ) -> None:
        self._link = link
        self._trainer = trainer
        self._stats = stats
        self._fits = fits
        self._ready = ready
        self._version: int | None = None
        self._arrays: Arrays | None = None
        self._sha256: str | None = None
        self._parts = self._reassembler()
        self._inflight: dict[str, int] = {}
        self.wanted: _Wanted | None = None
        """The version asked for and not downloaded yet (None: none)."""
        self._unfit_version: int | None = None

    @property
    def model_version(self) -> int | None:
        """The latest global model version downloaded."""
        return self._version

    @property
    def model_arrays(self) -> Arrays | None:
        """Its weights."""
        return self._arrays

    @property
    def model_sha256(self) -> str | None:
        """The SHA-256 of its bytes (the signed notice must name the same)."""
        return self._sha256

    def _reassembler(self) -> Reassembler:
        return Reassembler(
            max_transfer_bytes=self.max_model_bytes,
            max_total_bytes=2 * self.max_model_bytes,
        )

    def new_run(self) -> None:
        """Forget everything, the transfers completed too: a new run's ids recur."""
        self.forget()
        self._parts = self._reassembler()

    def forget(self) -> None:
        """Drop every downloaded or in-flight version (the model changed)."""
        for transfer_id in self._inflight:
            self._parts.discard(transfer_id)
        self._inflight.clear()
        self._version = self._arrays = self._sha256 = None
        self.wanted = None
        self._unfit_version = None

    def want(self, version: int, transfer_id: str) -> None:
        """Make sure ``version`` is downloaded (or on its way)."""
        if self._version is not None and self._version >= version:
            return
        if self._unfit_version is not None and version <= self._unfit_version:
            return  # it does not fit this device: downloading it again is no use
        wanted = self.wanted
        if wanted is None or wanted.version < version:
            self.wanted = _Wanted(version, transfer_id, time.monotonic())

    def refuse(self, version: int) -> None:
        """``version`` (and every older one) does not fit: stop asking for it."""
        self._unfit_version = max(version, self._unfit_version or 0)
        if self.wanted is not None and self.wanted.version <= version:
            self.wanted = None

    def arrays_at(self, version: int) -> Arrays | None:
        """The weights of ``version`` if held; else it is asked for, and None."""
        if self._version == version:
            return self._arrays
        trainer = model_trainer_of(self._trainer)
        if trainer is not None:
            tid = model_transfer_id(self._link.federation, trainer.model, version)
            self.want(version, tid)
        return None

    def on_manifest(self, message: TransferManifest) -> None:
        """A transfer's manifest: taken if it is a newer version of the model."""
        trainer = model_trainer_of(self._trainer)
        match = _PURPOSE_RE.match(message.purpose)
        if trainer is None or match is None or match.group("model") != trainer.model:
            return
        version = int(match.group("version"))
        if self._version is not None and version <= self._version:
            return
        if self._unfit_version is not None and version <= self._unfit_version:
            return
        for tid, known in list(self._inflight.items()):
            if known < version:
                self._parts.discard(tid)
                del self._inflight[tid]
        try:
            self._parts.add_manifest(message)
        except ProtocolError as exc:
            logger.warning("%s: model manifest refused: %s", self._link.device_id, exc)
            return
        self._inflight[message.transfer_id] = version
        self._try_complete(message.transfer_id)

    def on_chunk(self, message: Chunk) -> None:
        """A chunk of a version on its way (others are ignored)."""
        tid = message.transfer_id
        if tid not in self._inflight:
            return
        try:
            self._parts.add_chunk(message)
        except ProtocolError as exc:
            logger.warning("%s: model chunk refused: %s", self._link.device_id, exc)
            return
        self._try_complete(tid)

    def _try_complete(self, transfer_id: str) -> None:
        version = self._inflight[transfer_id]
        try:
            if not self._parts.is_complete(transfer_id):
                return
            encoding = self._parts.manifest(transfer_id).encoding
            payload = decode_payload(
                self._parts.complete(transfer_id),
                encoding,
                max_size=self.max_model_bytes,
            )
            # a later version has the architecture of the one this device holds
            arrays = arrays_from_bytes(payload, self._arrays)
        except (ProtocolError, WeightsError, ValueError) as exc:
            logger.warning(
                "%s: model version %d refused: %s", self._link.device_id, version, exc
            )
            return
        del self._inflight[transfer_id]
        if not self._fits(version, arrays):
            return
        if self._version is not None and version <= self._version:
            return
        self._version, self._arrays = version, arrays
        self._sha256 = hashlib.sha256(payload).hexdigest()
        self._stats.models_downloaded += 1
        if self.wanted is not None and self.wanted.version <= version:
            self.wanted = None
        logger.debug("%s: model version %d downloaded", self._link.device_id, version)
        self._ready(version)

    def request(self, now: float, round_index: int) -> None:
        """Ask for the missing chunks of the wanted version (every `retry_s`)."""
        wanted = self.wanted
        if wanted is None or now - wanted.asked_at < self.retry_s:
            return
        wanted.asked_at = now
        tid = wanted.transfer_id
        try:
            missing = self._parts.missing(tid)
        except ProtocolError:
            missing = (0,)  # no manifest yet: the answer brings it
        if not missing:
            return
        self._link.send(
            ChunkRequest(
                federation=self._link.federation,
                round=round_index,
                sender=self._link.device_id,
                transfer_id=tid,
                indices=missing,
            )
        )
