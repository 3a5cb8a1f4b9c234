"""Targeted model delivery: who gets which version, and fetches within bounds."""

from __future__ import annotations

import pytest

from ursa.coordinator.model_delivery import ModelDelivery
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import ChunkRequest, ErrorCode, TransferManifest
from ursa.protocol.router import RejectedError

PAYLOAD = b"0123456789" * 3


def delivery(max_requests: int = 8) -> ModelDelivery:
    return ModelDelivery("f", "classifier", chunk_size=8, max_requests=max_requests)


def fetch(device: str, version: int, indices: tuple[int, ...] = (0,)) -> ChunkRequest:
    return ChunkRequest(
        federation="f",
        round=1,
        sender=device,
        transfer_id=model_transfer_id("f", "classifier", version),
        indices=indices,
    )


def test_the_selected_get_a_version_once_each_until_redelivered() -> None:
    models = delivery()

    first = models.deliveries(1, PAYLOAD, 1, ["d1", "d2"])
    assert {device for _, device in first} == {"d1", "d2"}
    assert isinstance(first[0][0], TransferManifest)
    assert models.deliveries(1, PAYLOAD, 1, ["d1", "d3"]) == [
        (m, "d3") for m, _ in first if _ == "d1"
    ]
    models.redeliver()  # a resumed round pushes again
    assert {d for _, d in models.deliveries(1, PAYLOAD, 1, ["d1"])} == {"d1"}


def test_a_version_for_all_goes_once_on_the_global_topic() -> None:
    models = delivery()

    sent = models.deliveries(2, PAYLOAD, 1, None)

    assert sent and {device for _, device in sent} == {None}
    assert models.deliveries(2, PAYLOAD, 1, None) == []
    assert models.deliveries(2, PAYLOAD, 1, ["d1"]) == []  # the broadcast reached it


def test_a_fetch_is_answered_alone_then_refused_out_of_bounds() -> None:
    models = delivery(max_requests=2)
    models.keep(3, PAYLOAD, 1)  # fetchable, pushed to nobody

    replies = models.answer("d1", fetch("d1", 3), now=10.0)
    assert isinstance(replies[0], TransferManifest) and len(replies) == 2

    refusals = []
    for request, now in (
        (fetch("d1", 3), 10.1),  # again at once: at most one per 0.5 s
        (fetch("d1", 7), 11.0),  # not a current version
        (fetch("d1", 3, (99,)), 12.0),  # no such chunk
    ):
        with pytest.raises(RejectedError) as refused:
            models.answer("d1", request, now=now)
        refusals.append(refused.value)
    assert [r.code for r in refusals] == [ErrorCode.TRANSFER_FAILED] * 3
    assert "at most one per 0.5 s" in refusals[0].reason
    assert "not a current model version" in refusals[1].reason

    assert len(models.answer("d1", fetch("d1", 3), now=13.0)) == 2
    with pytest.raises(RejectedError, match=r"classifier\.v3"):
        models.answer("d1", fetch("d1", 3), now=14.0)  # its two answers are spent
    assert len(models.answer("d2", fetch("d2", 3), now=14.0)) == 2  # d2's are its own
