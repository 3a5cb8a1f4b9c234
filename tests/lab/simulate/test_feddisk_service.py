"""FedDisk's production engine: the coordinator's FeddiskPlugin and EdgeClients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ursa.edge_sdk.training import TrainConfig
from ursa.lab.simulate.feddisk import MadePhaseSettings
from ursa.lab.simulate.methods import RunSettings, run_method
from ursa.tools.data.federation import PartitionSpec, build_federation
from ursa.tools.data.loaders import load_digits

MAX_MADE = 8
SETTINGS = RunSettings(
    rounds=8, participants=6, hidden_sizes=(32,), key_bits=512,
    train=TrainConfig(epochs=2, batch_size=8, lr=0.1),
    feddisk=MadePhaseSettings(
        made_hidden=16, made_lr=0.05, made_epochs_per_round=3,
        max_made_rounds=MAX_MADE, local_made_max_epochs=10,
        classifier_epochs=3, classifier_hidden=8,
    ),
)  # fmt: skip
ACCURACY_TOLERANCE = 0.05
"""Mean accuracy of the last 3 rounds, production vs reference (measured: 0.019).

The engines draw their validation splits, local MADE seeds and participants
from different streams and train the classifier in torch vs numpy, so they
agree within noise, not to the digit."""


@pytest.fixture(scope="module")
def fed():  # type: ignore[no-untyped-def]
    spec = PartitionSpec(kind="noise", num_devices=6, noise_variance=0.3)
    return build_federation(load_digits(), spec, np.random.default_rng(0))


def test_the_production_engine_runs_feddisk_as_the_reference_does(fed) -> None:  # type: ignore[no-untyped-def]
    reference = run_method(fed, "feddisk", SETTINGS, seed=0)
    production = run_method(
        fed, "feddisk", dataclasses.replace(SETTINGS, engine="production"), seed=0
    )

    summary = production.diagnostics["feddisk"]
    assert summary["engine"] == "production" and summary["handler_errors"] == 0
    # the agent's verdict ended phase 1 before the coordinator's cap
    assert 1 <= production.extra_rounds < MAX_MADE
    assert summary["made_rounds"] == production.extra_rounds
    assert summary["switch_round"] == production.extra_rounds + 1
    assert 1 <= summary["best_made_round"] <= production.extra_rounds
    # every device's classifier trains with its own non-uniform sample weights
    assert summary["weighted_devices"] == 6
    weights = summary["weights"]
    assert 0 < weights["min"] < weights["p10"] < 1 < weights["p90"] < weights["max"]
    assert len(production.accuracy) == SETTINGS.rounds
    assert production.diagnostics["selection"]["engine"] == "production"
    assert 1 <= reference.extra_rounds < MAX_MADE
    final = np.mean(production.accuracy[-3:])
    assert final > 0.7
    assert final == pytest.approx(
        np.mean(reference.accuracy[-3:]), abs=ACCURACY_TOLERANCE
    )


def test_the_production_engine_refuses_what_it_cannot_run(fed) -> None:  # type: ignore[no-untyped-def]
    production = dataclasses.replace(SETTINGS, engine="production")
    with pytest.raises(ValueError, match="random"):
        run_method(
            fed, "feddisk", dataclasses.replace(production, selection="dubhe"), seed=0
        )
    fedvc = TrainConfig(epochs=1, batch_size=4, lr=0.1, fedvc_samples=8)
    with pytest.raises(ValueError, match="FedVC"):
        run_method(fed, "feddisk", dataclasses.replace(production, train=fedvc), seed=0)
