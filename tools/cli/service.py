"""`ursa coordinator serve` and `ursa device run`: the real service and device.

Both read a TOML/JSON config (``--config``) with ``URSA_*`` environment
overrides (secrets such as ``URSA_BROKER__PASSWORD`` belong there, not in the
file), stop cleanly on SIGTERM/SIGINT, and log to stderr. Also runnable as
``python -m ursa.tools.cli.service coordinator serve --config FILE``.

Both are built by `ursa.tools.compose` from their ``[[methods]]`` and
``[training]`` sections (initial weights come from `ursa model init`), the
same way the demo, the benchmarks and the integration tests build theirs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ursa.protocol.connect import ConnectAbortedError
from ursa.protocol.transport import TransportError
from ursa.tools.cli import model
from ursa.tools.cli.logs import LOG_FORMATS, configure_logging
from ursa.tools.compose import ServiceSetupError, build_coordinator, build_device

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa coordinator serve`, `ursa device run` and `ursa model init`."""
    coordinator = sub.add_parser("coordinator", help="the coordinator service")
    commands = coordinator.add_subparsers(dest="coordinator_command", required=True)
    serve = commands.add_parser("serve", help="run the coordinator (SIGTERM stops)")
    serve.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    serve.add_argument(
        "--keep-running",
        action="store_true",
        help="keep serving enrolments after the configured rounds are done",
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve the dashboard, /api/status and /metrics here (e.g. "
        "127.0.0.1:9464; default: [http] listen, else off)",
    )
    serve.add_argument(
        "--http-token",
        help="token the HTTP view requires (needed beyond loopback; better: "
        "[http] token or URSA_HTTP__TOKEN)",
    )
    serve.set_defaults(handler=_serve, default_log_level="INFO")

    device = sub.add_parser("device", help="a device process")
    device_commands = device.add_subparsers(dest="device_command", required=True)
    run = device_commands.add_parser("run", help="run one device until stopped")
    run.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    run.add_argument(
        "--labels", type=Path, help="labels file (.npy, .txt, .csv); else labels_file"
    )
    run.set_defaults(handler=_device_run, default_log_level="INFO")
    repin = device_commands.add_parser(
        "repin",
        help="forget the pinned coordinator (it was replaced): the next one is pinned",
    )
    repin.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    repin.set_defaults(handler=_device_repin)
    model.register(sub)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def _serve(args: argparse.Namespace) -> int:
    from ursa.coordinator.config import load_coordinator_config

    config = load_coordinator_config(args.config, os.environ)
    try:
        service = build_coordinator(config)
    except ServiceSetupError as exc:
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 2
    listen = args.http or config.http.listen
    token = args.http_token or (
        config.http.token.get_secret_value() if config.http.token else None
    )
    view = None
    if listen:
        from ursa.tools.observe.server import ObserveConfigError, observe_service

        try:
            view = observe_service(service, listen, token=token)
        except ObserveConfigError as exc:
            print(f"ursa coordinator serve: {exc}", file=sys.stderr)
            return 2
    stop = _stop_on_signals()
    try:
        service.run(stop, until_done=not args.keep_running)
    except ConnectAbortedError:
        return 0  # stopped while waiting for the broker
    except TransportError as exc:  # a refusal: credentials, ACL
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if view is not None:
            view.stop()
    return 0


def _device_run(args: argparse.Namespace) -> int:
    from ursa.edge_sdk.config import load_device_config

    config = load_device_config(args.config, os.environ)
    try:
        client = build_device(config, args.labels)
    except ValueError as exc:
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 2
    try:
        client.run(_stop_on_signals())
    except ConnectAbortedError:
        return 0  # stopped while waiting for the broker
    except TransportError as exc:  # a refusal: credentials, ACL
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 1
    return 0


def _device_repin(args: argparse.Namespace) -> int:
    """Drop the old coordinator's pin and run state; keep the device's identity."""
    from ursa.edge_sdk.config import load_device_config
    from ursa.edge_sdk.state import DeviceStateDir

    config = load_device_config(args.config, os.environ)
    state = DeviceStateDir(config.state_dir)
    old = state.load_coordinator()
    removed = state.forget_coordinator()
    if old is None:
        print(f"{config.device_id}: no coordinator was pinned")
    else:
        print(f"{config.device_id}: forgot coordinator {old.fingerprint()}")
    print(f"removed: {', '.join(removed) or 'nothing'}; identity kept")
    if config.coordinator_fingerprint is not None:
        print(
            "coordinator_fingerprint is set in the config: replace it with the new "
            "coordinator's (its state dir's coordinator.pub), or remove it"
        )
    print("start the device again: it pins the coordinator that answers first")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run these subcommands without the full `ursa` CLI (``python -m``)."""
    parser = argparse.ArgumentParser(prog="ursa")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
