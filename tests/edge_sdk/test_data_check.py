"""The data check: a device's data facts against the federation's, as problems."""

from __future__ import annotations

import numpy as np

from ursa.edge_sdk.data_check import (
    MAX_REASON_CHARS,
    DataFacts,
    DataProblem,
    FederationFacts,
    data_problems,
    reason_of,
)


def test_data_that_fits_has_no_problems() -> None:
    data = DataFacts.of(np.array([0, 1, 2, 9, 9]), features=64)
    federation = FederationFacts(num_classes=10, model_features=64)

    assert data_problems(data, federation) == []


def test_facts_of_a_label_vector() -> None:
    facts = DataFacts.of(np.array([3, 1, 3, 0]), features=8)

    assert facts == DataFacts(frozenset({0, 1, 3}), 4, 8)


def test_labels_outside_the_classes_are_named_with_a_remedy() -> None:
    data = DataFacts.of(np.array([0, 4, 5, 7, 5]))

    (problem,) = data_problems(data, FederationFacts(num_classes=5))

    assert problem.what == "labels 5, 7 lie outside the federation's 5 classes 0..4"
    assert problem.remedy == (
        "relabel the data to 0..4 or join a federation with num_classes >= 8"
    )


def test_many_outside_labels_are_shortened() -> None:
    data = DataFacts.of(np.arange(12))

    (problem,) = data_problems(data, FederationFacts(num_classes=2))

    assert problem.what.startswith("labels 2, 3, 4, 5, 6 (+5 more) lie outside")


def test_a_feature_count_the_model_does_not_take_is_named() -> None:
    data = DataFacts.of(np.array([0, 1]), features=32)
    federation = FederationFacts(num_classes=10, model_features=64, model="mlp v0")

    (problem,) = data_problems(data, federation)

    assert problem.what == "samples have 32 features; the federation's mlp v0 takes 64"
    assert "64 features per sample" in problem.remedy


def test_no_samples_is_a_problem() -> None:
    (problem,) = data_problems(DataFacts.of(np.array([], np.int64)), FederationFacts())

    assert problem.what == "the device has no labelled samples"


def test_unknown_facts_are_not_compared() -> None:
    selection_only = DataFacts.of(np.array([0, 1, 2]))  # no features known
    nothing_signed = FederationFacts()

    assert data_problems(selection_only, FederationFacts(model_features=64)) == []
    assert data_problems(DataFacts.of(np.array([99]), 3), nothing_signed) == []


def test_both_problems_at_once() -> None:
    data = DataFacts.of(np.array([0, 12]), features=3)

    problems = data_problems(data, FederationFacts(num_classes=10, model_features=4))

    assert [p.what.split()[0] for p in problems] == ["labels", "samples"]


def test_the_reason_joins_what_is_wrong_within_the_wire_limit() -> None:
    short = [DataProblem("a", "x"), DataProblem("b", "y")]
    long = [DataProblem("w" * 200, "x"), DataProblem("v" * 200, "y")]

    assert reason_of(short) == "a; b"
    assert len(reason_of(long)) == MAX_REASON_CHARS
    assert reason_of(long).endswith("...")
    assert str(short[0]) == "a (remedy: x)"
