from __future__ import annotations

import numpy as np
import pytest

from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker import resampling as rs
from ursa.edge_sdk.methods.flicker.algorithm import ResamplingError
from ursa.edge_sdk.methods.flicker.resampling import Orientation, TrainingView


def _images(counts: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(counts)), counts).astype(np.int64)
    x = rng.random((len(y), 1, 6, 6)).astype(np.float32)
    return x, y


# --- orientation


def test_quarter_turns_and_flips_are_exact() -> None:
    x, _ = _images([1])
    img = x[0]
    np.testing.assert_array_equal(
        rs.orient(img, Orientation(90.0)), np.rot90(img, 1, axes=(-2, -1))
    )
    np.testing.assert_array_equal(
        rs.orient(img, Orientation(0.0, flip=True)), img[..., ::-1]
    )
    np.testing.assert_array_equal(rs.orient(img, Orientation(0.0)), img)


def test_small_rotation_turns_the_same_way_as_rot90() -> None:
    x, _ = _images([1])
    near = rs.orient(x[0], Orientation(89.9999))
    np.testing.assert_allclose(near, np.rot90(x[0], 1, axes=(-2, -1)), atol=1e-4)


def test_rotation_keeps_a_centred_blob_mass() -> None:
    img = np.zeros((1, 9, 9), dtype=np.float32)
    img[0, 3:6, 3:6] = 1.0
    out = rs.orient(img, Orientation(15.0))
    assert out.sum() == pytest.approx(img.sum(), rel=0.05)
    assert out.dtype == np.float32


# --- over-sampling ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rotate", "dihedral"])
def test_oversampled_images_are_transforms_of_existing_ones(mode: str) -> None:
    x, y = _images([3, 10])
    x0, y0 = x.copy(), y.copy()
    view = TrainingView.of(x, y, 2)
    out = rs.oversample(view, 0, 7, np.random.default_rng(1), mode=mode)  # type: ignore[arg-type]
    assert out.counts().tolist() == [10, 10]
    assert set(out.extra_source.tolist()) <= set(np.flatnonzero(y == 0).tolist())
    # sources are picked uniformly: 7 copies of 3 samples -> 3, 2, 2
    assert sorted(np.bincount(out.extra_source, minlength=3)[:3].tolist()) == [2, 2, 3]
    for img, src, o in zip(
        out.extra_x, out.extra_source, out.extra_orientation, strict=True
    ):
        np.testing.assert_array_equal(img, rs.orient(x[src], o))
        if mode == "dihedral":
            assert o != Orientation()
        else:
            assert abs(o.angle_deg) <= rs.DEFAULT_MAX_ANGLE_DEG and not o.flip
    np.testing.assert_array_equal(x, x0)  # stored data untouched
    np.testing.assert_array_equal(y, y0)
    assert view.counts().tolist() == [3, 10]  # the old view is unchanged


def test_oversampling_an_empty_class_raises() -> None:
    x, y = _images([0, 4])
    with pytest.raises(ResamplingError):
        rs.oversample(TrainingView.of(x, y, 2), 0, 3, np.random.default_rng(0))


def test_materialise_returns_new_arrays() -> None:
    x, y = _images([2, 5])
    view = rs.oversample(TrainingView.of(x, y, 2), 0, 3, np.random.default_rng(0))
    xt, yt = view.materialise()
    assert xt.shape == (10, 1, 6, 6) and yt.tolist() == [0, 0] + [1] * 5 + [0] * 3
    xt[:] = -1.0
    assert (x >= 0).all()


# --- features and redundancy tests


def test_centroid_features_are_probabilities_of_the_nearest_mean() -> None:
    x = np.array([[0.0, 0.0], [0.2, 0.0], [5.0, 5.0], [5.2, 5.0]], dtype=np.float32)
    y = np.array([0, 0, 1, 1], dtype=np.int64)
    features = rs.CentroidFeatures.fit(x, y, 2, temperature=1.0)
    probs = features(np.array([[0.1, 0.0], [4.0, 4.0]], dtype=np.float32))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert probs.argmax(axis=1).tolist() == [0, 1]
    with pytest.raises(ResamplingError, match="auxiliary"):
        rs.CentroidFeatures.fit(x, np.zeros(4, dtype=np.int64), 2)


def test_local_test_picks_the_densest_rows_ordered_by_variance() -> None:
    features = np.array(
        [[1.0, 0.0], [1.0, 0.01], [1.0, 0.02], [0.0, 1.0], [0.7, 0.7], [1.0, 0.03]]
        + [[1.0, 0.5]] * 4
    )
    order = rs.local_redundancy(features, theta=0.2)  # 2 of 10
    assert len(order) == 2
    unit = rs.unit_rows(features)
    sims = unit @ unit.T
    others = sims[~np.eye(10, dtype=bool)].reshape(10, 9)
    top2 = set(np.argsort(-others.mean(axis=1))[:2].tolist())
    assert set(order.tolist()) == top2
    assert others.var(axis=1)[order[0]] >= others.var(axis=1)[order[1]]
    assert rs.local_redundancy(features[:1]).size == 0


def test_global_decision_needs_chi_of_similarities_above_eta() -> None:
    sims = np.array([0.99, 0.985, 0.5, 0.2])
    assert rs.is_globally_redundant(sims, eta=0.98, chi=0.5)
    assert not rs.is_globally_redundant(sims, eta=0.98, chi=0.75)
    assert not rs.is_globally_redundant(np.zeros(0))


def _onehot_features(x: np.ndarray) -> np.ndarray:
    return np.tile([1.0, 0.0, 0.0], (len(x), 1)) + x.reshape(len(x), -1)[:, :3] * 1e-3


def test_undersampling_drops_only_majority_candidates_and_keeps_stored_data() -> None:
    x, y = _images([3, 40])
    x0 = x.copy()
    view = TrainingView.of(x, y, 2)
    local = rs.undersample(view, 1, _onehot_features, theta=0.1)
    assert local.counts().tolist() == [3, 36]
    assert set(np.setdiff1d(view.kept, local.kept).tolist()) <= set(range(3, 43))

    seen: list[tuple[int, tuple[int, ...]]] = []

    def refuse_all_but_first(label: int, candidates: np.ndarray) -> np.ndarray:
        seen.append((label, candidates.shape))
        np.testing.assert_allclose(np.linalg.norm(candidates, axis=1), 1.0)
        return np.arange(len(candidates)) == 0

    glob = rs.undersample(view, 1, _onehot_features, global_test=refuse_all_but_first)
    assert seen == [(1, (4, 3))]
    assert glob.counts().tolist() == [3, 39]
    np.testing.assert_array_equal(x, x0)


def test_data_resampler_runs_flicker_steps_on_images() -> None:
    x, y = _images([2, 5, 60])
    resampler = rs.DataResampler(
        TrainingView.of(x, y, 3), _onehot_features, np.random.default_rng(0)
    )
    state = dev.init_device(resampler.view.counts())
    while not state.saturated:
        state, _ = dev.resample_step(state, resampler)
        assert resampler.view.counts().tolist() == list(state.counts)
    assert state.removed > 0 and state.added > 0
    assert len(resampler.view.extra_y) == state.added
    with pytest.raises(ResamplingError, match="do not match"):
        resampler.undersample(np.array([1, 1, 1]), 2)


# --- encrypted global test


def test_encrypted_block_products_give_cosines_only() -> None:
    pytest.importorskip("tenseal")
    from ursa.coordinator.methods.flicker.algorithm import decrypt_block_similarities
    from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext

    owner = CkksKeyOwner()
    ctx = CkksPublicContext.from_bytes(owner.public_context_bytes())
    rng = np.random.default_rng(5)
    b = rs.unit_rows(rng.random((1, 3)))[0]
    others = rs.unit_rows(rng.random((5, 3)))
    ct = rs.encrypt_tiled(ctx, b, 4)
    cts = rs.masked_block_products(ctx, ct, others, 4, rng)
    sims = decrypt_block_similarities(owner, cts, 5, 4)
    np.testing.assert_allclose(sims, others @ b, atol=1e-4)
    slots = owner.decrypt(cts[0])[:3]
    assert np.all(np.abs(slots - b * others[0]) > 1e-3)  # per-slot products masked
    with pytest.raises(ResamplingError):
        rs.encrypt_tiled(ctx, b, 3)
    with pytest.raises(ResamplingError):
        rs.encrypt_tiled(ctx, b, ctx.slot_count)
