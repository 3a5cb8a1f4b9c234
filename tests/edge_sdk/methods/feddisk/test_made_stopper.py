from __future__ import annotations

import math

import pytest

from ursa.edge_sdk.methods.feddisk.made_stopper import (
    MadeStopError,
    MadeStopper,
    apply_validation_loss,
    weighted_mean_loss,
)


def _feed(stopper: MadeStopper, losses: list[float]) -> MadeStopper:
    for loss in losses:
        stopper = apply_validation_loss(stopper, loss)
    return stopper


def test_stops_at_the_first_rise_and_keeps_the_round_before() -> None:
    stopper = _feed(MadeStopper(), [5.0, 4.0, 3.5])
    assert stopper.improved and not stopper.stopped

    stopper = apply_validation_loss(stopper, 3.6)

    assert stopper.stopped and not stopper.improved
    assert (stopper.rounds, stopper.best_round, stopper.best_loss) == (4, 3, 3.5)
    with pytest.raises(MadeStopError):
        apply_validation_loss(stopper, 3.0)


def test_patience_tolerates_a_rise_and_max_rounds_caps() -> None:
    stopper = _feed(MadeStopper(patience=2), [5.0, 5.1, 4.0, 4.2])
    assert not stopper.stopped and stopper.best_round == 3
    assert _feed(MadeStopper(max_rounds=2), [5.0, 4.0]).stopped


def test_bad_inputs_raise() -> None:
    with pytest.raises(MadeStopError):
        apply_validation_loss(MadeStopper(), math.nan)
    with pytest.raises(MadeStopError):
        MadeStopper(patience=0)
    with pytest.raises(MadeStopError):
        weighted_mean_loss([1.0], [0])
    with pytest.raises(MadeStopError):
        weighted_mean_loss([1.0, 2.0], [1])


def test_fleet_loss_is_sample_weighted() -> None:
    assert weighted_mean_loss([1.0, 4.0], [3, 1]) == pytest.approx(1.75)
