"""The figures `ursa simulate train` reports, from one run's curves to seed means.

* ``final_accuracy``: mean test accuracy of the last 10 rounds;
* ``worst_class_accuracy``: the lowest per-class accuracy, each class's
  accuracy averaged over the last 10 rounds; ``worst_minority_accuracy`` the
  same over the partition's minority classes;
* ``rounds_to_target``: the first round whose test accuracy reaches the target
  (None if never), and ``communication_rounds_to_target`` with FedDisk's MADE
  rounds added (the paper's effective communication rounds);
* `feddisk_vs_fedavg`: FedAvg's best accuracy on the trailing ``window``-round
  mean (to not chase one lucky round) and the effective rounds FedDisk needs
  to reach it (FedDisk §VI-C.2);
* `climb_targets`: the issue's check against FedAvg, beside the CLIMB paper's
  MNIST rows (`PAPER_CLIMB_MNIST`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ursa.lab.simulate.methods import FINAL_WINDOW, RunResult

PAPER_CLIMB_MNIST = {
    "table1_N500_K100_rho10_3minority_alpha0.1": {
        "fedavg": {"worst_minority": 0.6045, "overall": 0.8906},
        "climb": {"worst_minority": 0.8084, "overall": 0.9356},
        "focal": {"worst_minority": 0.4690, "overall": 0.8670},
    },
    "table2_N100_full_rho10_3minority_alpha0.1": {
        "fedavg": {"worst_minority": 0.7263, "overall": 0.9189},
        "climb": {"worst_minority": 0.8828, "overall": 0.9522},
        "focal": {"worst_minority": 0.6674, "overall": 0.9069},
    },
}
CLIMB_TARGET_GAIN = 0.10
CLIMB_MAX_OVERALL_DROP = 0.01


def summarise_run(
    result: RunResult, minority: Sequence[int], target: float, curves: bool
) -> dict[str, Any]:
    """The per-seed figures of one run (see the module docstring)."""
    acc = np.asarray(result.accuracy)
    per_class = np.asarray(result.per_class_final)
    reached = np.flatnonzero(acc >= target)
    to_target = int(reached[0]) + 1 if reached.size else None
    worst = int(np.nanargmin(per_class))
    out: dict[str, Any] = {
        "seed": result.seed,
        "final_accuracy": float(acc[-FINAL_WINDOW:].mean()),
        "worst_class": worst,
        "worst_class_accuracy": float(per_class[worst]),
        "per_class_accuracy": [round(float(v), 4) for v in per_class],
        "rounds_to_target": to_target,
        "extra_rounds": result.extra_rounds,
        "communication_rounds_to_target": (
            None if to_target is None else to_target + result.extra_rounds
        ),
        "elapsed_s": round(result.elapsed_s, 2),
        "diagnostics": result.diagnostics,
    }
    if minority:
        out["worst_minority_accuracy"] = float(np.nanmin(per_class[list(minority)]))
    if curves:
        out["accuracy_curve"] = [round(float(v), 4) for v in acc]
    return out


def average_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std over seeds of each figure; rounds over the seeds that got there."""
    out: dict[str, Any] = {}
    for key in ("final_accuracy", "worst_class_accuracy", "worst_minority_accuracy"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[key] = float(np.mean(values))
            out[f"{key}_std"] = float(np.std(values))
    for key in ("rounds_to_target", "communication_rounds_to_target"):
        got = [r[key] for r in runs if r[key] is not None]
        out[key] = float(np.mean(got)) if got else None
        out[f"{key}_seeds_reached"] = len(got)
    return out


def smoothed(curve: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average (the first rounds average what exists)."""
    acc = np.asarray(curve, dtype=np.float64)
    width = max(1, window)
    return np.array(
        [acc[max(0, i - width + 1) : i + 1].mean() for i in range(acc.size)]
    )


def feddisk_vs_fedavg(
    fedavg: RunResult, feddisk: RunResult, window: int
) -> dict[str, Any]:
    """FedAvg's best (smoothed) accuracy and the rounds each needs to reach it."""
    base = smoothed(fedavg.accuracy, window)
    mine = smoothed(feddisk.accuracy, window)
    best = float(base.max())
    hit = np.flatnonzero(mine >= best)
    return {
        "seed": fedavg.seed,
        "fedavg_best_accuracy": best,
        "fedavg_rounds_to_best": int(base.argmax()) + 1,
        "feddisk_best_accuracy": float(mine.max()),
        "feddisk_made_rounds": feddisk.extra_rounds,
        "feddisk_classifier_rounds_to_fedavg_best": int(hit[0]) + 1
        if hit.size
        else None,
        "feddisk_effective_rounds_to_fedavg_best": (
            int(hit[0]) + 1 + feddisk.extra_rounds if hit.size else None
        ),
    }


def climb_targets(methods: dict[str, Any]) -> dict[str, Any] | None:
    """The issue's check: worst minority >= FedAvg's + 0.10, overall within 1 point."""
    if "climb" not in methods or "fedavg" not in methods:
        return None
    climb, base = methods["climb"]["mean"], methods["fedavg"]["mean"]
    if "worst_minority_accuracy" not in climb:
        return None
    gain = climb["worst_minority_accuracy"] - base["worst_minority_accuracy"]
    drop = base["final_accuracy"] - climb["final_accuracy"]
    return {
        "worst_minority_gain": gain,
        "overall_drop": drop,
        "met": bool(gain >= CLIMB_TARGET_GAIN and drop <= CLIMB_MAX_OVERALL_DROP),
    }


def format_report(report: dict[str, Any]) -> str:
    """A plain-text table of the seed-averaged figures."""
    lines = [
        f"{'variant':<22}{'final acc':>10}{'worst cls':>10}{'worst min':>10}"
        f"{'->target':>10}{'comm rnds':>10}"
    ]
    for name, entry in report["methods"].items():
        m = entry["mean"]
        lines.append(
            f"{name:<22}{_fmt(m.get('final_accuracy')):>10}"
            f"{_fmt(m.get('worst_class_accuracy')):>10}"
            f"{_fmt(m.get('worst_minority_accuracy')):>10}"
            f"{_fmt(m.get('rounds_to_target'), 1):>10}"
            f"{_fmt(m.get('communication_rounds_to_target'), 1):>10}"
        )
    for name, comp in report.get("comparisons", {}).items():
        lines.append(f"{name}: {json.dumps(comp['mean'])}")
    if "climb_targets" in report:
        lines.append(f"climb targets: {json.dumps(report['climb_targets'])}")
    lines.append(f"elapsed {report['elapsed_s']} s")
    return "\n".join(lines)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
