from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.coordinator.methods.flicker import algorithm as coord
from ursa.coordinator.methods.flicker.algorithm import (
    CorrectionStage,
    FlickerError,
    StopReason,
)
from ursa.edge_sdk.methods.flicker import algorithm as dev

pytest.importorskip("tenseal")
from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext


@pytest.fixture(scope="module")
def owner() -> CkksKeyOwner:
    return CkksKeyOwner()


@pytest.fixture(scope="module")
def device(owner: CkksKeyOwner) -> CkksPublicContext:
    return CkksPublicContext.from_bytes(owner.public_context_bytes())


# --- GI and ring


def test_global_imbalance_is_min_over_max() -> None:
    assert coord.global_imbalance([160, 1650, 2000, 10010]) == pytest.approx(
        0.01598, 1e-3
    )
    assert coord.global_imbalance([0, 5]) == 0.0
    assert coord.global_imbalance([7, 7]) == 1.0


@pytest.mark.parametrize("bad", [[0, 0], [1], [[1, 2]], [1.5, 2.0], [-1, 3]])
def test_global_imbalance_rejects_bad_counts(bad: object) -> None:
    with pytest.raises(FlickerError):
        coord.global_imbalance(bad)  # type: ignore[arg-type]


def test_ring_order_is_a_permutation_that_varies() -> None:
    ids = [f"d{i}" for i in range(6)]
    orders = {coord.choose_ring_order(ids, np.random.default_rng(s)) for s in range(20)}
    assert all(sorted(o) == ids for o in orders)
    assert len(orders) > 1


def test_ring_needs_three_distinct_devices() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(FlickerError, match=">= 3"):
        coord.choose_ring_order(["a", "b"], rng)
    with pytest.raises(FlickerError, match="distinct"):
        coord.choose_ring_order(["a", "b", "a"], rng)


def test_ring_successor_skips_silent_devices() -> None:
    order = ("a", "b", "c", "d")
    assert coord.ring_successor(order, "a") == "b"
    assert coord.ring_successor(order, "a", silent={"b"}) == "c"
    assert coord.ring_successor(order, "c", silent={"d"}) is None
    assert coord.ring_successor(order, "d") is None
    with pytest.raises(FlickerError):
        coord.ring_successor(order, "x")


# --- localisation


def test_pick_dominant_takes_largest_non_saturated_cosine() -> None:
    sims = {"a": 0.9, "b": 0.99, "c": 0.95}
    assert coord.pick_dominant(sims, saturated=()) == "b"
    assert coord.pick_dominant(sims, saturated={"b"}) == "c"
    assert coord.pick_dominant(sims, saturated={"a", "b", "c"}) is None
    assert coord.pick_dominant({"y": 0.5, "x": 0.5}, saturated=()) == "x"


# --- the loop as a state machine


def test_balanced_fleet_is_done_at_once() -> None:
    state = coord.start(["a", "b", "c"], [50, 60, 70])
    assert state.stage is CorrectionStage.DONE
    assert state.stop_reason is StopReason.BALANCED


def test_dominant_stays_until_saturated_then_relocalises_without_it() -> None:
    state = coord.start(["a", "b", "c"], [10, 500, 1000])
    assert state.stage is CorrectionStage.LOCALISE
    assert coord.localisation_candidates(state) == ("a", "b", "c")
    state = coord.on_similarities(state, {"a": 0.8, "b": 0.99, "c": 0.9})
    assert (state.stage, state.dominant) == (CorrectionStage.RESAMPLE, "b")
    state = coord.on_update(state, [20, 500, 950], saturated=False)
    assert (state.stage, state.dominant, state.updates) == (
        CorrectionStage.RESAMPLE,
        "b",
        1,
    )
    state = coord.on_update(state, [30, 500, 900], saturated=True)
    assert state.stage is CorrectionStage.LOCALISE
    assert state.saturated == {"b"}
    assert coord.localisation_candidates(state) == ("a", "c")
    assert state.localisations == 2


def test_run_ends_when_gi_reaches_nabla() -> None:
    state = coord.start(["a", "b", "c"], [10, 500, 1000], nabla=0.1)
    state = coord.on_similarities(state, {"a": 0.5, "b": 0.6, "c": 0.7})
    state = coord.on_update(state, [100, 500, 1000], saturated=False)
    assert state.stop_reason is StopReason.BALANCED
    assert state.gi == pytest.approx(0.1)


def test_run_ends_when_every_device_is_saturated() -> None:
    state = coord.start(["a", "b", "c"], [1, 500, 1000])
    for _ in range(3):
        state = coord.on_similarities(
            state, {d: 0.5 for d in coord.localisation_candidates(state)}
        )
        state = coord.on_update(state, None, saturated=True)
    assert state.stage is CorrectionStage.DONE
    assert state.stop_reason is StopReason.ALL_SATURATED
    assert state.updates == 0


def test_silent_devices_are_not_chosen_and_none_left_means_done() -> None:
    state = coord.start(["a", "b", "c"], [1, 500, 1000])
    done = coord.on_similarities(state, {})
    assert done.stop_reason is StopReason.ALL_SATURATED


def test_steps_in_the_wrong_stage_raise() -> None:
    state = coord.start(["a", "b", "c"], [1, 500, 1000])
    with pytest.raises(FlickerError, match="stage"):
        coord.on_update(state, None, saturated=False)
    with pytest.raises(FlickerError, match="unknown"):
        coord.on_similarities(state, {"zz": 1.0})
    resample = coord.on_similarities(state, {"a": 1.0})
    with pytest.raises(FlickerError, match="stage"):
        coord.on_similarities(resample, {"a": 1.0})
    with pytest.raises(FlickerError, match="classes"):
        coord.on_update(resample, [1, 2], saturated=False)


def test_max_updates_caps_the_run() -> None:
    state = coord.start(["a", "b", "c"], [1, 500, 1000], max_updates=2)
    state = coord.on_similarities(state, {"a": 1.0})
    state = coord.on_update(state, [2, 500, 1000], saturated=False)
    state = coord.on_update(state, [3, 500, 1000], saturated=False)
    assert state.stop_reason is StopReason.MAX_UPDATES


@pytest.mark.parametrize("nabla", [0.0, 1.0, -0.5])
def test_start_rejects_bad_nabla(nabla: float) -> None:
    with pytest.raises(FlickerError):
        coord.start(["a", "b", "c"], [1, 2, 3], nabla=nabla)


def _plain_loop(
    table: list[list[int]], nabla: float, fraction: float
) -> coord.FlickerState:
    """The loop with plaintext cosines, the coordinator and device functions."""
    ids = [f"d{i}" for i in range(len(table))]
    devices = {d: dev.init_device(row) for d, row in zip(ids, table, strict=True)}
    resampler = dev.CountResampler(redundant_fraction=fraction)
    state = coord.start(ids, np.sum(table, axis=0), nabla=nabla)
    for _ in range(100_000):
        if state.stage is CorrectionStage.DONE:
            return state
        if state.stage is CorrectionStage.LOCALISE:
            gd = np.asarray(state.global_counts, float)
            sims = {
                d: float(np.asarray(devices[d].counts) @ gd)
                / float(np.linalg.norm(devices[d].counts) * np.linalg.norm(gd))
                for d in coord.localisation_candidates(state)
            }
            state = coord.on_similarities(state, sims)
        else:
            assert state.dominant is not None
            devices[state.dominant], report = dev.resample_step(
                devices[state.dominant], resampler
            )
            gd_new = np.sum([s.counts for s in devices.values()], axis=0)
            state = coord.on_update(
                state, gd_new if report.changed else None, saturated=report.saturated
            )
    raise AssertionError("the FLICKER loop did not terminate")


@settings(max_examples=40, deadline=None)
@given(
    table=st.lists(
        st.lists(st.integers(0, 3000), min_size=4, max_size=4), min_size=3, max_size=6
    ).filter(
        lambda t: (
            all(sum(col) > 0 for col in zip(*t, strict=True))
            and all(sum(row) > 0 for row in t)
        )
    ),
    nabla=st.floats(0.05, 0.9),
    fraction=st.floats(0.0, 1.0),
)
def test_gi_loop_terminates_balanced_or_all_saturated(
    table: list[list[int]], nabla: float, fraction: float
) -> None:
    state = _plain_loop(table, nabla, fraction)
    assert state.stop_reason in (StopReason.BALANCED, StopReason.ALL_SATURATED)
    if state.stop_reason is StopReason.BALANCED:
        assert state.gi >= nabla
    else:
        assert state.saturated == set(state.devices)


# --- CKKS


def test_decrypt_global_counts_matches_plaintext(
    owner: CkksKeyOwner, device: CkksPublicContext
) -> None:
    table = [[10, 500, 700, 4000], [20, 700, 500, 3000], [30, 400, 600, 3000]]
    ct = dev.encrypt_counts(device, table[0])
    for row in table[1:]:
        ct = dev.add_counts(device, bytes(bytearray(ct)), row)
    gd = coord.decrypt_global_counts(owner, ct, 4)
    assert gd.dtype == np.int64
    assert gd.tolist() == np.sum(table, axis=0).tolist()


def test_decrypt_global_counts_rejects_non_integers(
    owner: CkksKeyOwner, device: CkksPublicContext
) -> None:
    with pytest.raises(FlickerError, match="not integers"):
        coord.decrypt_global_counts(owner, device.encrypt([1.5, 2.0]), 2)
    with pytest.raises(FlickerError, match="negative"):
        coord.decrypt_global_counts(owner, device.encrypt([-3.0, 2.0]), 2)


def test_localisation_cosine_matches_plaintext(
    owner: CkksKeyOwner, device: CkksPublicContext
) -> None:
    gd, ld = np.array([160, 1650, 2000, 10010]), np.array([30, 400, 600, 3000])
    enc_unit = coord.encrypt_normalised_global(device, gd)
    reply = dev.similarity_reply(device, enc_unit, ld, np.random.default_rng(1))
    expected = ld @ gd / (np.linalg.norm(ld) * np.linalg.norm(gd))
    assert coord.decrypt_similarity(owner, reply) == pytest.approx(expected, abs=1e-5)


def test_block_similarities_match_plaintext(
    owner: CkksKeyOwner, device: CkksPublicContext
) -> None:
    from ursa.edge_sdk.methods.flicker.resampling import (
        encrypt_tiled,
        masked_block_products,
        unit_rows,
    )

    rng = np.random.default_rng(3)
    b = unit_rows(rng.random((1, 4)))[0]
    others = unit_rows(rng.random((11, 4)))
    ct = encrypt_tiled(device, b, 8)
    cts = masked_block_products(device, ct, others, 8, rng)
    assert len(cts) == 2
    sims = coord.decrypt_block_similarities(owner, cts, 11, 4)
    np.testing.assert_allclose(sims, others @ b, atol=1e-4)
    with pytest.raises(FlickerError):
        coord.decrypt_block_similarities(owner, cts, 17, 4)


def test_a_run_state_round_trips_through_its_dict() -> None:
    state = coord.start(["d1", "d2", "d3"], [10, 900, 40], nabla=0.2)
    state = coord.on_similarities(state, {"d1": 0.2, "d2": 0.9, "d3": 0.4})

    again = coord.FlickerState.from_dict(state.to_dict())

    assert again == state
