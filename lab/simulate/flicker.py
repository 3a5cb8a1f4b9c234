"""`ursa simulate flicker`: FLICKER on the paper's count tables, with real CKKS.

At the count level (the paper's tables: thousands of CIFAR / AG News samples
we do not have) the data work is modelled by
`ursa.edge_sdk.methods.flicker.algorithm.CountResampler`: over-sampling is exact
(``round(1/LI)``), under-sampling removes ``redundant_fraction`` of the
``theta`` share that the local test would buffer. `simulate_table` runs
FLICKER with the production objects (the coordinator's `FlickerMethod`, the
devices' `FlickerParticipant`, over the in-memory bus:
`ursa.lab.simulate.flicker_fleet`), checks every figure against the
operation-counting reference run (`ursa.lab.simulate.flicker_run.run_flicker`,
whose decrypted values are each checked against plaintext; the CKKS operation
counts and the cosine error are its), runs the local baselines of §4.2 beside
it, and puts the paper's Table 5 / Table 7 next to the result.
``--train`` adds the learning comparison on digits
(`ursa.lab.simulate.flicker_train.run_train_comparison`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ursa.coordinator.methods.flicker import algorithm as coord
from ursa.coordinator.methods.flicker.outcome import FlickerPhase
from ursa.coordinator.methods_config import FlickerSpec
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.lab.simulate.flicker_fleet import build_fleet
from ursa.lab.simulate.flicker_run import (
    CountingContext,
    CountingKeyOwner,
    FlickerRun,
    SimulationError,
    baseline_report,
    format_counts,
    run_flicker,
    run_local_baseline,
)
from ursa.lab.simulate.flicker_tables import METHODS, PAPER_RESULTS, get_table
from ursa.lab.simulate.flicker_train import (
    format_train,
    run_train_comparison,
    scale_table,
)

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "CountingContext",
    "CountingKeyOwner",
    "FlickerRun",
    "SimulationError",
    "add_flicker_parser",
    "format_report",
    "format_train",
    "main",
    "production_run",
    "run_flicker",
    "run_local_baseline",
    "run_train_comparison",
    "scale_table",
    "simulate_table",
]


def simulate_table(
    name: str,
    *,
    nabla: float = coord.DEFAULT_NABLA,
    nabla_client: float = dev.DEFAULT_NABLA_CLIENT,
    theta: float = dev.DEFAULT_THETA,
    redundant_fraction: float = dev.DEFAULT_REDUNDANT_FRACTION,
    seed: int = 0,
) -> dict[str, Any]:
    """Run FLICKER and both local baselines on a paper table at the count level."""
    table = get_table(name)
    counts = {f"dev-{i + 1}": row for i, row in enumerate(table)}
    model = dev.CountResampler(theta=theta, redundant_fraction=redundant_fraction)
    reference = run_flicker(
        counts,
        {d: model for d in counts},
        nabla=nabla,
        nabla_client=nabla_client,
        seed=seed,
    )
    run = production_run(
        counts, model, reference, nabla=nabla, nabla_client=nabla_client, seed=seed
    )
    local_under = dev.CountResampler(theta=theta, redundant_fraction=1.0)
    baselines = {
        "under": baseline_report(
            {
                d: run_local_baseline(
                    c, dev.Method.UNDER, local_under, nabla_client=nabla_client
                )
                for d, c in counts.items()
            }
        ),
        "over": baseline_report(
            {
                d: run_local_baseline(
                    c, dev.Method.OVER, model, nabla_client=nabla_client
                )
                for d, c in counts.items()
            }
        ),
    }
    return {
        "table": name.upper(),
        "nabla": nabla,
        "nabla_client": nabla_client,
        "theta": theta,
        "redundant_fraction": redundant_fraction,
        "flicker": run.to_dict(),
        "baselines": baselines,
        "paper": {m: PAPER_RESULTS[name.upper()][m].to_dict() for m in METHODS},
    }


def production_run(
    counts: Mapping[str, Sequence[int]],
    model: dev.Resampler,
    reference: FlickerRun,
    *,
    nabla: float,
    nabla_client: float,
    seed: int,
) -> FlickerRun:
    """The run of the production objects on the bus, in ``reference``'s ring order.

    Its figures (ring, global counts, GI, stop reason, each device's counts)
    come from the production run; the CKKS operation counts, the cosine
    error and the step log from ``reference``, which it must equal.

    Raises:
        SimulationError: the production run failed or differs from ``reference``.
    """
    spec = FlickerSpec(nabla=nabla, nabla_client=nabla_client)
    resamplers = dict.fromkeys(counts, model)
    with build_fleet(counts, resamplers=resamplers, spec=spec, seed=seed) as fleet:
        outcome = fleet.run(reference.ring_order)
        final = {d: p.state for d, p in fleet.participants.items()}
    state, gd_before = outcome.state, outcome.gd_before
    if outcome.phase is not FlickerPhase.DONE or state is None or gd_before is None:
        raise SimulationError(f"the production run failed: {outcome.failure}")
    same = (
        gd_before == reference.gd_before
        and state.global_counts == reference.state.global_counts
        and state.stop_reason == reference.state.stop_reason
        and {d: s.counts for d, s in final.items()}
        == {d: s.counts for d, s in reference.final.items()}
    )
    if not same:
        raise SimulationError("the production run differs from the reference run")
    return FlickerRun(
        outcome.ring_order,
        reference.initial,
        final,
        state,
        gd_before,
        log=reference.log,
        device_ops=reference.device_ops,
        coordinator_ops=reference.coordinator_ops,
        max_cosine_error=reference.max_cosine_error,
    )


def format_report(result: Mapping[str, Any]) -> str:
    """Render `simulate_table`'s result (and a training comparison) as text."""
    fl, paper = result["flicker"], result["paper"]
    pf = paper["flicker"]
    lines = [
        f"FLICKER on {result['table']} (nabla {result['nabla']}, nabla_client "
        f"{result['nabla_client']}, theta {result['theta']}, redundant fraction "
        f"{result['redundant_fraction']}, ring {' > '.join(fl['ring_order'])})",
        f"GI {fl['gi_before']:.4f} -> {fl['gi_after']:.4f} (paper {pf['gi']}); "
        f"stop: {fl['stop_reason']}; {fl['localisations']} localisations, "
        f"{fl['updates']} updates",
        f"{'device':<7}{'before':>20}{'after':>20}{'LI':>14}{'added':>7}"
        f"{'removed':>8}  {'paper after (LI)':<24} saturation",
    ]
    for i, row in enumerate(fl["devices"]):
        li = f"{row['li_before']:.4f}>{row['li_after']:.4f}"
        ref = f"{format_counts(pf['counts'][i])} ({pf['li'][i]})"
        lines.append(
            f"{row['device']:<7}{format_counts(row['counts_before']):>20}"
            f"{format_counts(row['counts_after']):>20}{li:>14}{row['added']:>7}"
            f"{row['removed']:>8}  {ref:<24} {row['saturation']}"
        )
    base = result["baselines"]
    ops = fl["ckks_ops"]
    lines += [
        f"net change {fl['net_change']:+d} (paper {pf['net_change']:+d}); "
        f"added {fl['added']}, removed {fl['removed']}",
        f"local over-sampling adds {base['over']['added']} (paper "
        f"{paper['over']['net_change']}), GI {base['over']['gi_after']:.4f} (paper "
        f"{paper['over']['gi']}); local under-sampling removes "
        f"{base['under']['removed']} (paper {-paper['under']['net_change']}), GI "
        f"{base['under']['gi_after']:.4f} (paper {paper['under']['gi']})",
        f"CKKS operations: {ops['total']} (devices {ops['device']}, coordinator "
        f"{ops['coordinator']}); paper's worst case 2NM+3N+2 = "
        f"{ops['paper_worst_case']}; max cosine error {fl['max_cosine_error']:.1e}",
    ]
    if "train" in result:
        lines += ["", format_train(result["train"])]
    return "\n".join(lines)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table",
        default="D1",
        choices=["D1", "D2", "D3", "AG"],
        type=str.upper,
        help="the paper's count table (default D1)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--train",
        action="store_true",
        help="also compare the four methods by training on digits",
    )
    parser.add_argument("--seeds", type=int, default=3, help="training seeds")
    parser.add_argument("--rounds", type=int, default=20, help="FL rounds (train)")
    parser.add_argument("--nabla", type=float, default=coord.DEFAULT_NABLA)
    parser.add_argument("--nabla-client", type=float, default=dev.DEFAULT_NABLA_CLIENT)
    parser.add_argument("--theta", type=float, default=dev.DEFAULT_THETA)
    parser.add_argument(
        "--redundant-fraction",
        type=float,
        default=dev.DEFAULT_REDUNDANT_FRACTION,
        help="count level: share of tested samples removed",
    )
    parser.add_argument("--seed", type=int, default=0, help="ring order, masks")


def _handle(args: argparse.Namespace) -> int:
    result = simulate_table(
        args.table,
        nabla=args.nabla,
        nabla_client=args.nabla_client,
        theta=args.theta,
        redundant_fraction=args.redundant_fraction,
        seed=args.seed,
    )
    if args.train:
        result["train"] = run_train_comparison(
            args.table,
            seeds=args.seeds,
            rounds=args.rounds,
            nabla=args.nabla,
            nabla_client=args.nabla_client,
            theta=args.theta,
        )
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def add_flicker_parser(simulate_subparsers: Subparsers) -> None:
    """Add `ursa simulate flicker` to the `ursa simulate` subparsers."""
    parser = simulate_subparsers.add_parser(
        "flicker", help="FLICKER on the paper's count tables (real CKKS)"
    )
    _add_arguments(parser)
    parser.set_defaults(handler=_handle)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `ursa simulate flicker` standalone (before the CLI wires it in)."""
    parser = argparse.ArgumentParser(prog="ursa simulate flicker")
    _add_arguments(parser)
    handler_args = parser.parse_args(argv)
    return _handle(handler_args)


if __name__ == "__main__":
    sys.exit(main())
