"""A `FleetDevice` (FLICKER's device protocol on its own transport) on the bus.

The test plays the coordinator and the peers.
"""

from __future__ import annotations

import numpy as np
import pytest

from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.errors import SealError
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker import resampling as rs
from ursa.edge_sdk.methods.flicker.participant import ring_seal_context
from ursa.lab.simulate.flicker_device import FleetDevice
from ursa.protocol.chunking import split
from ursa.protocol.envelope import decode, encode
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ChunkRequest,
    CkksContextAnnounce,
    CosineReply,
    CosineRequest,
    CountUpdate,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
)
from ursa.protocol.topics import CKKS_CONTEXT, down_topic, global_topic, name_for

pytest.importorskip("tenseal")

FED = "fed"
IDS = ("dev-a", "dev-b", "dev-c", "dev-d")
COUNTS = {"dev-a": (10, 20, 30, 40), "dev-b": (5, 400, 7, 9), "dev-c": (1, 2, 3, 4)}
OWNER = CkksKeyOwner()
IDENTITIES = {d: DeviceIdentity.generate(d) for d in IDS}
PUBLIC = {d: i.public() for d, i in IDENTITIES.items()}
RING = "ring1"


class Harness:
    """One participant, and a test that plays the coordinator and the peers."""

    def __init__(self, me: str, counts: tuple[int, ...] = (8, 1, 2, 3), **kw: object):
        self.bus = InMemoryBus()
        self.me = me
        self.up: list[BaseMessage] = []
        self.coordinator = InMemoryTransport(self.bus, COORDINATOR)
        self.coordinator.set_handler(lambda t, p: self.up.append(decode(p)))
        self.coordinator.subscribe(f"ursa/v1/{FED}/dev/+/up/#")
        self.coordinator.connect()
        transport = InMemoryTransport(self.bus, me)
        self.device = FleetDevice(
            identity=IDENTITIES[me],
            federation=FED,
            peers=PUBLIC,
            counts=counts,
            transport=transport,
            rng=np.random.default_rng(0),
            **kw,  # type: ignore[arg-type]
        )
        transport.connect()
        self.device.attach()

    def send(self, message: BaseMessage, *, to_all: bool = False) -> None:
        name = name_for(message.kind)  # type: ignore[attr-defined]
        topic = global_topic(FED, name) if to_all else down_topic(FED, self.me, name)
        self.coordinator.publish(topic, encode(message))

    def send_context(self, payload: bytes | None = None) -> None:
        data = payload if payload is not None else OWNER.public_context_bytes()
        manifest, chunks = split(
            data, purpose=CKKS_CONTEXT, federation=FED, round=0, sender=COORDINATOR
        )
        tid = manifest.transfer_id
        self.send(_c(CkksContextAnnounce, transfer_id=tid), to_all=True)
        for message in (manifest, *chunks):
            self.send(message, to_all=True)

    def start(self, order: tuple[str, ...]) -> None:
        self.send(_c(RingStart, ring_id=RING, order=order, hop_deadline_s=5.0))

    def hop_from(self, frm: str, ciphertext: bytes, **change: object) -> RingHop:
        contributors = tuple(change.pop("contributors", IDS[: IDS.index(frm) + 1]))
        index = len(contributors) - 1
        context = ring_seal_context(FED, RING, index, contributors)
        box = seal(IDENTITIES[frm], PUBLIC[self.me], context, ciphertext)
        fields = {
            "federation": FED,
            "round": 0,
            "sender": frm,
            "ring_id": RING,
            "hop_index": index,
            "recipient": self.me,
            "contributors": contributors,
            "box": box,
            **change,
        }
        return RingHop(**fields)  # type: ignore[arg-type]


def _c(cls: type[BaseMessage], **fields: object) -> BaseMessage:
    return cls(federation=FED, round=0, sender=COORDINATOR, **fields)  # type: ignore[arg-type]


def _step(cls: type[BaseMessage], step: int, **fields: object) -> BaseMessage:
    """A correction request of the ring's run."""
    return _c(cls, **{"run_id": RING, "step": step, **fields})


def _enc(*rows: tuple[int, ...]) -> bytes:
    return OWNER.public_context().encrypt(np.sum(rows, axis=0).astype(float))


def _open_hop(hop: RingHop) -> np.ndarray:
    context = ring_seal_context(FED, hop.ring_id, hop.hop_index, hop.contributors)
    sender = PUBLIC[hop.sender]
    inner = open_sealed(IDENTITIES[hop.recipient], sender, context, hop.box)
    return np.rint(OWNER.decrypt(inner)[:4])


def test_the_public_context_download_is_small_and_verified() -> None:
    h = Harness("dev-a")
    h.send_context()
    assert h.device.context is not None
    assert h.device.context.key_id == OWNER.key_id
    assert h.device.context_bytes == len(OWNER.public_context_bytes()) <= 500_000
    assert h.device.rejections == []


def test_oversize_contexts_are_refused_and_other_transfers_ignored() -> None:
    h = Harness("dev-a", max_context_bytes=100_000)
    model, _ = split(b"w" * 10, purpose="model", federation=FED, round=0, sender="x")
    h.send(model.model_copy(update={"sender": COORDINATOR}), to_all=True)
    assert h.device.rejections == []
    h.send_context()
    assert h.device.context is None
    assert "exceeds" in h.device.rejections[-1][1]


def test_the_first_device_seals_its_encrypted_counts_to_its_successor() -> None:
    h = Harness("dev-a", counts=COUNTS["dev-a"])
    h.send_context()
    h.start(("dev-a", "dev-b", "dev-c"))
    (hop,) = h.up
    assert isinstance(hop, RingHop)
    assert (hop.recipient, hop.contributors, hop.hop_index) == ("dev-b", ("dev-a",), 0)
    assert _open_hop(hop).tolist() == list(COUNTS["dev-a"])
    assert b"UCK\x01" not in hop.box  # no CKKS ciphertext in the clear
    context = ring_seal_context(FED, RING, 0, ("dev-a",))
    with pytest.raises(SealError):  # nobody else (least the coordinator) opens it
        open_sealed(IDENTITIES["dev-c"], PUBLIC["dev-a"], context, hop.box)


def test_ring_messages_carry_the_round_of_the_ring_start() -> None:
    h = Harness("dev-a", counts=COUNTS["dev-a"])
    h.send_context()
    start = _c(
        RingStart, ring_id=RING, order=("dev-a", "dev-b", "dev-c"), hop_deadline_s=5
    )
    h.send(start.model_copy(update={"round": 4}))
    (hop,) = h.up
    assert isinstance(hop, RingHop) and hop.round == 4


def test_a_middle_device_adds_its_counts_and_the_last_sends_the_result() -> None:
    h = Harness("dev-b", counts=COUNTS["dev-b"])
    h.send_context()
    h.start(("dev-a", "dev-b", "dev-c"))
    h.send(h.hop_from("dev-a", _enc(COUNTS["dev-a"])))
    (hop,) = h.up
    assert isinstance(hop, RingHop) and hop.contributors == ("dev-a", "dev-b")
    assert _open_hop(hop).tolist() == [15, 420, 37, 49]

    last = Harness("dev-c", counts=COUNTS["dev-c"])
    last.send_context()
    last.start(("dev-a", "dev-b", "dev-c"))
    last.send(last.hop_from("dev-b", _enc(COUNTS["dev-a"], COUNTS["dev-b"])))
    (result,) = last.up
    assert isinstance(result, RingResult)
    assert result.contributors == ("dev-a", "dev-b", "dev-c")
    assert np.rint(OWNER.decrypt(result.total)[:4]).tolist() == [16, 422, 40, 53]


def test_a_shorter_order_makes_the_device_reseal_its_sum_to_the_next() -> None:
    h = Harness("dev-b", counts=COUNTS["dev-b"])
    h.send_context()
    h.start(IDS)
    h.send(h.hop_from("dev-a", _enc(COUNTS["dev-a"])))
    h.start(("dev-a", "dev-b", "dev-d"))  # dev-c silent: skipped
    first, again = h.up
    assert isinstance(first, RingHop) and isinstance(again, RingHop)
    assert (first.recipient, again.recipient) == ("dev-c", "dev-d")
    assert again.contributors == first.contributors == ("dev-a", "dev-b")
    assert _open_hop(again).tolist() == [15, 420, 37, 49]

    h.start(("dev-a", "dev-b", "dev-c"))  # dev-c came back: refused
    assert "minus devices" in h.device.rejections[-1][1]
    assert len(h.up) == 2


def test_a_device_left_last_by_a_skip_sends_the_result() -> None:
    h = Harness("dev-c", counts=COUNTS["dev-c"])
    h.send_context()
    h.start(IDS)
    h.send(h.hop_from("dev-b", _enc(COUNTS["dev-a"], COUNTS["dev-b"])))
    h.start(("dev-a", "dev-b", "dev-c"))
    hop, result = h.up
    assert isinstance(hop, RingHop) and isinstance(result, RingResult)
    assert result.contributors == ("dev-a", "dev-b", "dev-c")


@pytest.mark.parametrize(
    "change",
    [
        {"contributors": ("dev-b",)},
        {"box": b"\x01" + b"\x00" * 90},
        {"hop_index": 3},
        {"ring_id": "other"},
        {"sender": "dev-c"},
    ],
)
def test_bad_ring_hops_are_rejected_and_nothing_is_sent(change: dict) -> None:
    h = Harness("dev-b", counts=COUNTS["dev-b"])
    h.send_context()
    h.start(IDS)
    h.send(h.hop_from("dev-a", _enc(COUNTS["dev-a"]), **change))
    assert h.up == [] and len(h.device.rejections) == 1
    assert h.bus.handler_errors == 0


def test_a_hop_not_relayed_to_the_device_itself_is_rejected() -> None:
    h = Harness("dev-b")
    h.send_context()
    h.start(IDS)
    h.send(h.hop_from("dev-a", _enc(COUNTS["dev-a"])), to_all=True)
    assert h.up == [] and "ring hop" in h.device.rejections[-1][1]


def test_a_result_with_fewer_than_three_contributors_is_refused() -> None:
    h = Harness("dev-b")
    h.send_context()
    order = ("dev-a", "dev-b")  # invalid on the wire; built past validation
    start = RingStart.model_construct(
        federation=FED,
        round=0,
        sender=COORDINATOR,
        message_id="m1",
        kind="ring_start",
        protocol_version=1,
        ring_id=RING,
        order=order,
        hop_deadline_s=5.0,
    )
    h.device.on_message(start, relayed=True)
    h.send(h.hop_from("dev-a", _enc(COUNTS["dev-a"])))
    assert h.up == [] and "refusing a ring result" in h.device.rejections[-1][1]


def _ringed(me: str = "dev-a", **kw: object) -> Harness:
    h = Harness(me, counts=COUNTS[me], **kw)  # type: ignore[arg-type]
    h.send_context()
    h.start((me, *(d for d in ("dev-a", "dev-b", "dev-c") if d != me)))
    h.up.clear()
    return h


def test_the_cosine_reply_decrypts_to_the_cosine_only_and_is_cached() -> None:
    h = _ringed()
    gd = np.array([16.0, 422.0, 40.0, 53.0])
    request = _step(CosineRequest, 1, ciphertext=_enc(tuple(gd / np.linalg.norm(gd))))
    request = request.model_copy(update={"round": 5})
    h.send(request)
    h.send(request.model_copy(update={"message_id": "asked-again"}))
    first, again = h.up
    assert isinstance(first, CosineReply)
    assert (first.run_id, first.step, first.round) == (RING, 1, 5)
    assert encode(first) == encode(again)
    plain = np.array(COUNTS["dev-a"]) @ gd / np.linalg.norm(COUNTS["dev-a"])
    cosine = OWNER.decrypt_sum(first.masked_product)
    assert cosine == pytest.approx(plain / np.linalg.norm(gd), abs=1e-5)
    slots = OWNER.decrypt(first.masked_product)
    assert np.max(np.abs(slots)) > 100  # each slot is masked


def test_requests_under_another_key_or_before_the_ring_are_rejected() -> None:
    other = CkksKeyOwner().public_context().encrypt([0.5, 0.5, 0.5, 0.5])
    h = _ringed()
    h.send(_step(CosineRequest, 1, ciphertext=other))
    assert h.up == [] and "another key" in h.device.rejections[-1][1]
    h.send(_step(CosineRequest, 1, ciphertext=_enc((1, 1, 1, 1)), run_id="other"))
    assert h.up == [] and "request of run other" in h.device.rejections[-1][1]
    fresh = Harness("dev-a")
    fresh.send_context()
    fresh.send(_step(CosineRequest, 1, ciphertext=_enc((1, 1, 1, 1))))
    assert fresh.up == [] and "ring" in fresh.device.rejections[-1][1]


def test_a_resample_request_makes_one_step_and_sends_the_encrypted_change() -> None:
    h = _ringed("dev-b")
    request = _step(ResampleRequest, 2, nabla_client=0.05)
    h.send(request)
    h.send(request.model_copy(update={"message_id": "asked-again"}))
    update, again = h.up
    assert isinstance(update, CountUpdate) and encode(update) == encode(again)
    assert (update.run_id, update.step) == (RING, 2)
    assert len(h.device.steps) == 1  # asked twice, resampled once
    delta = np.rint(OWNER.decrypt(update.delta)[:4]).astype(int)
    assert delta.tolist() == (np.subtract(h.device.counts, COUNTS["dev-b"])).tolist()
    assert delta[1] < 0  # under-sampling of the majority class first
    assert not update.saturated
    h.send(request.model_copy(update={"step": 1, "message_id": "old"}))
    assert "stale" in h.device.rejections[-1][1]


def test_resampling_on_images_changes_the_training_view() -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [2, 60, 5, 7])
    images = rng.random((len(labels), 8, 8)).astype(np.float32)
    view = rs.TrainingView.of(images, labels, 4)
    extractor = rs.CentroidFeatures.fit(images, labels, 4)
    resampler = rs.DataResampler(view, extractor, rng)
    h = Harness(
        "dev-a", counts=tuple(view.counts()), resampler=resampler, global_test=False
    )  # the local test only (the global one: test_redundancy in this folder)
    h.send_context()
    h.start(("dev-a", "dev-b", "dev-c"))
    for step in (1, 2):
        h.send(_step(ResampleRequest, step, nabla_client=0.05))
    assert tuple(resampler.view.counts()) == h.device.counts
    assert h.device.counts[1] < 60 and h.device.counts[0] > 2
    assert len(images) == 74 and len(resampler.view.x) == 74  # stored data kept


def test_messages_from_others_and_garbage_never_crash_the_device() -> None:
    h = Harness("dev-a")
    forged = RingStart(
        federation=FED,
        round=0,
        sender="dev-b",
        ring_id=RING,
        order=IDS,
        hop_deadline_s=1,
    )
    h.send(forged)
    h.coordinator.publish(down_topic(FED, "dev-a", "control"), b"\xc1\x00")
    reasons = [r for _, r in h.device.rejections]
    assert "not from the coordinator" in reasons[0] and "undecodable" in reasons[1]
    assert h.bus.handler_errors == 0 and h.up == []


def test_work_waits_for_the_context_then_runs() -> None:
    h = Harness("dev-a", counts=COUNTS["dev-a"])
    h.start(("dev-a", "dev-b", "dev-c"))
    assert h.up == []
    h.send_context()
    assert [m.kind for m in h.up] == ["ring_hop"]  # type: ignore[attr-defined]


def test_a_device_that_missed_the_transfer_fetches_it_by_chunk_requests() -> None:
    h = Harness("dev-a", counts=COUNTS["dev-a"])
    manifest, chunks = split(
        OWNER.public_context_bytes(),
        purpose=CKKS_CONTEXT,
        federation=FED,
        round=0,
        sender=COORDINATOR,
    )
    h.send(_c(CkksContextAnnounce, transfer_id=manifest.transfer_id), to_all=True)
    h.start(("dev-a", "dev-b", "dev-c"))  # no manifest, no chunk yet
    asked: list[tuple[int, ...]] = []
    while h.up and isinstance(h.up[-1], ChunkRequest):
        request = h.up.pop()
        asked.append(request.indices)
        h.send(manifest)  # answers go to the device's own topic
        for index in request.indices:
            h.send(chunks[index])
    assert asked == [(0,), tuple(range(1, len(chunks)))]
    assert [m.kind for m in h.up] == ["ring_hop"]  # type: ignore[attr-defined]
