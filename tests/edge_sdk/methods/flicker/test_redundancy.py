"""The device side of the global redundancy test, against a scripted coordinator."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from ursa.coordinator.methods.flicker.redundancy import decrypt_signs
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker import global_redundancy as gr
from ursa.edge_sdk.methods.flicker import resampling as rs
from ursa.edge_sdk.methods.flicker.redundancy import (
    BACK_LABEL,
    OFFER_LABEL,
    GlobalTestPending,
    WireGlobalTest,
    seal_context,
)
from ursa.lab.simulate.flicker_device import FleetDevice
from ursa.protocol.chunking import split
from ursa.protocol.envelope import decode, encode
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    CkksContextAnnounce,
    CountUpdate,
    RedundancyAsk,
    RedundancyOffer,
    RedundancyReply,
    RedundancyResult,
    ResampleRequest,
    RingStart,
)
from ursa.protocol.topics import CKKS_CONTEXT, down_topic, global_topic, name_for

pytest.importorskip("tenseal")

FED, RING = "fed", "ring1"
IDS = ("dev-a", "dev-b", "dev-c", "dev-d")
ORDER = ("dev-a", "dev-b", "dev-c")
OWNER = CkksKeyOwner()
CTX = OWNER.public_context()
IDENTITIES = {d: DeviceIdentity.generate(d) for d in IDS}
PUBLIC = {d: i.public() for d, i in IDENTITIES.items()}
ETA, CHI = rs.DEFAULT_ETA, rs.DEFAULT_CHI
LABELS = np.repeat(np.arange(4), [1, 40, 6, 8])  # class 1 is the majority


def _resampler(seed: int) -> rs.DataResampler:
    rng = np.random.default_rng(seed)
    images = rng.random((len(LABELS), 8, 8)).astype(np.float32)
    images[LABELS == 1, 2:6, 3:5] += 0.5  # class 1 samples look alike
    extractor = rs.CentroidFeatures.fit(images, LABELS, 4)
    return rs.DataResampler(rs.TrainingView.of(images, LABELS, 4), extractor, rng)


class Device:
    """One participant whose ring is complete; the test plays everyone else."""

    def __init__(self, me: str, **kw: Any) -> None:
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
            counts=tuple(kw["resampler"].view.counts())
            if "resampler" in kw
            else (5, 6, 7, 8),
            transport=transport,
            rng=np.random.default_rng(0),
            **kw,
        )
        transport.connect()
        self.device.attach()
        data = OWNER.public_context_bytes()
        manifest, chunks = split(
            data, purpose=CKKS_CONTEXT, federation=FED, round=0, sender=COORDINATOR
        )
        tid = manifest.transfer_id
        self.send(_c(CkksContextAnnounce, transfer_id=tid), to_all=True)
        for message in (manifest, *chunks):
            self.send(message, to_all=True)
        self.send(_c(RingStart, ring_id=RING, order=ORDER, hop_deadline_s=5.0))
        if me != ORDER[0]:  # a later device completes its hop when it sends one
            self.device.participant._ring.sent = object()  # type: ignore[union-attr]
        self.up.clear()

    def send(self, message: BaseMessage, *, to_all: bool = False) -> None:
        name = name_for(message.kind)  # type: ignore[attr-defined]
        topic = global_topic(FED, name) if to_all else down_topic(FED, self.me, name)
        self.coordinator.publish(topic, encode(message))


def _c(cls: type[BaseMessage], **fields: object) -> BaseMessage:
    return cls(federation=FED, round=0, sender=COORDINATOR, **fields)  # type: ignore[arg-type]


def _step(cls: type[BaseMessage], step: int, **fields: object) -> BaseMessage:
    return _c(cls, run_id=RING, step=step, **fields)


def _peer_reply(
    offer: RedundancyOffer, vectors: np.ndarray, vector_slots: int, peer: str
) -> tuple[bytes, bytes]:
    """What ``peer`` and the coordinator make of an offer: (box, sign bits)."""
    where = seal_context(OFFER_LABEL, FED, RING, offer.step)
    payload = msgpack.unpackb(
        open_sealed(IDENTITIES[peer], PUBLIC[offer.sender], where, offer.box)
    )
    layout = gr.Layout.of(
        offer.block_slots, offer.per_ciphertext, offer.ciphertexts, 4096
    )
    rng = np.random.default_rng(7)
    pool, order, real = gr.arrange_vectors(
        vectors, vector_slots, layout.candidates, rng
    )
    seed = rng.bytes(gr.SEED_BYTES)
    products = gr.signed_products(
        CTX, payload["ciphertexts"], layout, pool, order, payload["eta"], seed, rng
    )
    bits = [decrypt_signs(OWNER, p, layout.block, layout.copies) for p in products]
    back = seal_context(BACK_LABEL, FED, RING, offer.step)
    box = seal(
        IDENTITIES[peer],
        PUBLIC[offer.sender],
        back,
        msgpack.packb({"count": real, "seed": seed}),
    )
    return box, np.packbits(np.concatenate(bits)).tobytes()


def test_the_wire_test_raises_until_answered_for_the_same_candidates() -> None:
    test = WireGlobalTest(ETA, CHI)
    candidates = np.eye(3)

    with pytest.raises(GlobalTestPending) as pending:
        test(1, candidates)
    test.answer(1, candidates, np.array([True, False, True]))
    assert pending.value.label == 1
    assert test(1, candidates).tolist() == [True, False, True]
    with pytest.raises(GlobalTestPending):  # answered once only
        test(1, candidates)
    test.answer(1, candidates, np.ones(3, bool))
    with pytest.raises(GlobalTestPending):
        test(1, candidates[::-1])  # other candidates: ask again
    assert test(2, np.zeros((0, 3))).shape == (0,)


def test_the_dominant_device_waits_for_its_peers_then_removes_what_they_flag() -> None:
    resampler = _resampler(1)
    h = Device("dev-a", resampler=resampler)
    before = resampler.view.counts()

    h.send(_step(ResampleRequest, 1, nabla_client=0.05))

    offers = h.up
    assert [m.kind for m in offers] == ["redundancy_offer"] * 2  # type: ignore[attr-defined]
    assert {m.recipient for m in offers} == {"dev-b", "dev-c"}  # type: ignore[attr-defined]
    assert np.array_equal(resampler.view.counts(), before)  # nothing changed yet
    offer_to = {m.recipient: m for m in offers if isinstance(m, RedundancyOffer)}
    assert all(b"UCK\x01" not in m.box for m in offer_to.values())  # sealed
    # peers: dev-b holds the candidates' own class vectors, dev-c a far class
    own = resampler.class_features(1)
    far = rs.unit_rows(np.tile([1.0, 0.0, 0.0, 0.0], (34, 1)) + 0.01)
    h.up.clear()
    peers = ("dev-b", "dev-c")
    for peer, vectors in zip(peers, (own, far), strict=True):
        box, signs = _peer_reply(offer_to[peer], vectors, 256, peer)
        h.send(
            _step(
                RedundancyResult,
                1,
                peers=peers,
                vector_slots=256,
                peer=peer,
                box=box,
                signs=signs,
            )
        )

    (update,) = h.up
    assert isinstance(update, CountUpdate) and h.device.rejections == []
    delta = np.rint(OWNER.decrypt(update.delta)[:4]).astype(int)
    candidates = own[rs.local_redundancy(own)]
    sims = candidates @ np.concatenate([own, far]).T
    expected = sum(rs.is_globally_redundant(row) for row in sims)
    assert 0 < expected < len(candidates)  # the test can fail both ways
    assert delta.tolist() == [0, -expected, 0, 0]
    assert tuple(resampler.view.counts()) == h.device.counts


def test_a_peer_answers_with_fixed_size_signed_products_and_its_sealed_count() -> None:
    resampler = _resampler(2)
    h = Device("dev-b", resampler=resampler)
    candidates = resampler.class_features(1)[:5]
    layout = gr.plan_layout(5, 4, 4096)
    cts = gr.encrypt_candidates(CTX, candidates, layout)
    payload = msgpack.packb({"label": 1, "eta": ETA, "ciphertexts": cts})
    where = seal_context(OFFER_LABEL, FED, RING, 3)
    box = seal(IDENTITIES["dev-a"], PUBLIC["dev-b"], where, payload)
    ask = _step(
        RedundancyAsk,
        3,
        origin="dev-a",
        block_slots=layout.block,
        per_ciphertext=layout.per_ciphertext,
        ciphertexts=layout.ciphertexts,
        vector_slots=256,
        box=box,
    )

    h.send(ask)

    replies = h.up
    assert len(replies) == layout.parts(256) == 2
    assert all(isinstance(r, RedundancyReply) for r in replies)
    assert [r.part for r in replies] == [0, 1]  # type: ignore[attr-defined]
    back = seal_context(BACK_LABEL, FED, RING, 3)
    first = replies[0]
    assert isinstance(first, RedundancyReply) and first.box is not None
    opened = msgpack.unpackb(
        open_sealed(IDENTITIES["dev-a"], PUBLIC["dev-b"], back, first.box)
    )
    assert opened["count"] == 40  # its class-1 count, for the dominant device only
    bits = [
        decrypt_signs(OWNER, r.products, layout.block, layout.copies)  # type: ignore[attr-defined]
        for r in replies
    ]
    signs = np.packbits(np.concatenate(bits)).tobytes()
    above = gr.count_above(signs, opened["seed"], layout, 256, opened["count"])
    mine = resampler.class_features(1)
    assert above[:5].tolist() == (candidates @ mine.T > ETA).sum(axis=1).tolist()


def test_a_device_without_image_data_answers_with_no_vectors() -> None:
    h = Device("dev-c")
    layout = gr.plan_layout(1, 4, 4096)
    cts = gr.encrypt_candidates(CTX, np.full((1, 4), 0.5), layout)
    payload = msgpack.packb({"label": 0, "eta": ETA, "ciphertexts": cts})
    box = seal(
        IDENTITIES["dev-a"],
        PUBLIC["dev-c"],
        seal_context(OFFER_LABEL, FED, RING, 1),
        payload,
    )
    fields = {"block_slots": 4, "per_ciphertext": 1, "ciphertexts": 1}
    h.send(
        _step(RedundancyAsk, 1, origin="dev-a", vector_slots=1024, box=box, **fields)
    )

    (reply,) = h.up
    assert isinstance(reply, RedundancyReply) and reply.box is not None
    back = seal_context(BACK_LABEL, FED, RING, 1)
    opened = open_sealed(IDENTITIES["dev-a"], PUBLIC["dev-c"], back, reply.box)
    assert msgpack.unpackb(opened)["count"] == 0


def test_foreign_asks_and_stray_results_are_rejected_with_a_reason() -> None:
    h = Device("dev-b", resampler=_resampler(3))
    fields = {"block_slots": 4, "per_ciphertext": 1, "ciphertexts": 1}
    payload = msgpack.packb({"label": 1, "eta": ETA, "ciphertexts": [b"x"]})
    wrong_step = seal(
        IDENTITIES["dev-a"],
        PUBLIC["dev-b"],
        seal_context(OFFER_LABEL, FED, RING, 9),
        payload,
    )

    h.send(
        _step(RedundancyAsk, 1, origin="dev-d", vector_slots=1024, box=b"b", **fields)
    )
    h.send(
        _step(
            RedundancyAsk,
            1,
            origin="dev-a",
            vector_slots=1024,
            box=wrong_step,
            **fields,
        )
    )
    h.send(_step(RedundancyResult, 1, peers=(), vector_slots=64))
    other_run = _c(RedundancyResult, run_id="other", step=1, peers=(), vector_slots=64)
    h.send(other_run)

    reasons = [r for _, r in h.device.rejections]
    assert "not a peer of this run" in reasons[0]
    assert "redundancy ask" in reasons[1] and "does not open" in reasons[1]
    assert "no test open" in reasons[2]
    assert "not of this ring" in reasons[3]
    assert h.up == [] and h.bus.handler_errors == 0


def test_a_result_that_does_not_open_is_left_out_and_the_step_completes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resampler = _resampler(4)
    h = Device("dev-a", resampler=resampler)
    h.send(_step(ResampleRequest, 1, nabla_client=0.05))
    offer = h.up[0]
    assert isinstance(offer, RedundancyOffer)
    h.up.clear()
    own = resampler.class_features(1)
    box, signs = _peer_reply(offer, own, 256, "dev-b")
    peers = ("dev-b", "dev-c")
    forged, _ = _peer_reply(offer, own, 256, "dev-b")  # sealed by dev-b, not dev-c

    for peer, peer_box in (("dev-c", forged), ("dev-b", box)):
        result = _step(
            RedundancyResult,
            1,
            peers=peers,
            vector_slots=256,
            peer=peer,
            box=peer_box,
            signs=signs,
        )
        h.send(result)

    assert "result of dev-c left out" in caplog.text
    assert h.device.rejections == []  # the message itself was taken
    (update,) = h.up  # decided on dev-b's vectors alone
    assert isinstance(update, CountUpdate)
    candidates = own[rs.local_redundancy(own)]
    expected = sum(rs.is_globally_redundant(row) for row in candidates @ own.T)
    delta = np.rint(OWNER.decrypt(update.delta)[:4]).astype(int)
    assert delta.tolist() == [0, -expected, 0, 0]


def test_with_no_peer_to_ask_nothing_is_globally_redundant() -> None:
    resampler = _resampler(5)
    h = Device("dev-a", resampler=resampler)
    request = _step(ResampleRequest, 1, nabla_client=0.05)
    assert isinstance(request, ResampleRequest)
    candidates = resampler.class_features(1)[:3]
    exchange = h.device.participant.redundancy
    assert exchange.test is not None

    sent = exchange.start(request, GlobalTestPending(1, candidates), ("dev-a",), CTX)

    assert not sent and h.up == []
    assert exchange.test(1, candidates).tolist() == [False, False, False]
