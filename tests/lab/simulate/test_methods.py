from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.training import TrainConfig, evaluate_loss
from ursa.lab.simulate.feddisk import MadePhaseSettings
from ursa.lab.simulate.methods import RunSettings, device_losses, run_method
from ursa.models.registry import initial_arrays
from ursa.tools.data.federation import PartitionSpec, build_federation
from ursa.tools.data.loaders import load_digits

TRAIN = TrainConfig(epochs=1, batch_size=4, lr=0.1)


@pytest.fixture(scope="module")
def fed():  # type: ignore[no-untyped-def]
    spec = PartitionSpec(kind="climb", num_devices=12, rho=5, alpha=0.1, num_minority=2)
    return build_federation(load_digits(), spec, np.random.default_rng(0))


def test_runs_are_seeded_and_shaped(fed) -> None:  # type: ignore[no-untyped-def]
    settings = RunSettings(rounds=3, participants=6, train=TRAIN, hidden_sizes=(16,))
    a = run_method(fed, "fedavg", settings, seed=1)
    b = run_method(fed, "fedavg", settings, seed=1)
    c = run_method(fed, "fedavg", settings, seed=2)

    assert len(a.accuracy) == 3 and len(a.per_class_final) == 10
    assert a.accuracy == b.accuracy
    assert a.accuracy != c.accuracy
    assert a.diagnostics["selection"]["kind"] == "random"


def test_vectorised_and_sequential_trainers_agree(fed) -> None:  # type: ignore[no-untyped-def]
    settings = RunSettings(rounds=2, participants=5, train=TRAIN, hidden_sizes=(16,))
    fast = run_method(fed, "focal", settings, seed=0)
    slow = run_method(
        fed, "focal", dataclasses.replace(settings, trainer="sequential"), seed=0
    )
    np.testing.assert_allclose(fast.accuracy, slow.accuracy, atol=1e-9)


def test_climb_encrypted_duals_give_the_plaintext_run(fed) -> None:  # type: ignore[no-untyped-def]
    settings = RunSettings(rounds=3, participants=12, train=TRAIN, hidden_sizes=(16,))
    plain = run_method(fed, "climb", settings, seed=0)
    enc = run_method(
        fed, "climb", dataclasses.replace(settings, climb_encrypted=True, key_bits=512),
        seed=0,
    )  # fmt: skip

    assert plain.diagnostics["climb"]["dual_steps"] == 3
    assert enc.diagnostics["climb"]["encrypted"]
    assert plain.diagnostics["climb"]["final_lambda"]["max"] > 0
    assert enc.diagnostics["climb"]["final_lambda"]["max"] == pytest.approx(
        plain.diagnostics["climb"]["final_lambda"]["max"], abs=1e-6
    )
    np.testing.assert_allclose(enc.accuracy, plain.accuracy, atol=1e-9)


@pytest.fixture(scope="module")
def fed8():  # type: ignore[no-untyped-def]
    spec = PartitionSpec(kind="climb", num_devices=8, rho=5, alpha=0.1, num_minority=2)
    return build_federation(load_digits(), spec, np.random.default_rng(0))


def test_the_production_dual_steps_give_the_reference_run(fed8) -> None:  # type: ignore[no-untyped-def]
    settings = RunSettings(
        rounds=6, participants=4, train=TRAIN, hidden_sizes=(16,), dual_period=2,
        climb=ClimbConfig(eta_d=0.5), key_bits=512,
    )  # fmt: skip
    plain = run_method(fed8, "climb", settings, seed=0)
    encrypted = run_method(
        fed8, "climb", dataclasses.replace(settings, climb_encrypted=True), seed=0
    )
    production = run_method(
        fed8, "climb", dataclasses.replace(settings, engine="production"), seed=0
    )

    climb = production.diagnostics["climb"]
    assert climb["engine"] == "production" and climb["dual_steps"] == 3
    assert len(set(production.climb_weights)) > 1  # the duals moved the weights
    np.testing.assert_allclose(
        production.climb_weights, encrypted.climb_weights, atol=1e-9
    )
    np.testing.assert_allclose(production.climb_weights, plain.climb_weights, atol=1e-6)
    np.testing.assert_allclose(production.accuracy, encrypted.accuracy, atol=1e-9)
    assert climb["final_lambda"] == pytest.approx(  # f_i in float32, per device
        encrypted.diagnostics["climb"]["final_lambda"], abs=1e-7
    )


def test_device_losses_equal_evaluate_loss(fed) -> None:  # type: ignore[no-untyped-def]
    config = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}
    arrays = initial_arrays("mlp", config, seed=0)
    losses = device_losses(arrays, fed.devices[:4])
    for dev, loss in zip(fed.devices[:4], losses, strict=True):
        assert loss == pytest.approx(
            evaluate_loss("mlp", config, arrays, dev.x, dev.y), rel=1e-5
        )


def test_feddisk_counts_its_made_rounds() -> None:
    spec = PartitionSpec(kind="noise", num_devices=6, noise_variance=0.3)
    fed = build_federation(load_digits(), spec, np.random.default_rng(0))
    settings = RunSettings(
        rounds=2, participants=6, train=TRAIN, hidden_sizes=(16,),
        feddisk=MadePhaseSettings(
            made_hidden=16, max_made_rounds=3, local_made_max_epochs=10,
            classifier_epochs=3, classifier_hidden=8,
        ),
    )  # fmt: skip

    run = run_method(fed, "feddisk", settings, seed=0)

    summary = run.diagnostics["feddisk"]
    assert 1 <= run.extra_rounds <= 3
    assert run.extra_rounds == len(summary["validation_nll"])
    assert summary["weights"]["min"] > 0
    assert 0.0 <= summary["weights"]["at_low"] <= 1.0
    assert summary["weights"]["p10"] <= summary["weights"]["p90"]
    assert len(run.accuracy) == 2


def test_bad_settings_raise(fed) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="method"):
        run_method(fed, "fedprox", RunSettings(rounds=1), seed=0)
    with pytest.raises(ValueError, match="engine"):
        run_method(fed, "climb", RunSettings(rounds=1, engine="service"), seed=0)
    with pytest.raises(ValueError, match="K"):
        run_method(fed, "fedavg", RunSettings(rounds=1, participants=99), seed=0)
