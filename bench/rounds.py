"""`ursa bench rounds`: what a round costs beyond training, per method (demo's job).

The demo's job (`ursa demo`: 20 device processes, K = 8, the same MLP and
digits data, 25 rounds; secure aggregation on) runs once per method
combination: ``random`` + plain FedAvg (the reference), ``dubhe`` (+ FedAvg)
and ``dubhe,climb``. Per combination it reports

* the median per-round **non-training time**: the round's wall time (the
  coordinator's, from the selection's start to the round's completion)
  minus the slowest selected device's local training in that round (each
  device's `RoundTrained` events); what selection, masking, transfer and
  aggregation add to the training itself;
* bytes each device received and sent per round (its MQTT link's payload
  counts over the whole run, enrolment, key epoch and the final model
  included, over the rounds): since protocol 10 a round's model goes only
  to its selected devices (to all when every device evaluates it), so
  received bytes follow K/N of the model, not the whole model;
* the device processes' peak RSS (the largest).

Budget: Dubhe's median non-training time at most `NON_TRAINING_RATIO_BUDGET`
times random's (the command exits 1 when it is missed).
"""

from __future__ import annotations

import io
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ursa.bench.common import Budget, report

__all__ = [
    "COMBINATIONS",
    "NON_TRAINING_RATIO_BUDGET",
    "non_training_s",
    "run",
    "run_figures",
]

COMBINATIONS = ("random,fedavg", "dubhe,fedavg", "dubhe,climb")
"""The reference first (`random` + plain FedAvg), then Dubhe without and with CLIMB."""
LABELS = {
    "random,fedavg": "random",
    "dubhe,fedavg": "dubhe",
    "dubhe,climb": "dubhe_climb",
}
"""Each combination's key prefix in the figures."""
NON_TRAINING_RATIO_BUDGET = 2.0
"""Dubhe's median non-training time over random's, at most."""


def non_training_s(
    rounds: Sequence[Mapping[str, Any]], devices: Sequence[Mapping[str, Any]]
) -> list[float]:
    """Each round's wall time minus its slowest selected device's training time.

    ``rounds`` and ``devices`` are the demo report's sections; a round
    without a wall time is left out.
    """
    trained: dict[tuple[str, int], float] = {}
    for device in devices:
        for round_index, seconds in device.get("round_train_s", ()):
            trained[(str(device["device_id"]), int(round_index))] = float(seconds)
    out = []
    for entry in rounds:
        wall = entry.get("wall_s")
        if wall is None:
            continue
        index = int(entry["round"])
        slowest = max(
            (trained.get((str(d), index), 0.0) for d in entry["selected"]),
            default=0.0,
        )
        out.append(float(wall) - slowest)
    return out


def run_figures(report: Mapping[str, Any], label: str) -> dict[str, float | int]:
    """One combination's figures out of its demo report, keys prefixed by ``label``."""
    rounds = report["rounds"]
    devices = report["devices"]
    done = max(1, len(rounds))
    extra = non_training_s(rounds, devices)
    walls = [float(r["wall_s"]) for r in rounds if r.get("wall_s") is not None]
    peaks = [int(d["peak_rss_bytes"] or 0) for d in devices]
    count = max(1, len(devices))
    received = sum(int(d["bytes_received"]) for d in devices) / count / done
    sent = sum(int(d["bytes_sent"]) for d in devices) / count / done
    return {
        f"{label}_rounds": len(rounds),
        f"{label}_round_wall_s_median": statistics.median(walls) if walls else -1.0,
        f"{label}_non_training_s_median": statistics.median(extra) if extra else -1.0,
        f"{label}_received_kib_per_device_round": received / 1024,
        f"{label}_sent_kib_per_device_round": sent / 1024,
        f"{label}_device_peak_rss_mib": max(peaks, default=0) / 2**20,
        f"{label}_final_accuracy": float(report.get("final_accuracy") or 0.0),
        f"{label}_wall_s": float(report["wall_s"]),
    }


def run(
    *,
    rounds: int = 25,
    devices: int = 20,
    k: int = 8,
    tries: int = 5,
    key_bits: int = 2048,
    local_epochs: int = 5,
    seed: int = 0,
    eval_every: int | None = None,
    combinations: Sequence[str] = COMBINATIONS,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the demo's job once per combination; print the figures; 1 on a miss.

    The defaults are the demo's (``eval_every`` None: its federated
    evaluation every 5 rounds; 0 turns it off, as Flower's job had none); the
    small settings are for a smoke test.
    """
    from ursa.tools.demo.settings import TrainingDemoSettings, methods_options
    from ursa.tools.demo.training import run_training_demo

    err = err if err is not None else sys.stderr
    base = TrainingDemoSettings(
        devices=devices,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        local_epochs=local_epochs,
        seed=seed,
    )
    if eval_every is not None:
        base = replace(base, eval_every=eval_every)
    figures: dict[str, Any] = {
        "devices": devices,
        "k": k,
        "rounds": rounds,
        "key_bits": key_bits,
        "eval_every": base.eval_every,
    }
    completed = True
    with tempfile.TemporaryDirectory(prefix="ursa-bench-rounds-") as tmp:
        for methods in combinations:
            label = LABELS.get(methods, methods.replace(",", "_"))
            err.write(f"ursa bench rounds: {methods}\n")
            chosen = methods_options(methods)
            settings = replace(
                base,
                selection=chosen["selection"],
                weighting=chosen["weighting"],
                balance=chosen["balance"],
                report_dir=Path(tmp) / label,
            )
            result = run_training_demo(settings, out=io.StringIO(), err=err)
            completed = completed and bool(result["completed"])
            figures |= run_figures(result, label)
    figures["completed"] = completed
    budgets = []
    if "random_non_training_s_median" in figures:
        reference = max(1e-9, float(figures["random_non_training_s_median"]))
        for label in ("dubhe", "dubhe_climb"):
            key = f"{label}_non_training_s_median"
            if key in figures:
                figures[f"{label}_non_training_vs_random"] = (
                    float(figures[key]) / reference
                )
        if "dubhe_non_training_vs_random" in figures:
            budgets.append(
                Budget("dubhe_non_training_vs_random", NON_TRAINING_RATIO_BUDGET)
            )
    title = (
        f"ursa bench rounds: the demo's job ({devices} device processes, K={k}, "
        f"{rounds} rounds), per method"
    )
    code = report(title, figures, budgets, as_json=as_json, out=out)
    return code if completed else 1
