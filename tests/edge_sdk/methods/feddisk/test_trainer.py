"""`FeddiskTrainer`: phase dispatch, validation split, switch to weighted phase 2."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings, FeddiskTrainer
from ursa.edge_sdk.torch_trainer import TorchTrainer, round_seed
from ursa.edge_sdk.training import TrainConfig, made_nll, train_made_local
from ursa.lab.simulate.feddisk import MadePhaseSettings as SimulatorSettings
from ursa.models.registry import initial_arrays
from ursa.models.weights import spec_of

CLASSIFIER = {"input_dim": 16, "num_classes": 3, "hidden_sizes": [8]}
SETTINGS = FeddiskSettings(
    made_hidden_sizes=(8,),
    local_made_epochs_per_check=2,
    local_made_max_epochs=4,
    classifier_hidden=8,
    classifier_epochs=3,
    clip=(0.5, 2.0),
)


def _trainer(n: int = 60, seed: int = 4) -> FeddiskTrainer:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 16)) + y[:, None]).astype(np.float32)
    classifier = TorchTrainer(x, y, model_config=CLASSIFIER, model="clf")
    return FeddiskTrainer(classifier, settings=SETTINGS, seed=seed)


def _made(trainer: FeddiskTrainer, seed: int = 1) -> dict[str, np.ndarray]:
    return initial_arrays("made", trainer.made_config, seed=seed)


def test_defaults_are_the_simulators_and_the_made_config_matches() -> None:
    settings, simulator = FeddiskSettings(), SimulatorSettings()

    assert settings.made_hidden_sizes == (simulator.made_hidden,)
    for name in (
        "made_lr",
        "made_batch_size",
        "made_epochs_per_round",
        "val_fraction",
        "local_made_epochs_per_check",
        "local_made_max_epochs",
        "local_made_patience",
        "made_patience",
        "classifier_hidden",
        "classifier_epochs",
        "classifier_lr",
        "classifier_batch_size",
        "clip",
    ):
        assert getattr(settings, name) == getattr(simulator, name), name
    assert settings.made_model_config(64) == {"input_dim": 64, "hidden_sizes": [64]}


def test_settings_refuse_a_bad_clip_and_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        FeddiskSettings(clip=(2.0, 1.0))
    with pytest.raises(ValidationError):
        FeddiskSettings(clip=(0.0, 1.0))
    with pytest.raises(ValidationError):
        FeddiskSettings(max_made_rounds=3)  # type: ignore[call-arg]


def test_validation_split_is_seeded_disjoint_and_keeps_one_sample() -> None:
    trainer, same, other = _trainer(), _trainer(), _trainer(seed=5)

    assert (len(trainer.x_train), len(trainer.x_val)) == (51, 9)  # round(60 * 0.15)
    rows = {r.tobytes() for r in trainer.x_train} | {r.tobytes() for r in trainer.x_val}
    assert len(rows) == 60
    np.testing.assert_array_equal(trainer.x_val, same.x_val)
    assert not np.array_equal(trainer.x_val, other.x_val)
    assert (len(_trainer(n=2).x_val), len(_trainer(n=2).x_train)) == (1, 1)
    single = _trainer(n=1)
    np.testing.assert_array_equal(single.x_val, single.x_train)


def test_made_phase_trains_and_checks_the_made() -> None:
    trainer = _trainer()
    made = _made(trainer)

    delta = trainer.train_delta(3, made, delta_scale=1.0)
    loss, n_val = trainer.validation_loss(made)

    assert trainer.phase == "made" and trainer.model == "made"
    assert trainer.sample_weights is None
    expected = train_made_local(
        trainer.made_config,
        made,
        trainer.x_train,
        config=TrainConfig(
            epochs=1, batch_size=16, optimizer="adam", lr=1e-2, seed=round_seed(4, 3)
        ),
    )
    assert delta.num_examples == 51
    for name, value in delta.delta.items():
        np.testing.assert_array_equal(value, expected.delta[name])
    assert n_val == 9
    assert loss == made_nll(trainer.made_config, made, trainer.x_val)
    assert trainer.local_loss(made) == made_nll(
        trainer.made_config, made, trainer.x_train
    )
    trainer.check_arrays(made)
    with pytest.raises(ValueError, match="MADE"):
        trainer.check_arrays(initial_arrays("mlp", CLASSIFIER, seed=0))


def test_switch_sets_clipped_mean_one_weights_and_phase_two_dispatch() -> None:
    trainer = _trainer()
    classifier_arrays = initial_arrays("mlp", CLASSIFIER, seed=0)

    summary = trainer.switch(_made(trainer))

    weights = trainer.sample_weights
    assert trainer.phase == "classifier" and trainer.model == "clf"
    assert weights is not None and weights.shape == (60,)
    assert weights is trainer.classifier.sample_weights
    assert weights.mean() == pytest.approx(1.0)
    assert weights.max() / weights.min() <= 2.0 / 0.5 + 1e-9  # within the clip band
    assert summary["weight_min"] == pytest.approx(weights.min())
    assert summary["weight_max"] == pytest.approx(weights.max())
    assert 0.0 <= summary["weight_at_low"] <= 1.0
    assert 0.0 <= summary["weight_at_high"] <= 1.0
    assert summary["weight_p10"] <= summary["weight_p90"]
    assert 0 < summary["local_made_epochs"] <= 4
    trainer.check_arrays(classifier_arrays)
    with pytest.raises(ValueError):
        trainer.check_arrays(_made(trainer))
    delta = trainer.train_delta(1, classifier_arrays, delta_scale=1.0)
    assert spec_of(delta.delta) == spec_of(classifier_arrays)
    with pytest.raises(RuntimeError):
        trainer.switch(_made(trainer))


def test_a_made_that_does_not_fit_is_refused_before_any_work() -> None:
    trainer = _trainer()
    other = initial_arrays("made", {"input_dim": 16, "hidden_sizes": [9]}, seed=0)

    with pytest.raises(ValueError, match="MADE"):
        trainer.switch(other)
    assert trainer.phase == "made"


def test_switch_without_a_made_and_restored_weights() -> None:
    uniform, restored = _trainer(), _trainer()
    weights = np.linspace(0.5, 1.5, 60)

    uniform.switch(None)
    restored.restore_weights(weights)

    assert uniform.phase == "classifier" and uniform.sample_weights is None
    assert restored.model == "clf"
    np.testing.assert_array_equal(restored.sample_weights, weights)  # type: ignore[arg-type]
    for bad in (np.ones(59), np.full(60, np.nan), -np.ones(60), np.zeros(60)):
        with pytest.raises(ValueError):
            _trainer().restore_weights(bad)


def test_importing_the_trainer_does_not_load_torch() -> None:
    code = (
        "import sys, ursa.edge_sdk.methods.feddisk.trainer; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
