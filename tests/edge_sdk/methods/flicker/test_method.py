"""Flicker: the data after a run, and the DeviceMethod on a fake device context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker.errors import RefusedError
from ursa.edge_sdk.methods.flicker.method import (
    Flicker,
    load_features,
    resample_indices,
)
from ursa.edge_sdk.methods.flicker.participant import ring_seal_context
from ursa.edge_sdk.methods_config import FlickerDeviceSpec
from ursa.protocol.chunking import split
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ChunkRequest,
    CkksContextAnnounce,
    CountUpdate,
    DeviceKeys,
    ResampleRequest,
    RingHop,
    RingStart,
)
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Dispatch, Router
from ursa.protocol.topics import CKKS_CONTEXT

FED = "fed"


def test_count_level_resampling_keeps_copies_and_drops_a_class_own_samples() -> None:
    labels = np.array([0, 0, 0, 0, 1, 2, 2], dtype=np.int64)
    rng = np.random.default_rng(0)

    picked = resample_indices(labels, (2, 3, 2), rng)

    assert np.bincount(labels[picked], minlength=3).tolist() == [2, 3, 2]
    assert set(picked[labels[picked] == 1]) == {4}  # copies of its own sample
    assert len(set(picked[labels[picked] == 0])) == 2  # no sample twice


def test_without_a_run_the_data_is_unchanged(new_context: Any) -> None:
    labels = np.array([0, 1, 1], dtype=np.int64)
    x = np.arange(3, dtype=np.float32)[:, None]
    flicker = Flicker(new_context(), FlickerDeviceSpec(), labels=labels, x=x)

    samples, out = flicker.resampled()

    assert samples is x and out is labels


def test_a_features_file_becomes_the_shared_extractor(tmp_path: Path) -> None:
    path = tmp_path / "features.npz"
    np.savez(path, centroids=np.eye(3, 4), temperature=0.5)

    extractor = load_features(path)

    assert extractor.centroids.shape == (3, 4) and extractor.temperature == 0.5
    np.savez(path, centroids=np.eye(3, 4), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        load_features(path)


def test_non_square_samples_cannot_be_resampled_as_images(new_context: Any) -> None:
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures

    labels = np.array([0, 1], dtype=np.int64)
    extractor = CentroidFeatures(np.eye(2, 5), 1.0)

    with pytest.raises(ValueError, match="not square"):
        Flicker(new_context(), labels=labels, x=np.zeros((2, 5)), extractor=extractor)


# --- the DeviceMethod on a fake device context --------------------------------

ME, PREV, NEXT = "d0", "p1", "p2"
PEERS = {d: DeviceIdentity.generate(d) for d in (PREV, NEXT)}
RING = "ring1"
LABELS = np.array([0, 0, 0, 0, 0, 0, 1, 2], dtype=np.int64)  # counts (6, 1, 1)


@pytest.fixture(scope="module")
def owner() -> Any:
    pytest.importorskip("tenseal")
    from ursa.crypto.ckks import CkksKeyOwner

    return CkksKeyOwner()


def _coordinator(cls: type[BaseMessage], **fields: Any) -> Any:
    return cls(federation=FED, round=0, sender=COORDINATOR, **fields)


def _ring_start(ctx: Any, order: tuple[str, ...], **change: Any) -> RingStart:
    identities = {ME: ctx.identity, **PEERS}
    keys = {d: i.public() for d, i in identities.items()}
    members = tuple(
        DeviceKeys(
            device_id=d,
            x25519_public=keys[d].x25519_public,
            ed25519_public=keys[d].ed25519_public,
        )
        for d in order
    )
    fields = {"ring_id": RING, "order": order, "hop_deadline_s": 5.0}
    return _coordinator(RingStart, **{**fields, "members": members, **change})


def _attached(new_context: Any) -> tuple[Flicker, Any, Router]:
    ctx, router = new_context(), Router(ME)
    flicker = Flicker(
        ctx, FlickerDeviceSpec(), labels=LABELS, rng=np.random.default_rng(0)
    )
    flicker.register(router)
    return flicker, ctx, router


def _context_transfer(owner: Any) -> tuple[CkksContextAnnounce, list[Any]]:
    manifest, chunks = split(
        owner.public_context_bytes(),
        purpose=CKKS_CONTEXT,
        federation=FED,
        round=0,
        sender=COORDINATOR,
    )
    announce = _coordinator(CkksContextAnnounce, transfer_id=manifest.transfer_id)
    return announce, [manifest, *chunks]


def _send_context(flicker: Flicker, router: Router, owner: Any) -> None:
    announce, transfer = _context_transfer(owner)
    assert router.dispatch(announce) is Dispatch.HANDLED
    assert all(flicker.take_transfer(m) for m in transfer)
    router.retry_parked(_raise)


def _raise(message: BaseMessage, exc: Exception) -> None:
    raise exc


def _opened(hop: RingHop, receiver: DeviceIdentity, sender: Any, owner: Any) -> list:
    where = ring_seal_context(FED, hop.ring_id, hop.hop_index, hop.contributors)
    inner = open_sealed(receiver, sender, where, hop.box)
    return np.rint(owner.decrypt(inner)[:3]).tolist()


def test_flicker_is_the_balancing_method_of_kind_flicker() -> None:
    assert (Flicker.name, Flicker.role) == ("flicker", MethodRole.BALANCING)


def test_ring_work_parks_until_the_context_has_arrived(
    new_context: Any, owner: Any
) -> None:
    flicker, ctx, router = _attached(new_context)
    announce, transfer = _context_transfer(owner)
    router.dispatch(announce)

    outcome = router.dispatch(_ring_start(ctx, (ME, PREV, NEXT)))

    assert outcome is Dispatch.PARKED
    (ask,) = ctx.sent  # the device asks for the context it is missing
    assert isinstance(ask, ChunkRequest) and ask.indices == (0,)
    assert all(flicker.take_transfer(m) for m in transfer)
    router.retry_parked(_raise)
    (hop,) = [m for m in ctx.sent if isinstance(m, RingHop)]
    assert hop.recipient == PREV
    assert _opened(hop, PEERS[PREV], ctx.identity.public(), owner) == [6, 1, 1]


def test_a_model_transfer_is_left_to_the_client(new_context: Any, owner: Any) -> None:
    flicker, _, router = _attached(new_context)
    _send_context(flicker, router, owner)
    manifest, chunks = split(
        b"weights", purpose="model", federation=FED, round=0, sender=COORDINATOR
    )

    assert not flicker.take_transfer(manifest)
    assert not flicker.take_transfer(chunks[0])


def test_the_ring_members_are_checked_against_the_coordinator_signature(
    new_context: Any, owner: Any
) -> None:
    flicker, ctx, router = _attached(new_context)
    _send_context(flicker, router, owner)
    ctx.coordinator_pinned = False
    start = _ring_start(ctx, (ME, PREV, NEXT))

    assert router.dispatch(start) is Dispatch.PARKED  # no coordinator key yet
    ctx.coordinator_pinned = True
    router.retry_parked(_raise)

    assert ctx.verified == [start] and isinstance(ctx.sent[-1], RingHop)
    with pytest.raises(RefusedError, match="not the ring order"):
        router.dispatch(_ring_start(ctx, (ME, PREV, NEXT), members=()))


def test_a_hop_is_opened_and_the_sum_sealed_on_through_the_context(
    new_context: Any, owner: Any
) -> None:
    flicker, ctx, router = _attached(new_context)
    _send_context(flicker, router, owner)
    router.dispatch(_ring_start(ctx, (PREV, ME, NEXT)))
    running = owner.public_context().encrypt([10.0, 20.0, 30.0])
    where = ring_seal_context(FED, RING, 0, (PREV,))
    box = seal(PEERS[PREV], ctx.identity.public(), where, running)
    hop = RingHop(
        federation=FED,
        round=0,
        sender=PREV,
        ring_id=RING,
        hop_index=0,
        recipient=ME,
        contributors=(PREV,),
        box=box,
    )

    assert router.dispatch(hop) is Dispatch.HANDLED

    (out,) = ctx.sent
    assert isinstance(out, RingHop) and out.recipient == NEXT
    assert out.contributors == (PREV, ME)
    assert _opened(out, PEERS[NEXT], ctx.identity.public(), owner) == [16, 21, 31]
    with pytest.raises(RefusedError, match="unknown"):
        router.dispatch(hop.model_copy(update={"sender": "stranger"}))


def test_the_resampled_labels_replace_the_data_before_registration(
    new_context: Any, owner: Any
) -> None:
    flicker, ctx, router = _attached(new_context)
    _send_context(flicker, router, owner)
    router.dispatch(_ring_start(ctx, (ME, PREV, NEXT)))
    request = _coordinator(ResampleRequest, run_id=RING, step=1, nabla_client=0.5)

    router.dispatch(request)

    (update,) = [m for m in ctx.sent if isinstance(m, CountUpdate)]
    participant = flicker.participant
    assert participant is not None and flicker.has_resampled
    data = flicker.replace_data()
    assert data is not None and data.x is None
    assert tuple(np.bincount(data.labels, minlength=3)) == participant.counts
    delta = np.rint(owner.decrypt(update.delta)[:3]).astype(int)
    assert delta.tolist() == (np.subtract(participant.counts, (6, 1, 1))).tolist()


def test_a_flicker_without_a_run_keeps_the_device_data(new_context: Any) -> None:
    pytest.importorskip("tenseal")
    flicker = Flicker(new_context(), labels=LABELS)

    data = flicker.replace_data()

    assert not flicker.has_resampled and flicker.participant.counts == (6, 1, 1)
    assert data is not None and data.x is None
    assert data.labels.tolist() == LABELS.tolist()
