"""Federated evaluation on the device: the held-out split, the counts, disclosure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from ursa.edge_sdk.fleet_eval import FleetEvaluator, split_for_evaluation
from ursa.edge_sdk.mean_bounds import ImplausibleSumError
from ursa.edge_sdk.method import DeviceContext
from ursa.edge_sdk.trainer import ClassCounts, LocalDelta, ModelTrainer
from ursa.edge_sdk.update_uploads import update_metrics
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    FLEET_EVAL,
    MAX_EVAL_COUNT,
    BaseMessage,
    MeanRequest,
    MeanResult,
    MeanSum,
)
from ursa.protocol.messages.evaluation import eval_totals_problem
from ursa.protocol.router import Router


def test_the_split_is_seeded_disjoint_and_keeps_a_training_sample() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10, dtype=np.int64)
    xt, yt, xe, ye = split_for_evaluation(x, y, 0.3, seed=7)
    assert (len(yt), len(ye)) == (7, 3)
    assert set(yt.tolist()).isdisjoint(ye.tolist())
    assert np.array_equal(xt[:, 0] // 2, yt) and np.array_equal(xe[:, 0] // 2, ye)
    again = split_for_evaluation(x, y, 0.3, seed=7)
    assert np.array_equal(again[3], ye)
    assert len(split_for_evaluation(x, y, 0.0, seed=7)[3]) == 0
    assert len(split_for_evaluation(x[:1], y[:1], 0.9, seed=7)[1]) == 1
    with pytest.raises(ValueError, match="eval_fraction"):
        split_for_evaluation(x, y, 1.0, seed=7)


def test_update_metrics_name_the_loss_and_drop_what_is_not_finite() -> None:
    result = LocalDelta(
        {},
        40,
        {
            "mean_train_loss": 0.25,
            "num_steps": 5.0,
            "bad": float("nan"),
            "Bad Name": 1.0,
        },
    )
    said = dict(update_metrics(result, 1.5))
    assert said == {"samples": 40.0, "train_s": 1.5, "loss": 0.25, "num_steps": 5.0}
    many = LocalDelta({}, 1, {f"m{i}": float(i) for i in range(30)})
    assert len(update_metrics(many, 0.1)) == 16


@dataclass
class _Epoch:
    agent: str
    num_classes: int = 2
    max_parties: int = 8


@dataclass
class _Ctx:
    device_id: str
    epoch: _Epoch
    federation: str = "fed"
    trainer: Any = None
    sent: list[BaseMessage] = field(default_factory=list)

    def send(self, message: BaseMessage) -> None:
        self.sent.append(message)

    def signed(self, message: BaseMessage) -> BaseMessage:
        return message.model_copy(update={"signature": b"s" * 64})


def _evaluator(
    device: str, agent: str, min_parties: int = 2
) -> tuple[FleetEvaluator, _Ctx]:
    ctx = _Ctx(device, _Epoch(agent))
    evaluator = FleetEvaluator(cast(DeviceContext, ctx), min_parties)
    evaluator.register(Router(device))
    return evaluator, ctx


def _request() -> MeanRequest:
    return MeanRequest(
        federation="fed",
        round=3,
        sender="coordinator",
        purpose=FLEET_EVAL,
        epoch=1,
        model="classifier",
        model_version=2,
    )


def _sum(parties: int, round_index: int = 3) -> MeanSum:
    return MeanSum(
        federation="fed",
        round=round_index,
        sender="coordinator",
        purpose=FLEET_EVAL,
        epoch=1,
        model="classifier",
        model_version=2,
        ciphertext=b"c",
        num_parties=parties,
    )


def test_a_device_without_a_split_reports_zeros_without_downloading() -> None:
    evaluator, _ = _evaluator("d0", "d1")
    request = _request()
    values = evaluator.mean_values(request)
    assert values is not None and values.tolist() == [0.0] * 5  # evaluated: 0
    codec = evaluator.mean_codec()
    assert codec.length == 5 and codec.max_parties == 8


def test_only_the_agent_discloses_and_only_a_sum_of_enough_devices_once() -> None:
    totals = np.array([3.0, 1.0, 4.0, 2.0, 3.0])  # 3 devices evaluated
    other, other_ctx = _evaluator("d0", "d1")
    other.on_mean(_sum(3), totals)
    assert other_ctx.sent == [] and other.last is not None
    assert other.last.accuracy == pytest.approx(4 / 6) and other.last.evaluated == 3
    agent, ctx = _evaluator("d1", "d1", min_parties=3)
    agent.on_mean(_sum(2), np.array([3.0, 1.0, 4.0, 2.0, 2.0]))
    assert ctx.sent == []  # too few devices: one device's counts stay hidden
    agent.on_mean(_sum(3), totals)
    agent.on_mean(_sum(3), totals)  # a re-sent sum: answered once
    (answer,) = ctx.sent
    assert isinstance(answer, MeanResult)
    assert answer.values == (3.0, 1.0, 4.0, 2.0, 3.0) and answer.num_parties == 3
    assert answer.signature


def test_zero_reports_of_devices_without_a_split_do_not_make_a_crowd() -> None:
    """Ten reports, one device evaluated: the sum is that device's counts."""
    agent, ctx = _evaluator("d1", "d1", min_parties=2)
    agent.on_mean(_sum(10), np.array([3.0, 1.0, 4.0, 2.0, 1.0]))
    assert ctx.sent == []
    assert agent.last is not None and agent.last.evaluated == 1


@pytest.mark.parametrize(
    ("totals", "parties", "rule"),
    [
        ([3.0, 1.0, 2.0, 2.0, 2.0], 3, "class 0: 3 correct of 2 samples"),
        ([1.0, 1.0, 2.0, 2.0, 4.0], 3, "4 evaluating devices among 3 parties"),
        ([0.0, 0.0, 1.0, 0.0, 2.0], 3, "2 evaluating devices but 1 samples"),
        ([0.0, 0.0, 2.0**21, 0.0, 1.0], 3, "at most 1048576 each"),
        ([0.5, 0.0, 1.0, 0.0, 1.0], 3, "non-negative integers"),
    ],
)
def test_counts_no_honest_fleet_sums_to_are_refused(
    totals: list[float], parties: int, rule: str
) -> None:
    evaluator, _ = _evaluator("d1", "d1")
    with pytest.raises(ImplausibleSumError, match=re.escape(rule)):
        evaluator.check_mean(_sum(parties), np.array(totals))
    assert eval_totals_problem(totals, parties) is not None


def test_the_honest_range_bounds_each_count_and_the_device_count() -> None:
    evaluator, _ = _evaluator("d0", "d1")
    honest = evaluator.mean_codec().honest_range()
    assert honest.low == (0.0,) * 5 and honest.rounding == 0.0
    assert honest.high == (float(MAX_EVAL_COUNT),) * 4 + (1.0,)
    honest.check(np.array([3.0, 0.0, 3.0, 0.0, 3.0]), 3)
    with pytest.raises(ImplausibleSumError, match="slot 4 sums to 4 over 3"):
        honest.check(np.array([3.0, 0.0, 3.0, 0.0, 4.0]), 3)
    evaluator.check_mean(_sum(3), np.array([3.0, 1.0, 4.0, 2.0, 3.0]))  # honest


class _Miscounting(ModelTrainer):
    """Claims more correct predictions than samples in class 0."""

    evaluates = True

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        raise NotImplementedError

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.0

    def class_counts(self, global_arrays: Arrays) -> ClassCounts:
        return ClassCounts(np.array([5, 1]), np.array([3, 2]))


def test_a_device_reports_no_more_correct_than_seen() -> None:
    evaluator, ctx = _evaluator("d0", "d1")
    ctx.trainer = _Miscounting()
    ctx.model_arrays_at = lambda version: {}  # type: ignore[attr-defined]
    request = _request()
    values = evaluator.mean_values(request)
    assert values is not None and values.tolist() == [3.0, 1.0, 3.0, 2.0, 1.0]
