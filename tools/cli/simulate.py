"""`ursa simulate ...`: the lab's in-process simulations for method comparisons.

They live in `ursa.lab` (a checkout, not the wheel), imported when they run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ursa.tools.cli.checkout import add_checkout_only, in_checkout

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa simulate`: the lab's simulations, from a checkout only."""
    if not in_checkout("ursa.lab"):
        add_checkout_only(sub, "simulate", "ursa.lab", "in-process simulations")
        return
    simulate = sub.add_parser("simulate", help="in-process simulations")
    names = simulate.add_subparsers(dest="simulation", required=True)
    _register_selection(names)
    from ursa.lab.simulate.flicker import add_flicker_parser
    from ursa.lab.simulate.train import add_train_parser

    add_flicker_parser(names)
    add_train_parser(names)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers: {text}"
        ) from exc
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _sigma(text: str) -> tuple[float, ...] | None:
    if text.strip().lower() == "search":
        return None
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--sigma takes 'search' or comma-separated numbers: {text}"
        ) from exc


def _register_selection(names: Subparsers) -> None:
    parser = names.add_parser(
        "selection",
        help="Dubhe vs random vs greedy: ||p_o - p_u||_1 per round",
        description=(
            "Seeded simulation of Dubhe client selection on a synthetic "
            "population (global imbalance rho, average EMD), beside random and "
            "greedy selection: vectorised (--engine fast) or on the production "
            "coordinator and devices (--engine service). Prints a table, or one "
            "JSON object with --json."
        ),
    )
    add = parser.add_argument
    add("--classes", type=int, default=10, help="number of classes C (default 10)")
    add("--clients", type=int, default=1000, help="number of devices N (default 1000)")
    add("--k", type=int, default=20, help="participants per round K (default 20)")
    add("--rho", type=float, default=10.0, help="global imbalance ratio (default 10)")
    add(
        "--emd", type=float, default=1.5, help="average EMD to the global (default 1.5)"
    )
    add("--tries", type=_ints, default=(1, 5, 20), help="H values, e.g. 1,5,20")
    add("--rounds", type=int, default=500, help="rounds per method (default 500)")
    add("--seed", type=int, default=0, help="seed of every random stream (default 0)")
    add("--groups", type=_ints, default=None, help="reference set G (default 1,2,C)")
    add(
        "--sigma",
        type=_sigma,
        default=None,
        help="'search' (default) or sigma_i for each group but C, e.g. 0.7,0.1",
    )
    add(
        "--draw",
        choices=("paper", "stratified", "both"),
        default="paper",
        help="volunteer draw: the paper's coins (default), ursa's stratified, or both",
    )
    add(
        "--search-score",
        choices=("paper", "distance"),
        default="paper",
        help="sigma-search criterion: ||E p_o - p_u|| (paper) or E||p_o - p_u||",
    )
    add("--search-tries", type=int, default=100, help="tries per sigma in the search")
    add("--skew-spread", type=float, default=0.0, help="spread of device skews, [0, 1)")
    add("--samples", type=int, default=500, help="samples per device (default 500)")
    add(
        "--partition",
        choices=("dubhe", "pairs"),
        default="dubhe",
        help="population generator: dubhe (default) or pairs (<= 2 classes a device)",
    )
    add(
        "--encrypted",
        action="store_true",
        help=(
            "registry and try sums through real packed Paillier (one encryption "
            "per device per registration and per member per round, ~8 ms at 2048 "
            "bits; the sigma search registers once per grid point: give --sigma "
            "to skip it); refuses N > 2000 without --force"
        ),
    )
    add("--key-bits", type=int, default=2048, help="Paillier key size (--encrypted)")
    add(
        "--engine",
        choices=("fast", "service"),
        default="fast",
        help=(
            "who plays Dubhe's rounds: the vectorised draws (fast, default) or "
            "the production coordinator and devices over the in-memory bus "
            "(service: one federation per H, 512-bit test keys, seconds per "
            "round at N=1000; refuses N > 2000 without --force)"
        ),
    )
    add("--force", action="store_true", help="allow --encrypted or service, N > 2000")
    add("--json", action="store_true", help="print one JSON object")
    add(
        "--plot", metavar="PATH", help="write a PNG (class proportions; sweep if given)"
    )
    add("--sweep", action="store_true", help="also sweep the participation rate K/N")
    add("--sweep-rounds", type=int, default=100, help="rounds per sweep point")
    parser.set_defaults(handler=_run_selection)


def _run_selection(args: argparse.Namespace) -> int:
    from ursa.crypto.errors import CryptoError
    from ursa.lab.simulate.encrypted_sums import EncryptedSums, simulate_encrypted
    from ursa.lab.simulate.selection import SelectionSimConfig, simulate_selection
    from ursa.lab.simulate.selection_plot import participation_sweep, plot_selection
    from ursa.lab.simulate.selection_service import check_service_size
    from ursa.lab.simulate.selection_sums import PLAINTEXT
    from ursa.lab.simulate.stuck_run import ServiceRunError

    draws = ("paper", "stratified") if args.draw == "both" else (args.draw,)
    try:
        config = SelectionSimConfig(
            num_classes=args.classes,
            num_clients=args.clients,
            k=args.k,
            rho=args.rho,
            emd=args.emd,
            tries=args.tries,
            rounds=args.rounds,
            seed=args.seed,
            groups=args.groups,
            sigma=args.sigma,
            draws=draws,
            samples_per_client=args.samples,
            skew_spread=args.skew_spread,
            search_tries=args.search_tries,
            search_score=args.search_score,
            partition=args.partition,
            engine=args.engine,
        )
        if args.engine == "service":
            if args.encrypted or args.sweep:
                raise ValueError(
                    "--engine service runs its own Paillier and no sweep: "
                    "drop --encrypted and --sweep"
                )
            check_service_size(args.clients, force=args.force)
        if args.encrypted:
            report = simulate_encrypted(config, args.key_bits, force=args.force)
        else:
            report = simulate_selection(config)
        sweep = None
        if args.sweep:
            sums = EncryptedSums(args.key_bits) if args.encrypted else None
            backend = PLAINTEXT if sums is None else sums.backend()
            sweep = participation_sweep(
                config, rounds=args.sweep_rounds, backend=backend
            )
            if sums is not None:
                sweep["crypto"] = sums.report()
    except (ValueError, CryptoError, ServiceRunError) as exc:  # typed errors
        print(f"ursa simulate selection: {exc}", file=sys.stderr)
        return 2
    if sweep is not None:
        report["sweep"] = sweep
    if args.plot:
        plot_selection(report, args.plot, sweep)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_selection_table(report))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def format_selection_table(report: Mapping[str, Any]) -> str:
    """The human-readable summary of a `simulate_selection` report."""
    pop = report["population"]
    lines = [
        f"population: N={pop['num_clients']} C={pop['num_classes']}  "
        f"rho {pop['rho']:.3f} (requested {pop['requested_rho']:g})  "
        f"EMD_avg {pop['emd_avg']:.3f} (requested {pop['requested_emd']:g})  "
        f"partition {pop['partition']}, mean top-class share "
        f"{pop['mean_top_class']:.3f}",
        f"K={report['config']['k']}  rounds={report['config']['rounds']}  "
        f"G={report['groups']} (registry {report['registry_length']} slots)  "
        f"engine {report['config']['engine']}",
    ]
    for key, label in (("", "paper draw"), ("_stratified", "stratified draw")):
        if f"sigma{key}" in report:
            lines.append(
                f"sigma ({label}): {report[f'sigma{key}']}  "
                f"non-empty slots: {report[f'registry_nonzero{key}']}"
            )
    lines.append(f"{'method':<22}{'mean':>9}{'std':>9}{'vs random':>11}")
    random_mean = report["random"]["mean"]

    def row(name: str, stats: Mapping[str, float]) -> str:
        gain = 1.0 - stats["mean"] / random_mean
        return f"{name:<22}{stats['mean']:>9.4f}{stats['std']:>9.4f}{gain:>10.1%}"

    lines.append(row("random", report["random"]))
    lines.append(row("greedy", report["greedy"]))
    for key, label in (("dubhe", "dubhe"), ("dubhe_stratified", "dubhe stratified")):
        for h, stats in report.get(key, {}).items():
            lines.append(row(f"{label} H={h[1:]}", stats))
    paper = report["paper"]
    lines.append(
        "paper (Table 2, ||p_o - p_u||_1): "
        + ", ".join(f"H={h[1:]} {v}" for h, v in paper["dubhe"].items())
        + f", greedy {paper['greedy']}; reduction vs random "
        f"{paper['reduction_vs_random']:.1%}"
    )
    for key, label in (("", "dubhe"), ("_stratified", "dubhe stratified")):
        for h, run in report.get(f"service{key}", {}).items():
            lines.append(
                f"service run {label} H={h[1:]}: {run['elapsed_s']:.1f} s, "
                f"{run['key_epochs']} key epoch(s)"
            )
    if "crypto" in report:
        lines.extend(format_crypto(report["crypto"]))
    lines.append(f"elapsed {report['elapsed_s']:.1f} s")
    return "\n".join(lines)


def format_crypto(crypto: Mapping[str, Any]) -> list[str]:
    """Crypto time and bytes of an encrypted run, one line per stage."""
    lines = [
        f"crypto: Paillier {crypto['key_bits']}-bit, "
        f"keygen {crypto['keygen_s']:.2f} s, "
        f"registry {crypto['registry_ciphertext_bytes']} B/device, distribution "
        f"{crypto['distribution_ciphertext_bytes']} B/member/round; total "
        f"{crypto['crypto_s']:.1f} s, {crypto['total_bytes'] / 1e6:.2f} MB"
    ]
    for name, s in crypto["phases"].items():
        rounds = max(1, s["rounds"])
        encryptions = max(1, s["registry_encryptions"] + s["distribution_encryptions"])
        lines.append(
            f"  {name:<18} {s['crypto_s']:>7.2f} s {s['total_bytes'] / 1e6:>8.2f} MB  "
            f"registries {s['registry_sums']} ({s['registry_encryptions']} enc), "
            f"{s['distribution_encryptions'] / rounds:.0f} distribution enc and "
            f"{s['try_sums'] / rounds:.0f} try sums a round; device encrypt "
            f"{s['device_encrypt_s']:.2f} s "
            f"({1e3 * s['device_encrypt_s'] / encryptions:.2f} ms each), "
            "coordinator parse+sum "
            f"{s['coordinator_parse_s'] + s['coordinator_sum_s']:.2f} s, decrypt "
            f"{s['decrypt_s']:.2f} s"
        )
    return lines
