"""`ursa bench ...`: benchmarks that print figures and exit 1 on a missed budget.

They live in `ursa.bench` (a checkout, not the wheel), imported when they run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ursa.tools.cli.checkout import add_checkout_only, in_checkout

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa bench` and its benchmarks (from a checkout only)."""
    if not in_checkout("ursa.bench"):
        add_checkout_only(sub, "bench", "ursa.bench", "benchmarks")
        return
    bench = sub.add_parser("bench", help="benchmarks (exit 1 when a budget is missed)")
    names = bench.add_subparsers(dest="bench_name", required=True)
    crypto = names.add_parser("crypto", help="packed Paillier and CKKS figures")
    crypto.add_argument("--json", action="store_true", help="one JSON object on stdout")
    crypto.add_argument("--repeats", type=int, default=15, help="runs per median")
    crypto.set_defaults(handler=_run_crypto)
    selection = names.add_parser("selection", help="Dubhe selection rounds per second")
    selection.add_argument("--json", action="store_true", help="one JSON object")
    selection.add_argument("--repeats", type=int, default=30, help="rounds per median")
    selection.set_defaults(handler=_run_selection)
    flicker = names.add_parser("flicker", help="FLICKER CKKS time per step, bytes")
    flicker.add_argument("--json", action="store_true", help="one JSON object")
    flicker.add_argument("--repeats", type=int, default=15, help="runs per median")
    flicker.set_defaults(handler=_run_flicker)
    protocol = names.add_parser(
        "protocol",
        help="a real MQTT fleet: N devices in worker processes, the coordinator, "
        "a private Mosquitto",
    )
    protocol.add_argument("--json", action="store_true", help="one JSON object")
    protocol.add_argument("--devices", type=int, default=200, help="N devices")
    protocol.add_argument(
        "--processes", type=int, default=2, help="device worker processes"
    )
    protocol.add_argument("--k", type=int, default=20, help="participants per round")
    protocol.add_argument("--tries", type=int, default=5, help="H tries per round")
    protocol.add_argument("--rounds", type=int, default=3, help="selection rounds")
    protocol.add_argument(
        "--key-bits", type=int, default=1024, help="Paillier key (default 1024)"
    )
    protocol.add_argument(
        "--connect-rate",
        type=float,
        default=500.0,
        help="new MQTT connections per second, over all workers",
    )
    protocol.add_argument(
        "--timeout", type=float, default=900.0, help="give up after this many s"
    )
    protocol.set_defaults(handler=_run_protocol)
    coordinator = names.add_parser(
        "coordinator",
        help="the real coordinator's CPU per round and message, up to 100,000 devices",
    )
    coordinator.add_argument("--json", action="store_true", help="one JSON object")
    coordinator.add_argument(
        "--devices",
        type=_sizes,
        default=[1000, 10_000, 100_000],
        help="comma-separated fleet sizes, each in its own process",
    )
    coordinator.add_argument("--k", type=int, default=20, help="participants per round")
    coordinator.add_argument("--tries", type=int, default=5, help="H tries per round")
    coordinator.add_argument("--rounds", type=int, default=3, help="rounds per size")
    coordinator.add_argument("--key-bits", type=int, default=2048, help="Paillier key")
    coordinator.add_argument(
        "--pool", type=int, default=64, help="distinct device ciphertexts reused"
    )
    coordinator.add_argument(
        "--enrolment",
        choices=("pinned", "tofu"),
        default="pinned",
        help="pinned: every device on the enrolment list first (the default mode)",
    )
    coordinator.add_argument(
        "--all-volunteer",
        action="store_true",
        help="every registered device answers every announce (before issue 17)",
    )
    coordinator.add_argument(
        "--timeout-s", type=float, default=3600.0, help="wall-time limit per size"
    )
    coordinator.set_defaults(handler=_run_coordinator)
    training = names.add_parser(
        "training", help="a device's peak memory while training, bytes per round"
    )
    training.add_argument("--json", action="store_true", help="one JSON object")
    training.add_argument("--key-bits", type=int, default=2048, help="Paillier key")
    training.set_defaults(handler=_run_training)
    footprint = names.add_parser(
        "footprint", help="import time and peak RSS of a device, in fresh processes"
    )
    footprint.add_argument("--json", action="store_true", help="one JSON object")
    footprint.add_argument("--repeats", type=int, default=5, help="runs per median")
    footprint.add_argument(
        "--steps", action="store_true", help="also one training round and ONNX run"
    )
    footprint.set_defaults(handler=_run_footprint)
    store = names.add_parser(
        "store", help="the coordinator store's cost per message, per commit mode"
    )
    store.add_argument("--json", action="store_true", help="one JSON object")
    store.add_argument("--messages", type=int, default=20_000, help="per run")
    store.add_argument(
        "--commit",
        choices=("every", "batched", "both"),
        default="both",
        help="a commit per message, group commit, or both side by side",
    )
    store.set_defaults(handler=_run_store)
    learning = names.add_parser(
        "learning",
        help="the demo's federation (real coordinator and devices, in memory) "
        "once per method combination, over paired seeds",
    )
    learning.add_argument("--json", action="store_true", help="one JSON object")
    learning.add_argument(
        "--seeds", type=_seeds, default=[0, 1, 2], help="comma-separated seeds"
    )
    learning.add_argument("--rounds", type=int, default=25, help="rounds per run")
    learning.add_argument(
        "--combinations",
        type=_combinations,
        help="';'-separated method lists, '+stratified' for Dubhe's stratified "
        "draw, e.g. 'random;dubhe,climb;dubhe+stratified' (default: issue 18's 7)",
    )
    learning.add_argument(
        "--key-bits", type=int, default=1024, help="Paillier key (default 1024)"
    )
    learning.add_argument(
        "--made-rounds", type=int, default=50, help="FedDisk: MADE rounds at most"
    )
    learning.add_argument("--plot", type=Path, help="write the curves as a PNG")
    learning.add_argument(
        "--progress",
        action="store_true",
        help="the progress bar even when stderr is not a terminal",
    )
    learning.set_defaults(handler=_run_learning)
    privacy = names.add_parser(
        "privacy",
        help="the demo's federation plain and under secure aggregation at each DP "
        "noise level: epsilon, accuracy, and the cross-round attack",
    )
    privacy.add_argument("--json", action="store_true", help="one JSON object")
    privacy.add_argument(
        "--noise",
        type=_floats,
        default=[0.0, 0.5, 1.0, 2.0],
        help="comma-separated noise multipliers (default 0,0.5,1,2)",
    )
    privacy.add_argument("--seed", type=int, default=0, help="population and model")
    privacy.add_argument("--rounds", type=int, default=25, help="rounds per run")
    privacy.add_argument(
        "--key-bits", type=int, default=1024, help="Paillier key (default 1024)"
    )
    privacy.add_argument(
        "--dp-clip-norm",
        type=float,
        default=2.0,
        help="the delta clip (DP sensitivity) of the noised runs (default 2.0)",
    )
    privacy.set_defaults(handler=_run_privacy)
    rounds = names.add_parser(
        "rounds",
        help="the demo's job per method (random, dubhe, dubhe,climb): per-round "
        "time beyond training, bytes per device, device peak RSS",
    )
    rounds.add_argument("--json", action="store_true", help="one JSON object")
    rounds.add_argument("--rounds", type=int, default=25, help="rounds per method")
    rounds.add_argument("--devices", type=int, default=20, help="device processes")
    rounds.add_argument("--k", type=int, default=8, help="participants per round")
    rounds.add_argument("--key-bits", type=int, default=2048, help="Paillier key")
    rounds.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="federated evaluation every N rounds (default: the demo's 5; 0: off)",
    )
    rounds.set_defaults(handler=_run_rounds)
    secagg = names.add_parser(
        "secagg",
        help="one real secure-aggregation round per (K, params), beside plain "
        "FedAvg: device CPU, bytes, messages, exactness",
    )
    secagg.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per setting, then a summary object",
    )
    secagg.add_argument(
        "--k",
        type=_secagg_ks,
        default=[8, 32, 100],
        help="comma-separated numbers of selected devices",
    )
    secagg.add_argument(
        "--params",
        type=_secagg_params,
        default=[100_000, 1_000_000],
        help="comma-separated model sizes (float values)",
    )
    secagg.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="share of the devices that drop after sharing (before the masked vector)",
    )
    secagg.add_argument("--seed", type=int, default=0, help="data and dropout seed")
    secagg.add_argument(
        "--sparse-above",
        type=int,
        default=32,
        help="[aggregation] sparse_above: the SecAgg+ graph above this K",
    )
    secagg.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per setting, round-robin; CPU figures are the least (default 3)",
    )
    secagg.set_defaults(handler=_run_secagg)


def _run_crypto(args: argparse.Namespace) -> int:
    from ursa.bench.crypto import run

    return run(as_json=args.json, repeats=args.repeats)


def _run_selection(args: argparse.Namespace) -> int:
    from ursa.bench.selection import run

    return run(as_json=args.json, repeats=args.repeats)


def _run_protocol(args: argparse.Namespace) -> int:
    from ursa.bench.protocol import FleetSetupError, run

    try:
        return _protocol(args, run)
    except FleetSetupError as exc:
        print(f"ursa bench protocol: {exc}", file=sys.stderr)
        return 2


def _protocol(args: argparse.Namespace, run: Callable[..., int]) -> int:
    return run(
        as_json=args.json,
        devices=args.devices,
        processes=args.processes,
        k=args.k,
        tries=args.tries,
        rounds=args.rounds,
        key_bits=args.key_bits,
        connect_rate=args.connect_rate,
        timeout_s=args.timeout,
    )


def _sizes(text: str) -> list[int]:
    from ursa.bench.coordinator import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_coordinator(args: argparse.Namespace) -> int:
    from ursa.bench.coordinator import run

    return run(
        as_json=args.json,
        devices=args.devices,
        k=args.k,
        tries=args.tries,
        rounds=args.rounds,
        key_bits=args.key_bits,
        pool=args.pool,
        enrolment=args.enrolment,
        all_volunteer=args.all_volunteer,
        timeout_s=args.timeout_s,
    )


def _run_flicker(args: argparse.Namespace) -> int:
    from ursa.bench.flicker import run

    return run(as_json=args.json, repeats=args.repeats)


def _run_training(args: argparse.Namespace) -> int:
    from ursa.bench.training import run

    return run(as_json=args.json, key_bits=args.key_bits)


def _run_footprint(args: argparse.Namespace) -> int:
    from ursa.bench.footprint import run

    return run(as_json=args.json, repeats=args.repeats, steps=args.steps)


def _run_store(args: argparse.Namespace) -> int:
    from ursa.bench.store import MODES, run

    modes = MODES if args.commit == "both" else (args.commit,)
    return run(as_json=args.json, messages=args.messages, modes=modes)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seed given")
    return seeds


def _combinations(text: str) -> list[Any]:
    from ursa.bench.learning import parse_combinations

    try:
        return list(parse_combinations(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_learning(args: argparse.Namespace) -> int:
    from ursa.bench.learning import COMBINATIONS, run

    if args.rounds < 1:
        print("ursa bench learning: --rounds must be at least 1", file=sys.stderr)
        return 2
    return run(
        combinations=args.combinations or COMBINATIONS,
        seeds=args.seeds,
        rounds=args.rounds,
        key_bits=args.key_bits,
        made_rounds=args.made_rounds,
        as_json=args.json,
        plot=args.plot,
        progress=args.progress or sys.stderr.isatty(),
    )


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError("noise multipliers must be >= 0")
    return values


def _run_privacy(args: argparse.Namespace) -> int:
    from ursa.bench.privacy import run

    if args.rounds < 1:
        print("ursa bench privacy: --rounds must be at least 1", file=sys.stderr)
        return 2
    return run(
        noise=args.noise,
        seed=args.seed,
        rounds=args.rounds,
        key_bits=args.key_bits,
        dp_clip_norm=args.dp_clip_norm,
        as_json=args.json,
    )


def _run_rounds(args: argparse.Namespace) -> int:
    from ursa.bench.rounds import run
    from ursa.tools.demo.settings import DemoError

    try:
        return run(
            rounds=args.rounds,
            devices=args.devices,
            k=args.k,
            key_bits=args.key_bits,
            eval_every=args.eval_every,
            as_json=args.json,
        )
    except DemoError as exc:
        print(f"ursa bench rounds: {exc}", file=sys.stderr)
        return 2


def _secagg_ints(text: str, *, least: int, what: str) -> list[int]:
    from ursa.bench.secagg import parse_ints

    try:
        return parse_ints(text, least=least, what=what)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _secagg_ks(text: str) -> list[int]:
    return _secagg_ints(text, least=2, what="--k")


def _secagg_params(text: str) -> list[int]:
    return _secagg_ints(text, least=11, what="--params")


def _run_secagg(args: argparse.Namespace) -> int:
    from ursa.bench.secagg import SecaggBenchError, run

    if not 0.0 <= args.dropout < 1.0:
        print("ursa bench secagg: --dropout must be in [0, 1)", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print("ursa bench secagg: --repeats must be >= 1", file=sys.stderr)
        return 2
    try:
        return run(
            ks=args.k,
            params=args.params,
            dropout=args.dropout,
            seed=args.seed,
            sparse_above=args.sparse_above,
            as_json=args.json,
            repeats=args.repeats,
        )
    except SecaggBenchError as exc:
        print(f"ursa bench secagg: {exc}", file=sys.stderr)
        return 2
