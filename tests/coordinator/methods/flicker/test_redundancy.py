"""The global redundancy test over the in-memory bus, against an in-process one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt
import pytest

from ursa.coordinator.methods.flicker import algorithm as coord
from ursa.coordinator.methods.flicker.outcome import FlickerPhase, FlickerServiceConfig
from ursa.coordinator.methods.flicker.redundancy import RedundancyTest, vector_slots_for
from ursa.crypto.ckks import pad_length
from ursa.edge_sdk.methods.flicker import resampling as rs
from ursa.lab.simulate.flicker_fleet import FEDERATION, Fleet
from ursa.lab.simulate.flicker_run import (
    CountingContext,
    CountingKeyOwner,
    run_flicker,
)
from ursa.lab.simulate.flicker_train import _digits_setup
from ursa.protocol.envelope import decode, encode
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import BaseMessage, RedundancyReply
from ursa.protocol.topics import CONTROL, up_topic

pytest.importorskip("tenseal")

CLASSES = 4
TABLE = {
    "dev-1": (2, 40, 120, 3),  # the dominant device: under-samples class 2
    "dev-2": (1, 10, 10, 10),
    "dev-3": (1, 40, 15, 30),
    "dev-4": (3, 40, 15, 40),
}
CANDIDATES = 12  # round(theta * 120) buffered by dev-1's local test
SEED = 0


def _images() -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], rs.CentroidFeatures]:
    """Digits 0-3 dealt out as TABLE; the feature extractor fit on other samples.

    The temperature (3x the default) spreads class 2's cosines around eta, so
    the global test keeps some candidates and removes others.
    """
    from ursa.tools.data.loaders import load_digits

    data = load_digits()
    keep = data.y < CLASSES
    x, y = data.x[keep], data.y[keep]
    rng = np.random.default_rng(SEED)
    members = [rng.permutation(np.flatnonzero(y == c)) for c in range(CLASSES)]
    aux = np.concatenate([m[:10] for m in members])
    fitted = rs.CentroidFeatures.fit(x[aux], y[aux], CLASSES)
    extractor = rs.CentroidFeatures(fitted.centroids, 3 * fitted.temperature)
    taken, data_of = [10] * CLASSES, {}
    for device, row in TABLE.items():
        picked = []
        for c, n in enumerate(row):
            picked.append(members[c][taken[c] : taken[c] + n])
            taken[c] += n
        idx = np.concatenate(picked)
        data_of[device] = (x[idx], y[idx])
    return data_of, extractor


DATA, EXTRACTOR = _images()
Data = Mapping[str, tuple[np.ndarray, np.ndarray]]


def _resamplers(
    data: Data = DATA, extractor: rs.CentroidFeatures = EXTRACTOR
) -> dict[str, rs.DataResampler]:
    """One DataResampler per device, each with its own seeded generator.

    (`ursa simulate flicker --train` shares one generator between devices
    and CKKS masks; here each device's over-sampling draws the same images
    in both runs, whatever the order of the messages.)
    """
    return {
        d: rs.DataResampler(
            rs.TrainingView.of(x, y, CLASSES), extractor, np.random.default_rng(i)
        )
        for i, (d, (x, y)) in enumerate(data.items())
    }


def _encrypted_global_test(
    dominant: str,
    resamplers: Mapping[str, rs.DataResampler],
    extractor: rs.FeatureExtractor,
    owner: CountingKeyOwner,
    ctx: CountingContext,
    rng: np.random.Generator,
    errors: list[float],
) -> rs.GlobalTest:
    """The §3.2.2 global test in process, each cosine checked against plaintext.

    The reference the wire test is compared with: other devices' cosines on
    the dominant's ciphertext, computed by the same algorithm functions.
    """

    def test(label: int, candidates: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        others = []
        for d, r in resamplers.items():
            if d != dominant:
                x, y = r.view.materialise()
                if np.any(y == label):
                    others.append(rs.unit_rows(extractor(x[y == label])))
        if not others:
            return np.zeros(len(candidates), dtype=bool)
        block = pad_length(candidates.shape[1])
        copies = min(ctx.slot_count // block, pad_length(max(map(len, others))))
        flags = []
        for b in candidates:
            ct = rs.encrypt_tiled(ctx, b, copies)
            sims = np.concatenate(
                [
                    coord.decrypt_block_similarities(
                        owner,
                        rs.masked_block_products(ctx, ct, v, copies, rng),
                        len(v),
                        block,
                    )
                    for v in others
                ]
            )
            plain = np.concatenate([v @ b for v in others])
            errors.append(float(np.max(np.abs(sims - plain))))
            if errors[-1] > 1e-3:  # the masks' CKKS error
                raise AssertionError(f"global-test cosine error {errors[-1]}")
            flags.append(rs.is_globally_redundant(sims))
        return np.asarray(flags, dtype=bool)

    return test


def _simulated(
    peers_of: Mapping[str, set[str]] | None = None,
    data: Data = DATA,
    extractor: rs.CentroidFeatures = EXTRACTOR,
) -> dict[str, rs.DataResampler]:
    """`tools/flicker_run.run_flicker` with the simulator's encrypted global test."""
    sim = _resamplers(data, extractor)
    owner = CountingKeyOwner(Counter())
    ctx = CountingContext.counting(owner.public_context_bytes(), Counter())
    rng, errors = np.random.default_rng(99), []
    for d, r in sim.items():
        peers = (peers_of or {}).get(d, set(sim))
        others = {p: q for p, q in sim.items() if p in peers or p == d}
        r.global_test = _encrypted_global_test(
            d, others, extractor, owner, ctx, rng, errors
        )
    counts = {d: tuple(int(c) for c in r.view.counts()) for d, r in sim.items()}
    run_flicker(counts, sim, seed=SEED, key_owner=owner, device_context=ctx)
    return sim


def _assert_same_views(wire: Mapping[str, rs.DataResampler], sim: Mapping) -> None:
    assert set(wire) == set(sim)
    for d in wire:
        assert np.array_equal(wire[d].view.kept, sim[d].view.kept), d
        assert np.array_equal(wire[d].view.extra_x, sim[d].view.extra_x), d


def _redundancy_log(fleet: Fleet) -> list[dict[str, object]]:
    return [e for e in fleet.coordinator.outcome().log if "redundancy" in e]


def _drop_replies_of(fleet: Fleet, device: str) -> list[bytes]:
    """Lose every RedundancyReply ``device`` sends; return the lost payloads."""
    lost: list[bytes] = []

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        mine = s == device and r == "coordinator"
        if mine and decode(payload).kind == "redundancy_reply":
            lost.append(payload)
            return True
        return False

    fleet.bus.drop_filter = drop
    return lost


def _inject(fleet: Fleet, device: str, message: BaseMessage | bytes) -> None:
    """Publish on ``device``'s up topic as if the device had sent it."""
    raw = InMemoryTransport(fleet.bus, f"inject-{device}")
    raw.connect()
    data = message if isinstance(message, bytes) else encode(message)
    raw.publish(up_topic(FEDERATION, device, CONTROL), data)
    raw.close()


def _finish(fleet: Fleet) -> None:
    """Advance the fake clock past deadlines until the run ends (as `Fleet.run`)."""
    for _ in range(100):
        if fleet.coordinator.phase in (FlickerPhase.DONE, FlickerPhase.FAILED):
            return
        fleet.clock.advance(fleet.coordinator.config.reply_deadline_s)
        fleet.coordinator.tick()


def test_the_wire_test_removes_what_the_simulator_removes(
    fleets: Callable[..., Fleet],
) -> None:
    sim = _simulated()
    wire = _resamplers()
    fleet = fleets(TABLE, resamplers=wire, seed=SEED)

    outcome = fleet.run()

    assert outcome.phase is FlickerPhase.DONE and outcome.state is not None
    _assert_same_views(wire, sim)
    removed = fleet.participants["dev-1"].state.removed
    assert 0 < removed < CANDIDATES  # some candidates removed, some kept
    assert fleet.participants["dev-1"].counts == tuple(sim["dev-1"].view.counts())
    assert outcome.state.global_counts == tuple(
        int(c) for c in np.sum([r.view.counts() for r in sim.values()], axis=0)
    )
    (entry,) = _redundancy_log(fleet)
    assert entry["peers"] == ["dev-2", "dev-3", "dev-4"] and entry["silent"] == []
    assert fleet.coordinator.rejections == []
    assert all(p.rejections == [] for p in fleet.participants.values())
    assert fleet.bus.handler_errors == 0


@pytest.mark.parametrize("name", ["D1", "D3"])
def test_on_the_papers_tables_the_wire_test_equals_the_simulator(
    name: str, fleets: Callable[..., Fleet]
) -> None:
    setup = _digits_setup(name, SEED)  # Table 1 scaled down to digits 0-3
    data = {d: (x, setup.device_y[d]) for d, x in setup.device_x.items()}
    sim = _simulated(data=data, extractor=setup.extractor)
    wire = _resamplers(data, setup.extractor)
    counts = {d: tuple(int(c) for c in r.view.counts()) for d, r in wire.items()}
    fleet = fleets(counts, resamplers=wire, seed=SEED)

    outcome = fleet.run()

    assert outcome.phase is FlickerPhase.DONE
    _assert_same_views(wire, sim)
    assert sum(p.state.removed for p in fleet.participants.values()) > 0
    assert all(e["silent"] == [] for e in _redundancy_log(fleet))
    assert _redundancy_log(fleet)  # the global test ran
    assert fleet.coordinator.rejections == []


def test_without_the_global_test_the_local_test_removes_every_candidate(
    fleets: Callable[..., Fleet],
) -> None:
    wire = _resamplers()
    fleet = fleets(TABLE, resamplers=wire, seed=SEED, global_test=False)

    fleet.run()

    assert fleet.participants["dev-1"].state.removed == CANDIDATES
    assert _redundancy_log(fleet) == []


def test_a_silent_peer_is_skipped_at_the_deadline(fleets: Callable[..., Fleet]) -> None:
    sim = _simulated({"dev-1": {"dev-2", "dev-3"}})
    wire = _resamplers()
    fleet = fleets(TABLE, resamplers=wire, seed=SEED)
    _drop_replies_of(fleet, "dev-4")

    fleet.coordinator.start()
    assert fleet.coordinator.phase is FlickerPhase.RESAMPLE  # waiting for dev-4
    _finish(fleet)

    assert fleet.coordinator.phase is FlickerPhase.DONE
    (entry,) = _redundancy_log(fleet)
    assert entry["peers"] == ["dev-2", "dev-3"] and entry["silent"] == ["dev-4"]
    _assert_same_views(wire, sim)  # decided on dev-2's and dev-3's vectors only
    assert fleet.coordinator.rejections == []


def test_malformed_foreign_and_late_replies_are_rejected_and_logged(
    fleets: Callable[..., Fleet],
) -> None:
    fleet = fleets(TABLE, resamplers=_resamplers(), seed=SEED)
    lost = _drop_replies_of(fleet, "dev-4")
    fleet.coordinator.start()
    genuine = [decode(p) for p in lost]
    assert genuine and all(isinstance(m, RedundancyReply) for m in genuine)
    first = genuine[0]
    assert isinstance(first, RedundancyReply)
    fleet.bus.drop_filter = None

    context = fleet.participants["dev-4"].context
    assert context is not None
    forged = [
        {"products": b"x" * 64},  # not a ciphertext
        {"parts": first.parts + 1},  # not the reply's size
        {"products": context.encrypt(np.full(context.slot_count, 1e9))},  # forged
        {"sender": "dev-1"},  # the dominant device was not asked
    ]
    for i, change in enumerate(forged):
        message = first.model_copy(update={**change, "message_id": f"forged{i}"})
        _inject(fleet, message.sender, message)
    _finish(fleet)
    _inject(fleet, "dev-4", lost[1])  # after the result: late

    codes = [(r.device, r.code) for r in fleet.coordinator.rejections]
    assert codes == [
        ("dev-4", "bad_ciphertext"),
        ("dev-4", "malformed"),
        ("dev-4", "bad_ciphertext"),
        ("dev-1", "unauthorised"),
        ("dev-4", "late"),
    ]
    assert fleet.coordinator.phase is FlickerPhase.DONE
    (entry,) = _redundancy_log(fleet)
    assert entry["silent"] == ["dev-4"]
    assert fleet.bus.handler_errors == 0


def test_vector_slots_follow_the_global_counts_never_a_peer_and_are_capped() -> None:
    # 4 features: 1024 blocks per ciphertext; 16 candidates: 64 blocks each
    assert vector_slots_for((9, 200, 130, 3), 4, 16, 1, 4096) == 256
    assert vector_slots_for((9, 20, 13, 3), 4, 16, 1, 4096) == 64  # >= one ciphertext
    capped = vector_slots_for((9, 10**6, 1, 1), 4, 16, 1, 4096, 8)
    assert capped == 8 * 64  # 8 product ciphertexts at most


def test_a_test_counts_each_part_once_and_names_the_missing_peers() -> None:
    test = RedundancyTest.open(
        dominant="a",
        step=3,
        recipients=frozenset({"b", "c"}),
        layout=(4, 16, 1),
        global_counts=(1, 100, 2, 3),
        slot_count=4096,
        deadline_at=10.0,
    )
    test.accept_offer("b", frozenset({"b", "c"}), (4, 16, 1))
    signs = np.ones(1024, dtype=bool)
    test.check_part("b", 0, test.parts, has_box=True)
    test.add_part("b", 0, signs, b"box")
    test.add_part("b", 1, signs, None)

    assert (test.vector_slots, test.parts) == (128, 2)
    assert test.complete == ("b",) and test.missing == ("c",)
    assert not test.is_done(9.0) and test.is_done(10.0)
    box, packed = test.signs_of("b")
    assert box == b"box" and len(packed) == 2 * 1024 // 8
    for args in (("c", 0, 2, True), ("b", 0, 2, True), ("b", 1, 3, False)):
        with pytest.raises(ValueError):
            test.check_part(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        test.accept_offer("b", frozenset({"b", "c"}), (4, 16, 1))  # twice
    with pytest.raises(ValueError):
        test.accept_offer("c", frozenset({"b"}), (4, 16, 1))  # other peers


def test_config_gives_the_redundancy_deadline_and_cap() -> None:
    config = FlickerServiceConfig(federation="f", num_classes=4)
    assert config.redundancy_deadline_s < config.reply_deadline_s
    assert config.max_product_ciphertexts == 64
