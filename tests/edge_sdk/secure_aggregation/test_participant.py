"""MaskingParticipant: the masked input hides x, and every unsafe step is refused."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

import ursa.edge_sdk.secure_aggregation as device_secagg
from tests.secagg_round import FEDERATION, RUN, Round, device_ids
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.mask_stream import (
    MASK_BLOCK_WORDS,
    PAIR_MASK_LABEL,
    SELF_MASK_LABEL,
    mask_stream,
    pair_context,
    pairwise_seed,
)
from ursa.crypto.neighbour_graph import graph_seed, neighbours, share_threshold
from ursa.crypto.shamir import Share, combine_shares
from ursa.edge_sdk.secure_aggregation import (
    KeyAdvert,
    MaskingParticipant,
    ParticipantStage,
    PeerAdvert,
    SecAggError,
    advert_transcript,
)
from ursa.edge_sdk.secure_aggregation.participant import SHARE_BOX_BYTES

ZEROS = np.zeros(1000, dtype=np.uint32)


def _masked_round(k: int = 5, threshold: int = 3, round_index: int = 3) -> Round:
    secagg = Round(k=k, threshold=threshold, degree=k - 1, round_index=round_index)
    secagg.advertise()
    secagg.share()
    secagg.deliver()
    for device_id in secagg.shared:
        secagg.devices[device_id].mask(ZEROS)
    return secagg


def test_a_masked_zero_vector_looks_uniform_and_changes_every_round() -> None:
    first = _masked_round(round_index=3).devices["dev-00"].mask(ZEROS)
    second = _masked_round(round_index=4).devices["dev-00"].mask(ZEROS)
    assert np.count_nonzero(first) > 990
    assert abs(first.astype(np.float64).mean() / 2**32 - 0.5) < 0.05
    assert np.count_nonzero(first == second) < 5
    correlation = np.corrcoef(first.astype(np.float64), second.astype(np.float64))
    assert abs(correlation[0, 1]) < 0.15


def test_advert_bytes_round_trip_and_signature_binds_the_round() -> None:
    identity = DeviceIdentity.generate("dev-00")
    device = MaskingParticipant(
        identity=identity, federation="f", run="r", round_index=1, threshold=1, degree=0
    )
    advert = device.advertise()
    assert KeyAdvert.from_bytes(advert.to_bytes()) == advert
    assert device.advertise() == advert
    peer = PeerAdvert.of(identity.public(), advert)
    assert PeerAdvert.from_bytes(peer.to_bytes()) == peer
    assert advert_transcript(
        "f", "r", 1, "dev-00", advert.c_public, advert.s_public
    ) != (advert_transcript("f", "r", 2, "dev-00", advert.c_public, advert.s_public))
    with pytest.raises(SecAggError):
        KeyAdvert.from_bytes(advert.to_bytes()[:-1])


def test_a_forged_advert_signature_is_refused() -> None:
    secagg = Round(k=4, threshold=2, degree=3)
    secagg.advertise()
    roster = secagg.roster("dev-00")
    bad = bytearray(roster[1].signature)
    bad[0] ^= 1
    roster[1] = dataclasses.replace(roster[1], signature=bytes(bad))
    with pytest.raises(SecAggError, match="does not verify"):
        secagg.devices["dev-00"].share(roster, secagg.participants)
    assert secagg.devices["dev-00"].stage is ParticipantStage.ADVERTISED


def test_keys_swapped_under_a_valid_signature_are_refused() -> None:
    secagg = Round(k=4, threshold=2, degree=3)
    secagg.advertise()
    roster = secagg.roster("dev-00")
    other = KeyAdvert.from_bytes(secagg.adverts["dev-03"])
    roster[0] = dataclasses.replace(roster[0], s_public=other.s_public)
    with pytest.raises(SecAggError, match="does not verify"):
        secagg.devices["dev-00"].share(roster, secagg.participants)


def test_missing_duplicate_and_stranger_adverts_are_refused() -> None:
    secagg = Round(k=4, threshold=2, degree=3)
    secagg.advertise()
    roster = secagg.roster("dev-00")
    device = secagg.devices["dev-00"]
    with pytest.raises(SecAggError, match="no advert for neighbour"):
        device.share(roster[1:], secagg.participants)
    with pytest.raises(SecAggError, match="two adverts"):
        device.share([*roster, roster[0]], secagg.participants)
    with pytest.raises(SecAggError, match="not a participant"):
        device.share(roster, ["dev-00", "dev-02", "dev-03"])
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        device.share(roster, ["dev-00"])


def test_a_tampered_or_misaddressed_box_is_refused() -> None:
    secagg = Round(k=4, threshold=2, degree=3)
    secagg.advertise()
    secagg.share()
    inbox = secagg.inbox["dev-00"]
    sender, box = inbox[0]
    assert len(box) == SHARE_BOX_BYTES
    tampered = bytearray(box)
    tampered[20] ^= 1
    device = secagg.devices["dev-00"]
    with pytest.raises(SecAggError, match="does not open"):
        device.receive_shares([(sender, bytes(tampered)), *inbox[1:]])
    misaddressed = secagg.inbox["dev-01"][-1]  # from dev-03 to dev-01
    with pytest.raises(SecAggError, match="does not open"):
        device.receive_shares([misaddressed])
    with pytest.raises(SecAggError, match="two share boxes"):
        device.receive_shares([inbox[0], inbox[0]])
    assert device.stage is ParticipantStage.SHARED  # nothing kept from the failed calls
    device.receive_shares(inbox)
    assert device.stage is ParticipantStage.RECEIVED


def test_a_box_from_a_non_neighbour_is_refused() -> None:
    secagg = Round(k=12, threshold=4, degree=4)
    secagg.advertise()
    secagg.share()
    stranger = next(u for u in device_ids(12)[1:] if u not in secagg.graph()["dev-00"])
    with pytest.raises(SecAggError, match="not a neighbour"):
        secagg.devices["dev-00"].receive_shares([(stranger, bytes(SHARE_BOX_BYTES))])


def test_too_few_neighbours_sharing_is_refused_before_training() -> None:
    secagg = Round(k=5, threshold=4, degree=4)
    secagg.advertise()
    secagg.share(dropped=["dev-01", "dev-02"])
    with pytest.raises(SecAggError, match="needed"):
        secagg.devices["dev-00"].receive_shares(secagg.inbox["dev-00"])


def test_a_mask_is_used_for_one_vector_only() -> None:
    secagg = _masked_round()
    device = secagg.devices["dev-00"]
    again = device.mask(ZEROS.copy())
    assert np.array_equal(again, device.mask(ZEROS))
    with pytest.raises(SecAggError, match="already used"):
        device.mask(ZEROS + np.uint32(1))


def test_steps_out_of_order_are_refused() -> None:
    secagg = Round(k=3, threshold=2, degree=2)
    device = secagg.devices["dev-00"]
    with pytest.raises(SecAggError, match="stage"):
        device.share([], secagg.participants)
    device.advertise()
    with pytest.raises(SecAggError, match="stage"):
        device.mask(ZEROS)
    with pytest.raises(SecAggError, match="stage"):
        device.unmask(secagg.participants, [])


def test_unmask_reveals_b_for_survivors_and_s_for_dropped() -> None:
    secagg = _masked_round()
    reveals = secagg.devices["dev-00"].unmask(
        ["dev-00", "dev-01", "dev-02"], ["dev-03", "dev-04"]
    )
    assert [(r.owner, r.kind) for r in reveals] == [
        ("dev-00", "b"),
        ("dev-01", "b"),
        ("dev-02", "b"),
        ("dev-03", "s"),
        ("dev-04", "s"),
    ]
    assert reveals == secagg.devices["dev-00"].unmask(
        ["dev-02", "dev-01", "dev-00"], ["dev-04", "dev-03"]
    )  # a retransmitted request gets the same answer


def test_too_few_survivors_is_refused() -> None:
    secagg = _masked_round(threshold=3)
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        secagg.devices["dev-00"].unmask(["dev-00", "dev-01"], ["dev-02"])


def test_a_contradicting_reveal_is_refused() -> None:
    secagg = _masked_round()
    device = secagg.devices["dev-00"]
    device.unmask(["dev-00", "dev-01", "dev-02", "dev-03"], ["dev-04"])
    with pytest.raises(SecAggError, match="never both"):
        device.unmask(["dev-00", "dev-01", "dev-02", "dev-04"], ["dev-03"])


def test_inconsistent_lists_are_refused() -> None:
    secagg = _masked_round()
    device = secagg.devices["dev-00"]
    with pytest.raises(SecAggError, match="overlap"):
        device.unmask(["dev-00", "dev-01", "dev-02"], ["dev-02", "dev-03", "dev-04"])
    with pytest.raises(SecAggError, match="not among the survivors"):
        device.unmask(["dev-01", "dev-02", "dev-03"], ["dev-00", "dev-04"])
    with pytest.raises(SecAggError, match="not participants"):
        device.unmask(["dev-00", "dev-01", "dev-02"], ["dev-03", "dev-04", "dev-77"])
    with pytest.raises(SecAggError, match="neither survivor nor dropped"):
        device.unmask(["dev-00", "dev-01", "dev-02"], ["dev-03"])


def test_a_peer_that_never_shared_cannot_be_revealed() -> None:
    secagg = Round(k=5, threshold=3, degree=4)
    secagg.advertise()
    secagg.share(dropped=["dev-04"])
    secagg.deliver()
    device = secagg.devices["dev-00"]
    device.mask(ZEROS)
    with pytest.raises(SecAggError, match="never shared"):
        device.unmask(["dev-00", "dev-01", "dev-02"], ["dev-03", "dev-04"])


def test_seeded_rng_makes_keys_reproducible() -> None:
    identity = DeviceIdentity.generate("dev-00")

    def make() -> MaskingParticipant:
        rng = np.random.default_rng(7)
        return MaskingParticipant(
            identity=identity,
            federation=FEDERATION,
            run=RUN,
            round_index=1,
            threshold=1,
            degree=0,
            rng=lambda n: rng.bytes(n),
        )

    assert make().advertise() == make().advertise()


def _drawing(values: list[bytes]) -> Callable[[int], bytes]:
    """An rng that hands out c, s and b in that order."""
    remaining = iter(values)
    return lambda _: next(remaining)


def _framed(label: bytes, *parts: bytes) -> bytes:
    return label + b"".join(struct.pack(">I", len(p)) + p for p in parts)


def test_boxes_and_the_masked_vector_are_the_documented_bytes() -> None:
    """Rebuilt from the module docstring alone: the box, its index, the mask."""
    k, degree, threshold, round_index = 12, 4, 8, 5
    keys = {
        d: [bytes([i, j]) * 16 for j in range(3)] for i, d in enumerate(device_ids(k))
    }
    identities = {d: DeviceIdentity.generate(d) for d in keys}
    devices = {
        d: MaskingParticipant(
            identity=identities[d],
            federation=FEDERATION,
            run=RUN,
            round_index=round_index,
            threshold=threshold,
            degree=degree,
            rng=_drawing(keys[d]),
        )
        for d in keys
    }
    adverts = {d: device.advertise() for d, device in devices.items()}
    graph = neighbours(sorted(keys), degree, graph_seed(FEDERATION, RUN, round_index))
    boxes = {}
    for d, device in devices.items():
        roster = [PeerAdvert.of(identities[v].public(), adverts[v]) for v in graph[d]]
        for recipient, box in device.share(roster, sorted(keys)):
            boxes[d, recipient] = box
    assert set(boxes) == {(u, v) for u in graph for v in graph[u]}
    s_shares: dict[str, list[Share]] = {}
    for (u, v), box in boxes.items():
        transcript = _framed(
            b"ursa-secagg-box-v1",
            FEDERATION.encode(),
            RUN.encode(),
            struct.pack(">Q", round_index),
            u.encode(),
            v.encode(),
            adverts[u].c_public,
            adverts[v].c_public,
        )
        c_v = X25519PrivateKey.from_private_bytes(keys[v][0])
        shared = c_v.exchange(X25519PublicKey.from_public_bytes(adverts[u].c_public))
        key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=transcript
        ).derive(shared)
        assert box[0] == 1 and len(box) == SHARE_BOX_BYTES
        plain = ChaCha20Poly1305(key).decrypt(
            box[1:13], box[13:], box[:13] + transcript
        )
        index = struct.unpack(">H", plain[1:3])[0]
        assert plain[0] == 1
        assert index == sorted((*graph[u], u)).index(v) + 1
        s_shares.setdefault(u, []).append(Share(index, plain[3:37]))
    t_n = share_threshold(threshold, k, degree)
    for u, shares in s_shares.items():
        assert combine_shares(shares[:t_n], t_n) == keys[u][1]  # s_u
    for d, device in devices.items():
        device.receive_shares([(u, boxes[u, d]) for u in graph[d]])
    x = np.arange(3 * MASK_BLOCK_WORDS + 11, dtype=np.uint32)
    u = "dev-05"
    expected = x + mask_stream(keys[u][2], x.size, SELF_MASK_LABEL)
    s_u = X25519PrivateKey.from_private_bytes(keys[u][1])
    for v in graph[u]:
        context = pair_context(FEDERATION, RUN, round_index, u, v)
        seed = pairwise_seed(s_u, adverts[v].s_public, context)
        stream = mask_stream(seed, x.size, PAIR_MASK_LABEL)
        expected = expected + stream if v > u else expected - stream
    assert np.array_equal(devices[u].mask(x), expected)


def test_exported_members_are_pinned() -> None:
    assert set(device_secagg.__all__) == {
        "KeyAdvert",
        "MaskingParticipant",
        "PeerAdvert",
        "SecAggError",
        "ParticipantStage",
        "UnmaskShare",
        "advert_transcript",
    }
