from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker.algorithm import (
    Method,
    ResamplingError,
    SaturationReason,
)


@dataclass
class ScriptedResampler:
    """Removes the scripted numbers in turn; over-sampling adds what is asked."""

    removals: list[int] = field(default_factory=list)
    calls: list[tuple[str, int, int]] = field(default_factory=list)

    def undersample(self, counts: dev.IntArray, label: int) -> int:
        removed = self.removals.pop(0) if self.removals else 0
        self.calls.append(("under", label, removed))
        return removed

    def oversample(self, counts: dev.IntArray, label: int, amount: int) -> int:
        self.calls.append(("over", label, amount))
        return amount


def test_local_imbalance_is_min_over_max() -> None:
    assert dev.local_imbalance([10, 500, 700, 4000]) == 0.0025
    with pytest.raises(ResamplingError):
        dev.local_imbalance([0, 0])
    with pytest.raises(ResamplingError):
        dev.local_imbalance([1.0, 2.0])


def test_oversample_amount_rounds_half_up() -> None:
    assert dev.oversample_amount([10, 4000]) == 400
    assert dev.oversample_amount([2, 5]) == 3  # 1/LI = 2.5 -> 3
    assert dev.round_half_up(0.5) == 1
    with pytest.raises(ResamplingError, match="no samples"):
        dev.oversample_amount([0, 5])


def test_undersample_candidates_is_theta_of_the_class() -> None:
    assert dev.undersample_candidates(4000, 0.1) == 400
    assert dev.undersample_candidates(3, 0.1) == 1
    assert dev.undersample_candidates(0, 0.1) == 0
    with pytest.raises(ResamplingError):
        dev.undersample_candidates(10, 0.0)


def test_steps_alternate_under_first_and_reproduce_paper_table6_client1() -> None:
    # AG News, client 1: 4000 -> 3793 (207 removed), then 10 + round(3793/10) = 389.
    state = dev.init_device([10, 500, 700, 4000])
    resampler = ScriptedResampler(removals=[207])
    state, first = dev.resample_step(state, resampler)
    assert (first.method, first.label, first.delta) == (
        Method.UNDER,
        3,
        (0, 0, 0, -207),
    )
    assert not first.saturated
    state, second = dev.resample_step(state, resampler)
    assert (second.method, second.label, second.delta) == (
        Method.OVER,
        0,
        (379, 0, 0, 0),
    )
    assert state.counts == (389, 500, 700, 3793)
    assert second.li_after == pytest.approx(0.1026, abs=1e-4)
    assert state.saturation is SaturationReason.THRESHOLD
    assert (state.added, state.removed, state.steps) == (379, 207, 2)


def test_saturated_device_changes_nothing() -> None:
    state = dev.init_device([100, 50, 200, 10])  # LI 0.05 = nabla_client
    resampler = ScriptedResampler(removals=[5])
    state, report = dev.resample_step(state, resampler)
    assert report.saturated and not report.changed
    assert resampler.calls == []
    assert state.saturation is SaturationReason.THRESHOLD


def test_missing_class_saturates_at_once() -> None:
    state, report = dev.resample_step(
        dev.init_device([0, 50, 200]), ScriptedResampler()
    )
    assert report.saturated
    assert state.saturation is SaturationReason.MISSING_CLASS


def test_two_idle_steps_stall_the_device() -> None:
    resampler = ScriptedResampler()
    state = dev.init_device([1, 1000], first=Method.UNDER, alternate=False)
    state, _ = dev.resample_step(state, resampler)
    assert not state.saturated
    state, report = dev.resample_step(state, resampler)
    assert report.saturated
    assert state.saturation is SaturationReason.STALLED


def test_max_steps_caps_a_device() -> None:
    state = dev.init_device([1, 1000], first=Method.UNDER, alternate=False)
    state, _ = dev.resample_step(state, ScriptedResampler([1]), max_steps=1)
    assert state.saturation is SaturationReason.MAX_STEPS


def test_baseline_mode_repeats_one_method_until_threshold() -> None:
    state = dev.init_device([30, 400, 600, 3000], first=Method.OVER, alternate=False)
    resampler = dev.CountResampler()
    while not state.saturated:
        state, report = dev.resample_step(state, resampler)
        assert report.method in (Method.OVER, None)
    # 30 + 100 = 130 (LI 0.0433), + round(3000/130) = 23 -> 153, LI 0.051
    assert state.counts == (153, 400, 600, 3000)
    assert state.removed == 0


def test_count_resampler_models_the_redundancy_test() -> None:
    model = dev.CountResampler(theta=0.1, redundant_fraction=0.5)
    counts = np.array([10, 500, 700, 4000])
    assert model.undersample(counts, 3) == 200
    assert model.oversample(counts, 0, 400) == 400
    assert model.oversample(np.array([0, 5]), 0, 7) == 0
    with pytest.raises(ResamplingError):
        dev.CountResampler(redundant_fraction=1.5)


def test_impossible_resampler_answers_raise() -> None:
    state = dev.init_device([1, 100])
    with pytest.raises(ResamplingError, match="removed"):
        dev.resample_step(state, ScriptedResampler(removals=[100]))
    with pytest.raises(ResamplingError, match="nabla_client"):
        dev.resample_step(state, ScriptedResampler(), nabla_client=0.0)


def test_state_summary_is_json_able() -> None:
    summary = dev.init_device([10, 4000]).to_dict()
    assert summary["counts_before"] == [10, 4000]
    assert summary["li_before"] == 0.0025
    assert summary["saturation"] is None


# --- encrypted messages


def test_encrypted_messages_match_plaintext() -> None:
    pytest.importorskip("tenseal")
    from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext

    owner = CkksKeyOwner()
    ctx = CkksPublicContext.from_bytes(owner.public_context_bytes())
    table = np.array([[10, 500, 700, 4000], [20, 700, 500, 3000], [30, 400, 600, 3000]])
    ct = dev.encrypt_counts(ctx, table[0])
    for row in table[1:]:
        ct = dev.add_counts(ctx, ct, row)
    np.testing.assert_allclose(owner.decrypt(ct)[:4], table.sum(axis=0), atol=1e-3)

    new_row = [389, 500, 700, 3793]
    updated = dev.update_global(ctx, ct, table[0], new_row)
    expected = table.sum(axis=0) - table[0] + new_row
    np.testing.assert_allclose(owner.decrypt(updated)[:4], expected, atol=1e-3)

    gd_unit = table.sum(axis=0) / np.linalg.norm(table.sum(axis=0))
    reply = dev.similarity_reply(
        ctx, ctx.encrypt(gd_unit), table[1], np.random.default_rng(0)
    )
    cosine = table[1] @ gd_unit / np.linalg.norm(table[1])
    assert owner.decrypt_sum(reply) == pytest.approx(cosine, abs=1e-5)
    # the reply's slots are masked: no slot is the plain product
    slots = owner.decrypt(reply)[:4]
    assert np.all(np.abs(slots - table[1] / np.linalg.norm(table[1]) * gd_unit) > 1e-3)

    with pytest.raises(ResamplingError):
        dev.update_global(ctx, ct, [1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(ResamplingError):
        dev.similarity_reply(ctx, ct, [0, 0, 0, 0], np.random.default_rng(0))
