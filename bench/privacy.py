"""`ursa bench privacy`: what secure sums leak across rounds, with and without DP.

The demo's federation (`ursa.bench.learning_run`: the real coordinator and
devices in one process, the demo's population and settings) runs once with
plain aggregation and once per ``noise_multiplier`` with secure aggregation,
on the same seed. Per run it reports:

* the privacy spent (epsilon at the configured delta, composed over the
  rounds: `ursa.coordinator.secure_aggregation.privacy`);
* the final accuracy on the held-out split, and, against the plain run, the
  accuracy difference and the largest absolute difference of the final global
  models (secure aggregation changes the model only by its rounding, clipping
  and noise);
* the cross-round disaggregation attack (`ursa.bench.disaggregation`) as a
  curious coordinator would run it on what it holds: each round's change of
  the output layer's bias times the number of summed devices (first order:
  the sum over the round's devices of their class share minus the model's),
  the participation sets, non-negative least squares per class. Its score is
  the share of devices whose dominant class it names; the best constant guess
  is printed beside it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

import numpy as np

from ursa.bench.disaggregation import (
    disaggregate,
    dominant_class_recovery,
    participation_matrix,
)
from ursa.bench.learning_run import Combination, run_federation

__all__ = ["DEFAULT_NOISE", "run"]

DEFAULT_NOISE = (0.0, 0.5, 1.0, 2.0)
DP_CLIP_NORM = 2.0
"""About the demo's delta norms (1.5 to 2 in the first round): DP's noise scales
with the clip, so a clip no larger than the deltas is the best case for it."""


def _output_bias(arrays: Any) -> np.ndarray[Any, Any]:
    """The output layer's bias: the last 1-D float array of the model."""
    name = [n for n, a in arrays.items() if np.asarray(a).ndim == 1][-1]
    return np.asarray(arrays[name], dtype=np.float64)


def _one_run(
    base: Any, combination: Combination, seed: int
) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], Any]], Any]:
    """One federation: its figures, each round's (contributors, model), privacy."""
    seen: list[tuple[tuple[str, ...], Any]] = []
    spent: list[Any] = []

    def watch(record: Any, arrays: Any) -> None:
        seen.append((tuple(record.contributed), dict(arrays)))
        spent.append(record.metrics.get("privacy"))

    figures = run_federation(base, combination, seed, watch=watch)
    return figures, seen, spent[-1] if spent else None


def _attack(
    seen: list[tuple[tuple[str, ...], Any]], initial: Any, devices: Sequence[str]
) -> np.ndarray[Any, Any]:
    """The coordinator's guess of each device's dominant class (see the module doc)."""
    before = _output_bias(initial)
    sums, members = [], []
    for contributed, arrays in seen:
        after = _output_bias(arrays)
        if contributed:
            sums.append((after - before) * len(contributed))
            members.append(contributed)
        before = after
    participation = participation_matrix(members, devices)
    result = disaggregate(np.array(sums), participation)
    return np.asarray(result.dominant)


def run(
    *,
    noise: Sequence[float] = DEFAULT_NOISE,
    seed: int = 0,
    rounds: int = 25,
    methods: tuple[str, ...] = ("dubhe", "climb"),
    devices: int = 20,
    k: int = 8,
    tries: int = 5,
    key_bits: int = 1024,
    dp_clip_norm: float = DP_CLIP_NORM,
    as_json: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run plain, then secure at each noise level; print JSON or a table.

    Secure runs without noise keep the default ``clip_norm`` (it clips no
    honest delta of the demo); noised runs clip to ``dp_clip_norm``, the
    sensitivity the noise is scaled to.
    """
    from ursa.tools.demo.population import demo_population
    from ursa.tools.demo.settings import TrainingDemoSettings

    out = out if out is not None else sys.stdout
    base = replace(
        TrainingDemoSettings(),
        devices=devices,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        seed=seed,
    )
    combination = Combination(methods)
    population = demo_population(base)
    counts = np.asarray(population.counts, dtype=np.float64)
    ids = [f"dev{i:03d}" for i in range(base.devices)]
    dominant = counts.argmax(axis=1)
    constant = float(np.bincount(dominant).max() / len(dominant))

    rows: list[dict[str, Any]] = []
    plain_final: Any = None
    plain_accuracy: float | None = None
    for label, settings in [
        ("plain", replace(base, aggregation="plain")),
        *[
            (
                f"secure z={z}",
                replace(
                    base,
                    noise_multiplier=z,
                    clip_norm=dp_clip_norm if z else base.clip_norm,
                ),
            )
            for z in noise
        ],
    ]:
        figures, seen, privacy = _one_run(settings, combination, seed)
        initial = _initial_model(settings)
        guesses = _attack(seen, initial, ids)
        final = seen[-1][1] if seen else None
        row: dict[str, Any] = {
            "run": label,
            "aggregation": settings.aggregation,
            "noise_multiplier": settings.noise_multiplier,
            "clip_norm": settings.clip_norm,
            "epsilon": None if not privacy else privacy["epsilon_total"],
            "delta": None if not privacy else privacy["delta"],
            "final_accuracy": figures["final_accuracy"],
            "attack_top1_recovery": dominant_class_recovery(counts, guesses),
            "rounds_completed": figures["rounds_completed"],
        }
        if plain_final is None:
            plain_final, plain_accuracy = final, figures["final_accuracy"]
        elif final is not None and plain_accuracy is not None:
            row["accuracy_minus_plain"] = figures["final_accuracy"] - plain_accuracy
            row["max_abs_model_difference"] = float(
                max(
                    np.max(np.abs(np.asarray(final[n]) - np.asarray(plain_final[n])))
                    for n in final
                )
            )
        rows.append(row)
    result = {
        "settings": {
            "population": "ursa demo's: digits, rho 10, EMD 1.5",
            "methods": ",".join(methods),
            "devices": base.devices,
            "k": base.k,
            "rounds": rounds,
            "seed": seed,
            "key_bits": key_bits,
        },
        "attack_constant_guess": constant,
        "runs": rows,
    }
    if as_json:
        print(json.dumps(result), file=out)
    else:
        print(_table(result), file=out)
    return 0


def _initial_model(settings: Any) -> Any:
    """Version 0 as the harness writes it (the same seed: the same weights)."""
    from ursa.models.registry import initial_arrays
    from ursa.tools.demo.population import demo_population
    from ursa.tools.demo.settings import ARCHITECTURE

    fed = demo_population(settings)
    config = {
        "input_dim": fed.input_dim,
        "num_classes": fed.num_classes,
        "hidden_sizes": list(settings.hidden_sizes),
    }
    return initial_arrays(ARCHITECTURE, config, seed=settings.seed)


def _table(result: dict[str, Any]) -> str:
    lines = [
        "| run | noise z | epsilon | final accuracy | vs plain | max model diff "
        "| attack top-1 |",
        "|---|---|---|---|---|---|---|",
    ]

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for row in result["runs"]:
        lines.append(
            f"| {row['run']} | {row['noise_multiplier']:g} | "
            f"{fmt(row['epsilon'], '.2f')} | {fmt(row['final_accuracy'], '.4f')} | "
            f"{fmt(row.get('accuracy_minus_plain'), '+.4f')} | "
            f"{fmt(row.get('max_abs_model_difference'), '.2e')} | "
            f"{row['attack_top1_recovery']:.2f} |"
        )
    lines.append(
        f"(attack: the best constant guess names {result['attack_constant_guess']:.2f})"
    )
    return "\n".join(lines)
