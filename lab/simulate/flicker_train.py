"""`ursa simulate flicker --train`: the four methods compared by training on digits.

The paper's count tables are scaled down to digits 0-3 (`scale_table`); each
device holds real images. No correction, local under-sampling, local
over-sampling (the FLICKER paper, §4.2) and FLICKER each change the devices'
training views. FLICKER is the production run: the coordinator's
`FlickerMethod` and the devices' `FlickerParticipant`s over the in-memory
bus (`ursa.lab.simulate.flicker_fleet`), resampling images with
`ursa.edge_sdk.methods.flicker.resampling` and the encrypted global
redundancy test over the wire; an MLP trains by FedAvg on them, and the
accuracy, per-class F1 and the normalised accuracy ``A / max(1, Y/X)``
(the FLICKER paper, eq. 4) are reported over several seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.methods.flicker import algorithm as coord
from ursa.coordinator.methods.flicker.outcome import FlickerPhase
from ursa.coordinator.methods_config import FlickerSpec
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker import resampling as rs
from ursa.lab.simulate.flicker_fleet import build_fleet
from ursa.lab.simulate.flicker_run import (
    SimulationError,
    baseline_report,
    format_counts,
    run_local_baseline,
)
from ursa.lab.simulate.flicker_tables import METHODS, PAPER_RESULTS, get_table

__all__ = [
    "TRAIN_CLASSES",
    "format_train",
    "run_train_comparison",
    "scale_table",
]

IntArray = npt.NDArray[np.int64]

TRAIN_CLASSES = 4  # the tables have four classes: digits 0-3
TEST_PER_CLASS = 30
AUX_PER_CLASS = 10  # auxiliary data for the shared feature extractor (§4.1)


def scale_table(table: Sequence[Sequence[int]], available: Sequence[int]) -> IntArray:
    """Scale a count table so each class total fits ``available`` samples.

    One factor for the whole table (``min(available / totals)``), rounded;
    a non-zero cell stays at least 1, so small cells (and LI) grow.
    """
    counts = np.asarray(table, dtype=np.int64)
    factor = float(np.min(np.asarray(available) / counts.sum(axis=0)))
    while factor > 0:
        scaled = np.where(counts > 0, np.maximum(1, np.rint(counts * factor)), 0)
        if (scaled.sum(axis=0) <= np.asarray(available)).all():
            return scaled.astype(np.int64)
        factor *= 0.99
    raise SimulationError(f"table does not fit {available}")


@dataclass(frozen=True)
class _DigitsSetup:
    scaled: IntArray
    device_x: dict[str, npt.NDArray[np.float32]]
    device_y: dict[str, IntArray]
    x_test: npt.NDArray[np.float32]
    y_test: IntArray
    extractor: rs.CentroidFeatures


def _digits_setup(name: str, seed: int) -> _DigitsSetup:
    from ursa.tools.data.loaders import load_digits

    data = load_digits()
    keep = data.y < TRAIN_CLASSES
    x, y = data.x[keep], data.y[keep]
    rng = np.random.default_rng(seed)
    members = [rng.permutation(np.flatnonzero(y == c)) for c in range(TRAIN_CLASSES)]
    test = np.concatenate([m[:TEST_PER_CLASS] for m in members])
    aux = np.concatenate(
        [m[TEST_PER_CLASS : TEST_PER_CLASS + AUX_PER_CLASS] for m in members]
    )
    pools = [m[TEST_PER_CLASS + AUX_PER_CLASS :] for m in members]
    scaled = scale_table(get_table(name), [len(p) for p in pools])
    device_x, device_y, taken = {}, {}, [0] * TRAIN_CLASSES
    for i, row in enumerate(scaled):
        idx = []
        for c, n in enumerate(row):
            idx.append(pools[c][taken[c] : taken[c] + n])
            taken[c] += int(n)
        picked = np.concatenate(idx)
        device_x[f"dev-{i + 1}"], device_y[f"dev-{i + 1}"] = x[picked], y[picked]
    extractor = rs.CentroidFeatures.fit(x[aux], y[aux], TRAIN_CLASSES)
    return _DigitsSetup(scaled, device_x, device_y, x[test], y[test], extractor)


def _resample(
    method: str, setup: _DigitsSetup, seed: int, settings: Mapping[str, float]
) -> tuple[dict[str, rs.TrainingView], dict[str, Any]]:
    """Apply one method on every device; return the views and a summary."""
    rng = np.random.default_rng(seed)
    resamplers = {
        d: rs.DataResampler(
            rs.TrainingView.of(x, setup.device_y[d], TRAIN_CLASSES),
            setup.extractor,
            rng,
            theta=settings["theta"],
        )
        for d, x in setup.device_x.items()
    }
    counts = {d: tuple(int(c) for c in r.view.counts()) for d, r in resamplers.items()}
    info: dict[str, Any] = {}
    nabla_client = settings["nabla_client"]
    if method in ("under", "over"):
        which = dev.Method.UNDER if method == "under" else dev.Method.OVER
        states = {
            d: run_local_baseline(counts[d], which, r, nabla_client=nabla_client)
            for d, r in resamplers.items()
        }
        info = baseline_report(states)
    elif method == "flicker":
        info = _flicker_on_the_bus(counts, resamplers, seed, settings)
    return {d: r.view for d, r in resamplers.items()}, info


def _flicker_on_the_bus(
    counts: Mapping[str, Sequence[int]],
    resamplers: Mapping[str, rs.DataResampler],
    seed: int,
    settings: Mapping[str, float],
) -> dict[str, Any]:
    """FLICKER by the production objects over the bus, resampling the images.

    The devices' `DataResampler`s run the global redundancy test over the
    wire (CKKS-encrypted candidates sealed device to device).

    Raises:
        SimulationError: the run failed, or the global counts are not the
            sum of the devices' final counts.
    """
    spec = FlickerSpec(nabla=settings["nabla"], nabla_client=settings["nabla_client"])
    with build_fleet(counts, resamplers=resamplers, spec=spec, seed=seed) as fleet:
        outcome = fleet.run()
        final = {d: p.state for d, p in fleet.participants.items()}
    state = outcome.state
    if outcome.phase is not FlickerPhase.DONE or state is None:
        raise SimulationError(f"the FLICKER run failed: {outcome.failure}")
    total = np.sum([s.counts for s in final.values()], axis=0)
    if state.global_counts != tuple(int(c) for c in total):
        raise SimulationError("the global counts are not the devices' sum")
    return {
        **outcome.to_dict(),
        "gi_before": None
        if outcome.gd_before is None
        else coord.global_imbalance(outcome.gd_before),
        "gi_after": state.gi,
        "reached_nabla": state.gi >= state.nabla,
        "all_saturated": all(s.saturated for s in final.values()),
        "devices": [{"device": d, **s.to_dict()} for d, s in final.items()],
        "redundancy_tests": sum("redundancy" in e for e in outcome.log),
    }


def _train_and_score(
    views: Mapping[str, rs.TrainingView], setup: _DigitsSetup, seed: int, rounds: int
) -> dict[str, Any]:
    """FedAvg over the devices' views; accuracy and per-class F1 on the test set."""
    from ursa.edge_sdk.training import TrainConfig, evaluate, train_local
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import accumulate_scaled, add_scaled, zeros_like

    cfg = {"input_dim": 64, "num_classes": TRAIN_CLASSES}
    arrays = initial_arrays("mlp", cfg, seed=seed)
    data = {d: v.materialise() for d, v in views.items()}
    for r in range(rounds):
        acc = zeros_like(arrays, dtype=np.float64)
        total = 0
        for i, (x, y) in enumerate(data.values()):
            conf = TrainConfig(
                epochs=2, batch_size=16, lr=0.05, seed=seed * 100_000 + r * 100 + i
            )
            res = train_local("mlp", cfg, arrays, x.reshape(len(x), -1), y, config=conf)
            accumulate_scaled(acc, res.delta, res.num_examples)
            total += res.num_examples
        arrays = add_scaled(arrays, acc, 1.0 / total)
    x_test = setup.x_test.reshape(len(setup.x_test), -1)
    ev = evaluate("mlp", cfg, arrays, x_test, setup.y_test)
    true = np.asarray(ev.per_class_count, dtype=np.float64)
    tp = np.asarray(ev.per_class_accuracy) * true
    # predicted counts: the share of test samples the model labels c
    predicted = np.array(
        [
            evaluate("mlp", cfg, arrays, x_test, np.full(len(x_test), c)).accuracy
            for c in range(TRAIN_CLASSES)
        ]
    ) * len(x_test)
    f1 = 2 * tp / (predicted + true)
    return {"accuracy": ev.accuracy, "f1": [float(v) for v in f1]}


def run_train_comparison(
    name: str,
    *,
    seeds: int = 3,
    rounds: int = 20,
    nabla: float = coord.DEFAULT_NABLA,
    nabla_client: float = dev.DEFAULT_NABLA_CLIENT,
    theta: float = dev.DEFAULT_THETA,
) -> dict[str, Any]:
    """No correction, local under-/over-sampling and FLICKER, trained on digits.

    The table is scaled down to digits 0-3 (`scale_table`); each method's
    resampled devices train an MLP by FedAvg for ``rounds`` rounds. Reports,
    per method, mean and std over ``seeds`` of the accuracy, per-class F1 and
    the normalised accuracy ``A / max(1, Y/X)`` (the FLICKER paper, eq. 4).
    """
    settings = {"nabla": nabla, "nabla_client": nabla_client, "theta": theta}
    per_method: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
    scaled: list[list[int]] = []  # the same for every seed (pool sizes are fixed)
    for seed in range(seeds):
        setup = _digits_setup(name, seed)
        scaled = setup.scaled.tolist()
        x_total = int(setup.scaled.sum())
        for method in METHODS:
            views, info = _resample(method, setup, seed, settings)
            y_total = sum(len(v.kept) + len(v.extra_y) for v in views.values())
            score = _train_and_score(views, setup, seed, rounds)
            score["normalised_accuracy"] = score["accuracy"] / max(
                1.0, y_total / x_total
            )
            score.update(x=x_total, y=y_total, resampling=info)
            per_method[method].append(score)
    summary = {}
    for method, runs in per_method.items():
        acc = [r["accuracy"] for r in runs]
        norm = [r["normalised_accuracy"] for r in runs]
        f1 = np.array([r["f1"] for r in runs])
        summary[method] = {
            "accuracy_mean": float(np.mean(acc)),
            "accuracy_std": float(np.std(acc)),
            "normalised_accuracy_mean": float(np.mean(norm)),
            "normalised_accuracy_std": float(np.std(norm)),
            "f1_mean": f1.mean(axis=0).tolist(),
            "y_over_x_mean": float(np.mean([r["y"] / r["x"] for r in runs])),
            "runs": runs,
        }
    return {
        "table": name.upper(),
        "scaled_table": scaled,
        "scaled_class_totals": np.sum(scaled, axis=0).tolist(),
        "seeds": seeds,
        "rounds": rounds,
        "model": "mlp",
        "methods": summary,
    }


def format_train(result: Mapping[str, Any]) -> str:
    """Render `run_train_comparison`'s result as text."""
    paper = PAPER_RESULTS[result["table"]]
    lines = [
        f"Training on digits 0-3, table {result['table']} scaled to "
        f"{format_counts(result['scaled_class_totals'])} per "
        f"class; MLP, FedAvg {result['rounds']} rounds, {result['seeds']} seeds",
        f"{'method':<9}{'accuracy':>16}{'normalised':>16}{'Y/X':>7}  "
        f"{'F1 per class':<26}paper acc / F1",
    ]
    for method, s in result["methods"].items():
        acc = f"{s['accuracy_mean']:.3f}±{s['accuracy_std']:.3f}"
        norm = f"{s['normalised_accuracy_mean']:.3f}±{s['normalised_accuracy_std']:.3f}"
        f1 = " ".join(f"{v:.2f}" for v in s["f1_mean"])
        ref = f"{paper[method].accuracy}% / {' '.join(map(str, paper[method].f1))}"
        lines.append(
            f"{method:<9}{acc:>16}{norm:>16}{s['y_over_x_mean']:>7.2f}  {f1:<26}{ref}"
        )
    return "\n".join(lines)
