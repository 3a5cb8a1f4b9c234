"""`Trainer` (a protocol), `NoOpTrainer` and the `ModelTrainer` defaults."""

from __future__ import annotations

import numpy as np
import pytest

from tests.edge_sdk.trainers import PlainTrainer
from ursa.edge_sdk.trainer import NoOpTrainer, Trainer


def _selection_round(trainer: Trainer, round_index: int) -> int:
    """What the client does with a selection-only trainer (typed `Trainer`)."""
    return trainer.train(round_index).num_examples


def test_a_noop_trainer_records_its_rounds_and_reports_its_samples() -> None:
    trainer = NoOpTrainer(7)
    assert _selection_round(trainer, 3) == 7
    assert trainer.rounds == [3]


def test_a_noop_trainer_refuses_negative_samples() -> None:
    with pytest.raises(ValueError, match="num_examples"):
        NoOpTrainer(-1)


@pytest.mark.parametrize("trainer", [NoOpTrainer(1), PlainTrainer()])
def test_a_trainer_with_fixed_data_refuses_new_data_by_name(trainer: Trainer) -> None:
    x = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(NotImplementedError, match=type(trainer).__name__):
        trainer.use_data(x, np.zeros(2, dtype=np.int64))


def test_a_model_trainer_is_a_trainer_by_shape_and_trains_through_deltas() -> None:
    trainer = PlainTrainer()
    assert Trainer not in type(trainer).__mro__
    with pytest.raises(RuntimeError, match="train_delta"):
        _selection_round(trainer, 0)
