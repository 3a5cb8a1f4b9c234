"""`UpdateUploads`: how a round's update leaves the device and stays answerable.

The delta (plain float32/float16 bytes, or the masked vector under secure
aggregation) goes inline in `ModelUpdate` (`MaskedUpdate`) when it fits
``inline_limit``; else as a manifest + chunks (purpose ``model_update``)
followed by the update naming the transfer. The coordinator's chunk
re-requests are answered from the last `KEPT_UPLOADS` uploads, and each
round's answer (the update, or the refusal sent instead) is kept, so a
re-published `ModelAvailable` gets the same messages again (the
coordinator drops ids it has seen), never a second training.
"""

from __future__ import annotations

import logging
import math
import re
from collections import OrderedDict
from typing import Any

from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.trainer import LocalDelta
from ursa.protocol.chunking import split
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    DEFAULT_CHUNK_SIZE,
    MAX_UPDATE_METRICS,
    NAME_PATTERN,
    BaseMessage,
    Chunk,
    ChunkRequest,
    MaskedUpdate,
    ModelAvailable,
    ModelUpdate,
    TransferManifest,
)

__all__ = ["KEPT_UPLOADS", "UPDATE_PURPOSE", "UpdateUploads", "update_metrics"]

logger = logging.getLogger("ursa.edge_sdk")

UPDATE_PURPOSE = "model_update"
KEPT_UPLOADS = 4
_METRIC_NAME = re.compile(NAME_PATTERN)


def update_metrics(result: LocalDelta, train_s: float) -> tuple[tuple[str, float], ...]:
    """What a `ModelUpdate` says of the training, at most 16 metrics.

    ``samples``, ``train_s`` and the trainer's finite metrics (its
    ``mean_train_loss`` as ``loss``).
    """
    said: dict[str, float] = {
        "samples": float(result.num_examples),
        "train_s": float(train_s),
    }
    for name, value in result.metrics.items():
        key = "loss" if name == "mean_train_loss" else name
        if key not in said and _METRIC_NAME.fullmatch(key) and math.isfinite(value):
            said[key] = float(value)
    return tuple(said.items())[:MAX_UPDATE_METRICS]


class UpdateUploads:
    """The device's answers to training rounds (see the module docstring)."""

    inline_limit: int = DEFAULT_CHUNK_SIZE
    """Deltas up to this many bytes go inline in `ModelUpdate`."""
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __init__(self, link: DeviceLink) -> None:
        self._link = link
        self._answers: OrderedDict[int, list[BaseMessage]] = OrderedDict()
        self._uploads: OrderedDict[str, tuple[TransferManifest, list[Chunk]]] = (
            OrderedDict()
        )

    def new_run(self) -> None:
        """A new run's rounds and transfer ids recur: forget every answer."""
        self._answers.clear()
        self._uploads.clear()

    def forget_answers(self) -> None:
        """The model changed (its versions restart): no round is answered yet."""
        self._answers.clear()

    def answer_of(self, round_index: int) -> list[BaseMessage] | None:
        """What this device answered in ``round_index`` (None: nothing yet)."""
        return self._answers.get(round_index)

    def keep(self, round_index: int, messages: list[BaseMessage]) -> None:
        """``messages`` (already sent) are the round's answer from now on."""
        self._answers[round_index] = messages
        while len(self._answers) > KEPT_UPLOADS:
            self._answers.popitem(last=False)

    def upload(
        self,
        notice: ModelAvailable,
        payload: bytes,
        *,
        secure: bool,
        num_examples: int,
        scaled: bool,
        metrics: tuple[tuple[str, float], ...],
    ) -> None:
        """Send the round's update (inline, or after its chunks) and keep it."""
        fed, me = self._link.federation, self._link.device_id
        messages: list[BaseMessage] = []
        inline = len(payload) <= self.inline_limit
        transfer_id = None
        if not inline:
            transfer_id = derived_id(me, "upload", notice.round, notice.model_version)
            manifest, chunks = split(
                payload,
                purpose=UPDATE_PURPOSE,
                federation=fed,
                round=notice.round,
                sender=me,
                chunk_size=self.chunk_size,
                transfer_id=transfer_id,
            )
            self._uploads[transfer_id] = (manifest, chunks)
            while len(self._uploads) > KEPT_UPLOADS:
                self._uploads.popitem(last=False)
            messages += [manifest, *chunks]
        common: dict[str, Any] = {  # both kinds name the round and the transfer
            "federation": fed,
            "round": notice.round,
            "sender": me,
            "message_id": derived_id(me, "update", notice.round),
            "model": notice.model,
            "base_version": notice.model_version,
            "transfer_id": transfer_id,
        }
        body = payload if inline else None
        update: BaseMessage = (
            MaskedUpdate(**common, vector=body)
            if secure
            else ModelUpdate(
                **common,
                num_examples=num_examples,
                delta_scaled=scaled,
                weights=body,
                metrics=metrics,
            )
        )
        messages.append(update)
        self.keep(notice.round, messages)
        for item in messages:
            self._link.send(item)

    def on_chunk_request(self, message: ChunkRequest) -> None:
        """The coordinator lost chunks of an upload: send them again."""
        upload = self._uploads.get(message.transfer_id)
        if upload is None:
            logger.info("%s: chunk request for an unknown upload", self._link.device_id)
            return
        manifest, chunks = upload
        self._link.send(manifest)
        by_index = {c.index: c for c in chunks}
        for index in message.indices:
            chunk = by_index.get(index)
            if chunk is not None:
                self._link.send(chunk)
