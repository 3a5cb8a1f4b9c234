from __future__ import annotations

import numpy as np
import pytest

from ursa.lab.simulate.methods import RunResult
from ursa.lab.simulate.report import (
    average_runs,
    climb_targets,
    feddisk_vs_fedavg,
    format_report,
    smoothed,
    summarise_run,
)


def _run(curve: list[float], per_class: list[float], extra: int = 0) -> RunResult:
    return RunResult("m", 0, curve, per_class, extra, {}, 1.0)


def test_summary_of_one_run() -> None:
    curve = [0.1] * 5 + [0.5, 0.6, 0.7, 0.8, 0.9] + [0.8] * 10
    per_class = [0.9, 0.2, 0.5, 1.0]

    out = summarise_run(
        _run(curve, per_class, extra=7), [1, 2], target=0.75, curves=True
    )

    assert out["final_accuracy"] == pytest.approx(0.8)
    assert (out["worst_class"], out["worst_class_accuracy"]) == (1, 0.2)
    assert out["worst_minority_accuracy"] == 0.2
    assert out["rounds_to_target"] == 9
    assert out["communication_rounds_to_target"] == 16
    assert len(out["accuracy_curve"]) == 20


def test_average_over_seeds_counts_who_reached_the_target() -> None:
    runs = [
        {"final_accuracy": 0.8, "worst_class_accuracy": 0.4, "rounds_to_target": 10,
         "communication_rounds_to_target": 12},
        {"final_accuracy": 0.9, "worst_class_accuracy": 0.6, "rounds_to_target": None,
         "communication_rounds_to_target": None},
    ]  # fmt: skip
    out = average_runs(runs)
    assert out["final_accuracy"] == pytest.approx(0.85)
    assert out["rounds_to_target"] == 10 and out["rounds_to_target_seeds_reached"] == 1


def test_smoothing_is_a_trailing_mean() -> None:
    np.testing.assert_allclose(smoothed([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])


def test_feddisk_effective_rounds_include_made_rounds() -> None:
    fedavg = _run([0.5, 0.6, 0.7, 0.7, 0.65], [1.0])
    feddisk = _run([0.6, 0.7, 0.75, 0.8, 0.8], [1.0], extra=10)

    out = feddisk_vs_fedavg(fedavg, feddisk, window=1)

    assert out["fedavg_best_accuracy"] == 0.7 and out["fedavg_rounds_to_best"] == 3
    assert out["feddisk_classifier_rounds_to_fedavg_best"] == 2
    assert out["feddisk_effective_rounds_to_fedavg_best"] == 12


def test_climb_targets_check() -> None:
    methods = {
        "fedavg": {"mean": {"worst_minority_accuracy": 0.5, "final_accuracy": 0.90}},
        "climb": {"mean": {"worst_minority_accuracy": 0.65, "final_accuracy": 0.895}},
    }
    out = climb_targets(methods)
    assert out is not None and out["met"]
    methods["climb"]["mean"]["final_accuracy"] = 0.88
    assert not climb_targets(methods)["met"]  # type: ignore[index]
    assert climb_targets({"fedavg": methods["fedavg"]}) is None


def test_text_report_lists_every_variant() -> None:
    report = {
        "methods": {
            "fedavg": {"mean": {"final_accuracy": 0.9, "rounds_to_target": None}},
            "climb": {"mean": {"final_accuracy": 0.95, "worst_minority_accuracy": 0.8}},
        },
        "climb_targets": {"met": True},
        "elapsed_s": 1.0,
    }
    text = format_report(report)
    assert "fedavg" in text and "0.9500" in text and "0.8000" in text
    assert "climb targets" in text
