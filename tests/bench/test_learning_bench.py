"""`ursa bench learning`: a tiny paired run through the real coordinator and SDK."""

from __future__ import annotations

import io
import json

import pytest

from ursa.bench.learning import parse_combinations, run, summarise
from ursa.bench.learning_run import Combination, run_figures

pytest.importorskip("torch")

KEYS = {
    "methods",
    "draw",
    "seed",
    "final_accuracy",
    "worst_class_accuracy",
    "rounds_to_0.85",
    "selection_l1_mean",
    "bytes_per_device",
}


def test_a_tiny_run_pairs_its_starts_and_summarises_its_runs() -> None:
    out = io.StringIO()
    code = run(
        combinations=parse_combinations("random;dubhe,climb;dubhe+stratified"),
        seeds=(3,),
        rounds=2,
        devices=6,
        k=3,
        tries=2,
        key_bits=512,
        as_json=True,
        out=out,
        err=io.StringIO(),
    )

    result = json.loads(out.getvalue())
    assert code == 0, result["failed"]
    runs = result["runs"]
    labels = ["random", "dubhe,climb", "dubhe[draw=stratified]"]
    assert [r["methods"] for r in runs] == labels
    for row in runs:
        assert set(row) >= KEYS
        assert row["rounds_completed"] == 2
        assert 0.0 <= row["final_accuracy"] <= 1.0
        assert 0.0 <= row["selection_l1_mean"] <= 2.0
        assert row["bytes_per_device"] > 0
        assert row["handler_errors"] == 0
    # paired starts: the same seed, the same version 0 for every combination
    assert runs[0]["initial_accuracy"] == runs[1]["initial_accuracy"]
    assert runs[2]["initial_accuracy"] == runs[0]["initial_accuracy"]
    assert runs[0]["accuracy_per_round"] != runs[1]["accuracy_per_round"]
    assert [s["methods"] for s in result["summary"]] == labels
    assert [r["draw"] for r in runs] == ["-", "paper", "stratified"]
    assert not result["skipped"]


def _row(label: str, seed: int, accuracy: list[float], l1: float) -> dict[str, object]:
    rounds = [
        {
            "round": r + 1,
            "accuracy": a,
            "worst_class_accuracy": a / 2,
            "selection_l1": l1,
        }
        for r, a in enumerate(accuracy)
    ]
    return run_figures(Combination(tuple(label.split(","))), seed, rounds, None, 100.0)


def test_the_summary_is_mean_and_range_over_seeds_and_counts_never() -> None:
    runs = [
        _row("dubhe", 0, [0.5, 0.9], 0.2),
        _row("dubhe", 1, [0.6, 0.7], 0.4),
        _row("random", 0, [0.86, 0.8], 0.6),
    ]
    assert runs[0]["rounds_to_0.85"] == 2 and runs[1]["rounds_to_0.85"] is None

    summary = summarise(runs)

    dubhe, random = summary
    assert dubhe["seeds"] == [0, 1]
    assert dubhe["final_accuracy"] == {
        "mean": pytest.approx(0.8),
        "min": 0.7,
        "max": 0.9,
        "missing": 0,
    }
    assert dubhe["selection_l1_mean"]["mean"] == pytest.approx(0.3)
    assert dubhe["rounds_to_0.85"] == {
        "mean": 2.0,
        "min": 2.0,
        "max": 2.0,
        "missing": 1,
    }
    assert random["rounds_to_0.85"]["mean"] == 1.0
    assert random["worst_class_accuracy"]["mean"] == pytest.approx(0.4)


def test_combinations_parse_with_the_stratified_draw() -> None:
    parsed = parse_combinations("random; dubhe,climb,flicker ;dubhe+stratified;")

    assert [c.label for c in parsed] == [
        "random",
        "dubhe,climb,flicker",
        "dubhe[draw=stratified]",
    ]
    assert parsed[2].draw == "stratified" and parsed[1].draw == "paper"
    with pytest.raises(ValueError):
        parse_combinations(" ; ")
