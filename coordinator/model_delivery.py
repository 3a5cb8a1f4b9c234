"""Targeted model delivery: which device gets which version of one model.

A round's model goes to its selected devices on their own down topics, or
to all on the global topic when every online device reads it first (a step
says so: `ursa.coordinator.plugin.TrainingSteps.fleet_needs_model`); each
recipient, and the broadcast, once per version, until a resumed service
sends again (`redeliver`). A device that lacks a current version fetches it
(`ChunkRequest`), answered on its own down topic within the fetch bounds of
`ursa.coordinator.model_transfer.OutgoingModels` (``max_requests`` answers
per device and version, one per 0.5 s); a fetch out of bounds is refused
with ``transfer_failed``. The chunks themselves are made in
`ursa.coordinator.model_transfer`; this module holds who gets them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ursa.coordinator.model_transfer import (
    Delivery,
    OutgoingModels,
    TransferRejectedError,
)
from ursa.protocol.messages import BaseMessage, ChunkRequest, ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["ModelDelivery"]

logger = logging.getLogger("ursa.coordinator.training")


class ModelDelivery:
    """Who gets which version of ``model``, and the fetches answered.

    Args:
        federation: The federation id (transfers carry it).
        model: The model whose versions go out.
        chunk_size: Bytes per chunk.
        max_requests: Fetches answered per device and version.
    """

    def __init__(
        self, federation: str, model: str, *, chunk_size: int, max_requests: int
    ) -> None:
        self._model = model
        self._outgoing = OutgoingModels(
            federation, chunk_size=chunk_size, max_requests=max_requests
        )

    def deliveries(
        self,
        version: int,
        payload: bytes,
        round_index: int,
        to: Sequence[str] | None,
    ) -> list[Delivery]:
        """What brings ``version`` to ``to`` (None: all), once per recipient."""
        return self._outgoing.deliveries(self._model, version, payload, round_index, to)

    def keep(self, version: int, payload: bytes, round_index: int) -> None:
        """Make ``version`` fetchable without pushing it (a final model sent inline)."""
        self._outgoing.publish(self._model, version, payload, round_index)

    def redeliver(self) -> None:
        """Forget who got which version (a resumed round pushes again)."""
        self._outgoing.redeliver()

    def answer(
        self, device: str, request: ChunkRequest, now: float
    ) -> list[BaseMessage]:
        """The manifest and chunks ``device`` fetches (for its own down topic).

        Raises:
            RejectedError: ``transfer_failed``: not a current version, an
                unknown chunk, or out of the fetch bounds.
        """
        try:
            replies = self._outgoing.answer(device, request, now=now)
        except TransferRejectedError as exc:
            raise RejectedError(ErrorCode.TRANSFER_FAILED, str(exc)) from None
        pushed = self._outgoing.pushed_to(request.transfer_id)
        logger.debug(
            "round %d: %s fetches %d chunk(s) of transfer %s%s",
            request.round,
            device,
            len(replies) - 1,
            request.transfer_id,
            "" if pushed is None or device in pushed else " (not sent it)",
        )
        return replies
