"""`ursa demo`: everything on one machine, learning (default) or selection only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_DEMO_HTTP = "127.0.0.1:9464"
"""Where a bare ``ursa demo --http`` serves the dashboard (loopback, no token)."""

# (training demo, selection-only demo) defaults of the shared options
_DEFAULTS = {
    "devices": (20, 50),
    "k": (8, 10),
    "tries": (5, 5),
    "rounds": (25, 10),
}


def register(sub: Subparsers) -> None:
    """Attach `ursa demo`."""
    demo = sub.add_parser(
        "demo",
        help="broker + coordinator + device processes learning digits, with a report",
        description=(
            "Embedded broker, coordinator and N device processes on the bundled "
            "digits data (rho 10, EMD 1.5): Dubhe selection with CLIMB weights by "
            "default; writes a report folder (JSON, PNG plots, model.onnx)."
        ),
    )
    demo.add_argument(
        "--selection-only",
        action="store_true",
        help="Dubhe selection rounds without training (in-process devices)",
    )
    demo.add_argument("--devices", type=int, help="N devices (default 20; 50 sel.)")
    demo.add_argument("--k", type=int, help="participants per round (default 8; 10)")
    demo.add_argument("--tries", type=int, help="Dubhe's H tries per round (5)")
    demo.add_argument("--rounds", type=int, help="rounds (default 25; 10)")
    demo.add_argument("--rho", type=float, default=10.0, help="global imbalance ratio")
    demo.add_argument("--emd", type=float, default=1.5, help="average EMD (L1)")
    demo.add_argument("--key-bits", type=int, default=2048, help="Paillier key size")
    demo.add_argument("--seed", type=int, default=0, help="data, model and selection")
    demo.add_argument(
        "--broker", help="use an external broker, mqtt://host:port (default: embedded)"
    )
    demo.add_argument(
        "--methods",
        help="the federation's methods, e.g. dubhe,climb,flicker or random,feddisk "
        "(one selection: dubhe, random; one training: fedavg, climb, feddisk; "
        "optionally flicker); overrides --selection/--weighting/--balance",
    )
    demo.add_argument(
        "--selection", choices=("dubhe", "random"), default="dubhe", help="selection"
    )
    demo.add_argument(
        "--draw",
        choices=("paper", "stratified"),
        default="paper",
        help="Dubhe's volunteer draw: the paper's coins, or stratified (exact "
        "per-category quotas from the key epoch's shared seed)",
    )
    demo.add_argument(
        "--weighting",
        choices=("none", "climb", "feddisk"),
        default="climb",
        help="client weights: none (FedAvg), climb, feddisk (MADE rounds first)",
    )
    demo.add_argument(
        "--made-rounds",
        type=int,
        default=50,
        help="feddisk: at most this many MADE rounds before the classifier's",
    )
    demo.add_argument(
        "--balance",
        choices=("none", "flicker"),
        default="none",
        help="flicker: FLICKER's encrypted imbalance correction before training",
    )
    demo.add_argument("--local-epochs", type=int, default=5, help="epochs per round")
    demo.add_argument("--batch-size", type=int, default=4, help="local batch size")
    demo.add_argument("--lr", type=float, default=0.1, help="local SGD learning rate")
    demo.add_argument(
        "--dual-period", type=int, default=1, help="CLIMB: rounds per dual step"
    )
    demo.add_argument(
        "--eval-every",
        type=int,
        default=5,
        help="federated evaluation every N rounds on the devices' own data (0: off)",
    )
    demo.add_argument(
        "--eval-fraction",
        type=float,
        default=0.2,
        help="each device's samples held out for federated evaluation",
    )
    demo.add_argument(
        "--float16", action="store_true", help="send model deltas as float16"
    )
    demo.add_argument(
        "--aggregation",
        choices=("secure", "plain"),
        default="secure",
        help="sum updates under masks (default) or in the clear (debugging: the "
        "coordinator then sees every update)",
    )
    demo.add_argument(
        "--noise-multiplier",
        type=float,
        default=0.0,
        help="distributed DP on the secure sums: noise std over sensitivity (0: off)",
    )
    demo.add_argument(
        "--processes", type=int, help="device processes (default: one per device)"
    )
    demo.add_argument(
        "--report-dir", type=Path, default=Path("ursa-report"), help="report folder"
    )
    demo.add_argument(
        "--timeout", type=float, default=900.0, help="give up after this many seconds"
    )
    demo.add_argument(
        "--json", action="store_true", help="the final JSON object on stdout"
    )
    demo.add_argument(
        "--http",
        metavar="HOST:PORT",
        nargs="?",
        const=DEFAULT_DEMO_HTTP,
        help="serve the live dashboard, /api/status and /metrics while the "
        f"(training) demo runs (a bare --http: {DEFAULT_DEMO_HTTP})",
    )
    demo.add_argument(
        "--http-token", help="token the HTTP view requires (needed beyond loopback)"
    )
    demo.set_defaults(handler=_run_demo)


def _option(args: argparse.Namespace, name: str) -> int:
    value = getattr(args, name)
    if value is not None:
        return int(value)
    return _DEFAULTS[name][1 if args.selection_only else 0]


def _run_demo(args: argparse.Namespace) -> int:
    if args.selection_only:
        return _run_selection(args)
    from ursa.tools.demo.settings import (
        DemoError,
        TrainingDemoSettings,
        methods_options,
    )
    from ursa.tools.demo.training import run_training_demo

    chosen = {
        "selection": args.selection,
        "weighting": args.weighting,
        "balance": args.balance,
    }
    if args.methods is not None:
        try:
            chosen = methods_options(args.methods)
        except DemoError as exc:
            print(f"ursa demo: {exc}", file=sys.stderr)
            return 2
    settings = TrainingDemoSettings(
        devices=_option(args, "devices"),
        k=_option(args, "k"),
        tries=_option(args, "tries"),
        rounds=_option(args, "rounds"),
        rho=args.rho,
        emd=args.emd,
        selection=chosen["selection"],
        draw="stratified" if args.draw == "stratified" else "paper",
        weighting=chosen["weighting"],
        balance=chosen["balance"],
        key_bits=args.key_bits,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        dual_period=args.dual_period,
        eval_every=args.eval_every,
        eval_fraction=args.eval_fraction,
        made_rounds=args.made_rounds,
        wire_dtype="float16" if args.float16 else "float32",
        aggregation=args.aggregation,
        noise_multiplier=args.noise_multiplier,
        seed=args.seed,
        processes=args.processes,
        report_dir=args.report_dir,
        broker_url=args.broker,
        timeout_s=args.timeout,
        http=args.http,
        http_token=args.http_token,
    )
    try:
        report = run_training_demo(settings, as_json=args.json)
    except DemoError as exc:
        print(f"ursa demo: {exc}", file=sys.stderr)
        return 2
    ok = report["completed"] and bool(report["onnx_check"]["identical"])
    return 0 if ok else 1


def _run_selection(args: argparse.Namespace) -> int:
    from ursa.tools.demo.selection import DemoSettings, run_selection_demo

    if args.http is not None:
        print("ursa demo: --http needs the training demo", file=sys.stderr)
        return 2
    settings = DemoSettings(
        devices=_option(args, "devices"),
        k=_option(args, "k"),
        tries=_option(args, "tries"),
        rounds=_option(args, "rounds"),
        rho=args.rho,
        emd=args.emd,
        key_bits=args.key_bits,
        seed=args.seed,
        broker_url=args.broker,
        draw="stratified" if args.draw == "stratified" else "paper",
    )
    result = run_selection_demo(settings, as_json=args.json)
    return 0 if result["completed"] else 1
