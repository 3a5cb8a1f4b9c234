from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa.edge_sdk.methods.feddisk.sample_weights import (
    crossfit_odds,
    crossfit_parts,
    density_ratio_weights,
    feddisk_sample_weights,
    fit_density_ratio,
    train_local_made,
)
from ursa.edge_sdk.methods.feddisk.settings import DEFAULT_WEIGHT_CLIP
from ursa.edge_sdk.training import (
    TrainConfig,
    TrainingError,
    made_nll,
    train_made_local,
)
from ursa.lab.simulate.feddisk_quality import clean_noisy_mixture, weight_quality
from ursa.models.registry import initial_arrays
from ursa.models.weights import add_scaled

torch.set_num_threads(1)
MADE = {"input_dim": 4, "hidden_sizes": [16]}


def test_density_ratio_weights_clip_and_normalise() -> None:
    p = np.array([0.5, 0.9, 0.999999, 0.01])
    alpha = np.array([1.0, 9.0, 10.0, 0.1])

    weights = density_ratio_weights(p, clip=(0.1, 10.0))

    np.testing.assert_allclose(weights, alpha / alpha.mean())
    assert DEFAULT_WEIGHT_CLIP == (0.1, 10.0)
    with pytest.raises(TrainingError):
        density_ratio_weights(p, clip=(0.0, 1.0))
    with pytest.raises(TrainingError):
        density_ratio_weights(np.zeros((2, 2)))


def test_density_ratio_classifier_separates_sources() -> None:
    rng = np.random.default_rng(0)
    u_global = rng.normal(loc=1.0, size=(200, 1))
    u_local = rng.normal(loc=-1.0, size=(200, 1))
    config = TrainConfig(epochs=20, batch_size=32, lr=0.05)

    h = fit_density_ratio(u_global, u_local, config=config, hidden_size=0)
    p = h.prob_global(np.array([[2.0], [0.0], [-2.0]]))

    assert p[0] > 0.8 > 0.2 > p[2]
    assert 0.3 < p[1] < 0.7


def test_feddisk_sample_weights_shape_and_normalisation() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    config = TrainConfig(epochs=5, batch_size=20, optimizer="adam", lr=1e-2)
    start = initial_arrays("made", MADE, seed=0)
    local = add_scaled(
        start, train_made_local(MADE, start, x, config=config).delta, 1.0
    )

    result = feddisk_sample_weights(
        MADE, start, local, x, config=config, clip=(0.2, 5.0)
    )

    weights = result.weights
    assert weights.shape == result.raw.shape == (40,)
    assert weights.mean() == pytest.approx(1.0)
    assert weights.max() / weights.min() <= 25.0 + 1e-9
    assert result.folds == 2
    summary = result.summary()
    assert summary["at_low"] == pytest.approx(np.mean(result.raw <= 0.2))
    assert summary["p10"] <= 1.0 <= summary["p90"]


def test_samples_unlike_the_global_data_get_lower_weights() -> None:
    # global data: N(0, 1); this device also holds shifted samples
    rng = np.random.default_rng(1)
    config = TrainConfig(epochs=40, batch_size=64, optimizer="adam", lr=1e-2)
    start = initial_arrays("made", MADE, seed=0)
    pooled = rng.normal(size=(400, 4)).astype(np.float32)
    global_made = add_scaled(
        start, train_made_local(MADE, start, pooled, config=config).delta, 1.0
    )
    local_x = np.concatenate(
        [rng.normal(size=(60, 4)), rng.normal(loc=3.0, size=(60, 4))]
    ).astype(np.float32)
    local_made = add_scaled(
        start, train_made_local(MADE, start, local_x, config=config).delta, 1.0
    )

    weights = feddisk_sample_weights(
        MADE, global_made, local_made, local_x, config=config, hidden_size=16
    ).weights

    assert weights[:60].mean() > 1.4 * weights[60:].mean()


def test_crossfit_parts_cover_every_row_once() -> None:
    parts = crossfit_parts(7, 2, seed=3)

    assert sorted(np.concatenate(parts).tolist()) == list(range(7))
    assert [len(p) for p in parts] == [4, 3]
    assert len(crossfit_parts(1, 2, seed=0)) == 1
    with pytest.raises(TrainingError):
        crossfit_parts(4, 1, seed=0)


def test_crossfit_odds_score_rows_the_classifier_never_saw() -> None:
    # fleet rows sit far from local rows: a classifier scoring its own local
    # training rows calls them all local (odds near 0); cross-fitted, the
    # local rows near the fleet's side get the larger odds
    rng = np.random.default_rng(0)
    local = rng.normal(size=(80, 1))
    fleet = rng.normal(loc=1.0, size=(80, 1))
    config = TrainConfig(epochs=30, batch_size=16, lr=0.05)

    odds = crossfit_odds(fleet, local, config=config, hidden_size=0)

    assert odds.shape == (80,)
    order = np.argsort(local[:, 0])
    assert odds[order[-20:]].mean() > 2.0 * odds[order[:20]].mean()
    np.testing.assert_array_equal(
        crossfit_odds(fleet[:1], local[:1], config=config), [1.0]
    )
    with pytest.raises(TrainingError):
        crossfit_odds(fleet, local[:10], config=config)


def test_local_made_stops_and_keeps_its_best_weights() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    x_val = rng.normal(size=(16, 4)).astype(np.float32)
    start = initial_arrays("made", MADE, seed=0)
    config = TrainConfig(epochs=5, batch_size=16, optimizer="adam", lr=1e-2)

    made = train_local_made(MADE, start, x, x_val, config=config, max_epochs=60)

    assert 0 < made.epochs <= 60 and made.epochs % 5 == 0
    assert made.nll == pytest.approx(made_nll(MADE, made.arrays, x_val), rel=1e-6)
    assert made.nll < made_nll(MADE, start, x_val)
    with pytest.raises(TrainingError):
        train_local_made(MADE, start, x, config=config, max_epochs=0)


def test_local_made_without_validation_uses_the_training_loss() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    start = initial_arrays("made", MADE, seed=0)
    config = TrainConfig(epochs=2, batch_size=16, optimizer="adam", lr=1e-2)

    made = train_local_made(MADE, start, x, config=config, max_epochs=6)

    assert made.epochs <= 6
    assert made.nll == pytest.approx(made_nll(MADE, made.arrays, x), rel=1e-6)


def test_weights_follow_the_true_ratio_on_a_clean_noisy_mixture() -> None:
    # devices mix clean N(0, 1) and noisy N(0, 2.5^2) samples in different
    # shares, so p(x)/q_k(x) is known exactly (issue 18's acceptance bar)
    shares = (0.1, 0.35, 0.65, 0.9)
    devices = clean_noisy_mixture(shares, 120, 4, np.random.default_rng(0))
    made_cfg = TrainConfig(epochs=5, batch_size=16, optimizer="adam", lr=1e-2)
    start = initial_arrays("made", MADE, seed=0)
    pooled = np.concatenate([d.x for d in devices])
    global_made = train_local_made(
        MADE, start, pooled, config=made_cfg, max_epochs=40
    ).arrays
    clf_cfg = TrainConfig(epochs=30, batch_size=32, lr=0.01)
    results = []
    for i, device in enumerate(devices):
        local = train_local_made(
            MADE, start, device.x, config=made_cfg, max_epochs=40
        ).arrays
        results.append(
            feddisk_sample_weights(
                MADE,
                global_made,
                local,
                device.x,
                config=clf_cfg.model_copy(update={"seed": i}),
                hidden_size=32,
            )
        )

    quality = weight_quality(
        [r.raw for r in results],
        [r.weights for r in results],
        [d.true_ratio for d in devices],
        DEFAULT_WEIGHT_CLIP,
    )

    assert quality["spearman_mean"] >= 0.4
    assert quality["at_low"] + quality["at_high"] < 0.10
