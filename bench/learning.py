"""`ursa bench learning`: the demo's federation once per method combination.

Each combination runs over the same seeds with paired starts: a seed gives
every combination the same device data, initial model and device seeds
(`ursa.bench.learning_run`). The output is one row per run, a summary per
combination (mean and range over the seeds), a table, and with ``--plot``
the accuracy and worst-class curves.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ursa.bench.learning_run import (
    TARGET_ACCURACY,
    Combination,
    LearningStalledError,
    UnsupportedCombinationError,
    run_federation,
)
from ursa.bench.progress import ProgressBar

__all__ = ["COMBINATIONS", "parse_combinations", "run", "summarise"]

COMBINATIONS = (
    Combination(("random",)),
    Combination(("dubhe",)),
    Combination(("dubhe",), {"draw": "stratified"}),
    Combination(("dubhe", "climb")),
    Combination(("dubhe", "feddisk")),
    Combination(("dubhe", "flicker")),
    Combination(("dubhe", "climb", "flicker")),
)
"""Issue 18's combinations; a bare selection trains with FedAvg."""

TO_TARGET = f"rounds_to_{TARGET_ACCURACY}"
SUMMARISED = (
    "final_accuracy",
    "worst_class_accuracy",
    TO_TARGET,
    "selection_l1_mean",
    "bytes_per_device",
)


def parse_combinations(text: str) -> list[Combination]:
    """``random;dubhe,climb;dubhe+stratified`` as combinations.

    ``+stratified`` asks for Dubhe's stratified draw.

    Raises:
        ValueError: an empty list.
    """
    out = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        names, _, draw = part.partition("+")
        methods = tuple(m.strip() for m in names.split(",") if m.strip())
        options = {"draw": draw.strip()} if draw.strip() else {}
        out.append(Combination(methods, options))
    if not out:
        raise ValueError("no combination given")
    return out


def _stat(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and range of the values that are not None; how many were None."""
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    return {
        "mean": sum(present) / len(present) if present else None,
        "min": min(present) if present else None,
        "max": max(present) if present else None,
        "missing": len(values) - len(present),
    }


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per combination (in first-seen order): each figure's mean and range."""
    order: list[str] = []
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in runs:
        if row["methods"] not in grouped:
            order.append(row["methods"])
            grouped[row["methods"]] = []
        grouped[row["methods"]].append(row)
    out = []
    for label in order:
        rows = grouped[label]
        entry: dict[str, Any] = {
            "methods": label,
            "draw": rows[0]["draw"],
            "seeds": [r["seed"] for r in rows],
        }
        for key in SUMMARISED:
            entry[key] = _stat([r[key] for r in rows])
        out.append(entry)
    return out


def _cell(stat: dict[str, Any], fmt: str, scale: float = 1.0) -> str:
    if stat["mean"] is None:
        return "never"
    mean, low, high = (stat[k] * scale for k in ("mean", "min", "max"))
    text = f"{mean:{fmt}} ({low:{fmt}}-{high:{fmt}})"
    return text + (f", {stat['missing']} never" if stat["missing"] else "")


def table(summary: Sequence[dict[str, Any]], skipped: dict[str, str]) -> str:
    """The summary as a Markdown table: mean (min-max) over the seeds."""
    lines = [
        "| methods | draw | final accuracy | worst class | rounds to "
        f"{TARGET_ACCURACY} | `||p_o - p_u||_1` | KiB per device |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        lines.append(
            f"| {row['methods']} | {row['draw']} "
            f"| {_cell(row['final_accuracy'], '.3f')} "
            f"| {_cell(row['worst_class_accuracy'], '.3f')} "
            f"| {_cell(row[TO_TARGET], '.0f')} "
            f"| {_cell(row['selection_l1_mean'], '.3f')} "
            f"| {_cell(row['bytes_per_device'], ',.0f', 1 / 1024)} |"
        )
    for label, why in skipped.items():
        lines.append(f"| {label} | skipped: {why} | | | | | |")
    return "\n".join(lines)


def run(
    *,
    combinations: Sequence[Combination] = COMBINATIONS,
    seeds: Sequence[int] = (0, 1, 2),
    rounds: int = 25,
    devices: int = 20,
    k: int = 8,
    tries: int = 5,
    key_bits: int = 1024,
    made_rounds: int = 50,
    as_json: bool = False,
    plot: Path | None = None,
    progress: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run every combination over every seed; print JSON or a table.

    Returns 1 when a run failed (stalled), 0 otherwise (a skipped
    combination is not a failure: it says why).
    """
    from ursa.tools.demo.settings import TrainingDemoSettings

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    base = replace(
        TrainingDemoSettings(),
        devices=devices,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        made_rounds=made_rounds,
    )
    bar = ProgressBar(err, len(combinations) * len(seeds) * rounds, enabled=progress)
    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    started = time.perf_counter()
    for combination in combinations:
        for seed in seeds:
            done = bar.done
            bar.label = f"{combination.label} seed {seed}"
            try:
                runs.append(
                    run_federation(
                        base, combination, seed, lambda n, d=done: bar.update(d + n)
                    )
                )
            except UnsupportedCombinationError as exc:
                skipped[combination.label] = str(exc)
                bar.update(done + rounds * (len(seeds)))
                break
            except LearningStalledError as exc:
                failed[f"{combination.label} seed {seed}"] = str(exc)
            bar.update(done + rounds)
    bar.close()
    summary = summarise(runs)
    result = {
        "settings": {
            "population": "ursa demo's: digits, rho 10, EMD 1.5",
            "devices": base.devices,
            "k": base.k,
            "tries": base.tries,
            "rounds": rounds,
            "seeds": list(seeds),
            "key_bits": key_bits,
            "made_rounds_max": made_rounds,
            "local_epochs": base.local_epochs,
            "batch_size": base.batch_size,
            "lr": base.lr,
            "transport": "in-memory bus, one process (real coordinator and devices)",
        },
        "runs": runs,
        "summary": summary,
        "skipped": skipped,
        "failed": failed,
        "wall_s": time.perf_counter() - started,
    }
    if plot is not None and runs:
        from ursa.bench.learning_plot import plot_curves

        plot_curves(runs, plot)
    if as_json:
        out.write(json.dumps(result, allow_nan=False) + "\n")
    else:
        out.write(
            f"{base.devices} devices, K={base.k}, H={base.tries}, {rounds} rounds, "
            f"seeds {', '.join(map(str, seeds))}, {key_bits}-bit Paillier keys; "
            "mean (min-max) over the seeds\n"
        )
        out.write(table(summary, skipped) + "\n")
        for label, why in failed.items():
            out.write(f"FAILED {label}: {why}\n")
        if plot is not None and runs:
            out.write(f"plot: {plot}\n")
    return 1 if failed else 0
