"""`ursa coordinator serve` and `ursa device run`: the real service and device.

Both read a TOML/JSON config (``--config``) with ``URSA_*`` environment
overrides (secrets such as ``URSA_BROKER__PASSWORD`` belong there, not in the
file), stop cleanly on SIGTERM/SIGINT, and log to stderr. Also runnable as
``python -m ursa.tools.cli.service coordinator serve --config FILE``.

``ursa coordinator serve`` on a finished store exits 3 and names ``ursa
coordinator new-run``, which archives the run and opens a new one on the same
state dir (`ursa.coordinator.run_archive`). ``ursa device run`` exits 0 at
the end of the federation (the final model saved); with ``--keep-running`` it
stays connected and follows the coordinator's next run (each run's final
model replaces the last); with ``--infer`` it also serves that model
(`ursa.tools.cli.infer`: samples on stdin, classes on stdout).

Both are built by `ursa.tools.compose` from their ``[[methods]]`` and
``[training]`` sections (initial weights come from `ursa model init`), the
same way the demo, the benchmarks and the integration tests build theirs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ursa.coordinator.run_archive import NewRunError, finished_round, start_new_run
from ursa.crypto.errors import UntrustedIdentityError
from ursa.protocol.connect import ConnectAbortedError
from ursa.protocol.transport import TransportError
from ursa.tools.cli import fleet, model
from ursa.tools.cli.config_load import ConfigError
from ursa.tools.cli.logs import LOG_FORMATS, configure_logging
from ursa.tools.compose import ServiceSetupError, build_coordinator, build_device

if TYPE_CHECKING:
    from ursa.coordinator.config import HttpConfig
    from ursa.coordinator.service import CoordinatorService
    from ursa.edge_sdk.client import EdgeClient
    from ursa.tools.observe.server import ObserveServer

    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

logger = logging.getLogger("ursa.cli")


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
    serve.add_argument(
        "--http-tls",
        nargs=2,
        type=Path,
        metavar=("CERT", "KEY"),
        help="serve the HTTP view over HTTPS with this PEM certificate and "
        "unencrypted key (default: [http] tls_cert, tls_key)",
    )
    serve.add_argument(
        "--http-allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the HTTP view is reached by (its Host header), besides IP "
        "literals, localhost and the listen host; repeatable, added to "
        "[http] allowed_hosts",
    )
    serve.set_defaults(handler=_serve, default_log_level="INFO", leave=True)
    new_run = commands.add_parser(
        "new-run",
        help="archive the finished run and start a new one on the same state dir "
        "(identity, enrolled devices and trust kept)",
    )
    new_run.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    new_run.add_argument(
        "--abandon",
        action="store_true",
        help="also end a run whose federation is not finished (stop it first)",
    )
    new_run.set_defaults(handler=_new_run)
    fleet.register_coordinator(commands)

    device = sub.add_parser("device", help="a device process")
    device_commands = device.add_subparsers(dest="device_command", required=True)
    run = device_commands.add_parser("run", help="run one device until stopped")
    run.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    run.add_argument(
        "--labels", type=Path, help="labels file (.npy, .txt, .csv); else labels_file"
    )
    run.add_argument(
        "--keep-running",
        action="store_true",
        help="stay connected after the end of the federation and take part in "
        "the coordinator's next run (`ursa coordinator new-run`)",
    )
    run.add_argument(
        "--infer",
        action="store_true",
        help="also serve the final model: samples on stdin (one per line), "
        "predicted classes on stdout; end of input stops the device",
    )
    run.set_defaults(handler=_device_run, default_log_level="INFO", leave=True)
    repin = device_commands.add_parser(
        "repin",
        help="forget the pinned coordinator (it was replaced): the next one is pinned",
    )
    repin.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    repin.set_defaults(handler=_device_repin)
    fleet.register_device(device_commands)
    model.register(sub)


def _stop_on_signals(who: str) -> tuple[threading.Event, threading.Thread]:
    """An event SIGTERM and SIGINT set; ``<who>: stopping (SIGTERM)`` is logged.

    The line comes from a watcher thread, not the handler (a handler that
    logs could wait on a lock the interrupted code holds); `_stopped` waits
    for it, so ``stopping`` always comes before ``stopped``.
    """
    stop = threading.Event()
    received: list[str] = []

    def handle(signum: int, frame: object) -> None:
        received.append(signal.Signals(signum).name)
        stop.set()

    def say() -> None:
        stop.wait()
        if received:
            logger.info("%s: stopping (%s)", who, received[0])

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    watcher = threading.Thread(target=say, name="ursa-stop-note", daemon=True)
    watcher.start()
    return stop, watcher


def _stopped(stop: threading.Event, watcher: threading.Thread, line: str) -> None:
    """Log ``line`` after the watcher's ``stopping`` line, if a signal stopped us."""
    if not stop.is_set():
        return
    watcher.join(1.0)
    logger.info("%s", line)


def _serve(args: argparse.Namespace) -> int:
    stop, watcher = _stop_on_signals("coordinator")  # first: SIGTERM at start exits 0
    from ursa.crypto.paillier_keys import MIN_SECURE_KEY_BITS

    config = fleet.coordinator_config(args.config)
    if config.key_bits < MIN_SECURE_KEY_BITS and not config.insecure_test_keys:
        print(
            f"ursa coordinator serve: key_bits = {config.key_bits} is below "
            f"{MIN_SECURE_KEY_BITS} (such a modulus can be factored); devices "
            "refuse it too. Set insecure_test_keys = true for a test only.",
            file=sys.stderr,
        )
        return 2
    if config.key_bits < MIN_SECURE_KEY_BITS:
        logging.getLogger("ursa.coordinator").warning(
            "insecure_test_keys: %d-bit Paillier keys; never in a field trial",
            config.key_bits,
        )
    finished = None if args.keep_running else finished_round(config.state_dir)
    if finished is not None:
        print(
            f"ursa coordinator serve: federation finished at round {finished}; "
            "start a new run with `ursa coordinator new-run --config "
            f"{args.config}` (or serve it with --keep-running)",
            file=sys.stderr,
        )
        return 3
    try:
        service = build_coordinator(config)
    except ServiceSetupError as exc:
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 2
    if stop.is_set():
        return 0
    view = None
    listen = args.http or config.http.listen
    if listen:
        from ursa.tools.observe.server import ObserveConfigError

        try:
            view = _observe(service, listen, config.http, args)
        except ObserveConfigError as exc:
            print(f"ursa coordinator serve: {exc}", file=sys.stderr)
            return 2
    try:
        service.run(stop, until_done=not args.keep_running)
        _stopped(stop, watcher, "coordinator: stopped")
    except ConnectAbortedError:
        return 0  # stopped while waiting for the broker
    except UntrustedIdentityError as exc:  # its certificate: a restart cannot fix
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 2
    except TransportError as exc:  # a refusal: credentials, ACL
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 1
    finally:
        if view is not None:
            view.stop()
    return 0


def _new_run(args: argparse.Namespace) -> int:
    """`ursa coordinator new-run`: archive the run, open a new one (`run_archive`)."""
    config = fleet.coordinator_config(args.config)
    default_final = config.final_model_dir is None
    try:
        made = start_new_run(
            config.state_dir,
            final_dir=config.state_dir / "final" if default_final else None,
            abandon=args.abandon,
        )
    except NewRunError as exc:
        print(f"ursa coordinator new-run: {exc}", file=sys.stderr)
        return 1
    print(
        f"new run {made.new_run} in {config.state_dir} ({made.devices} enrolled "
        f"devices kept; run {made.old_run} archived in {made.archive})"
    )
    print(
        f"start it with `ursa coordinator serve --config {args.config}`: running "
        "devices join it by themselves"
    )
    return 0


def _observe(
    service: CoordinatorService,
    listen: str,
    http: HttpConfig,
    args: argparse.Namespace,
) -> ObserveServer:
    """The HTTP view on ``listen``, started: ``--http*`` flags over ``[http]``.

    Raises:
        ObserveConfigError: it may not start as configured.
    """
    from ursa.tools.observe.server import TlsFiles, observe_service

    token = args.http_token or (http.token.get_secret_value() if http.token else None)
    cert, key = args.http_tls or (http.tls_cert, http.tls_key)
    return observe_service(
        service,
        listen,
        token=token,
        allowed_hosts=(*http.allowed_hosts, *args.http_allowed_host),
        tls=TlsFiles(cert, key) if cert is not None and key is not None else None,
    )


def _device_run(args: argparse.Namespace) -> int:
    stop, watcher = _stop_on_signals("device")  # first: SIGTERM in torch import exits 0
    config = fleet.device_config(args.config)
    try:
        client = build_device(config, args.labels)
    except ValueError as exc:
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 2
    if stop.is_set():
        return 0
    try:
        if args.infer:
            return _run_and_infer(client, stop)
        logger.info(
            "device %s: federation %s, methods %s, broker %s, state %s",
            config.device_id,
            config.federation,
            ", ".join(m.kind for m in config.method_list()),
            config.broker.address(),
            config.state_dir,
        )
        client.run(stop, until_finished=not args.keep_running)
        _stopped(stop, watcher, f"device {config.device_id}: stopped")
    except ConnectAbortedError:
        return 0  # stopped while waiting for the broker
    except UntrustedIdentityError as exc:  # its certificate: a restart cannot fix
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 2
    except TransportError as exc:  # a refusal: credentials, ACL
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 1
    finally:
        _ignore_signals()
    return 0


def _ignore_signals() -> None:
    """Already on the way out: a late SIGTERM must not turn exit 0 into -15.

    The interpreter restores the default handlers while it finalises (slow
    after torch was imported for the ONNX export); a stop asked for then
    has nothing left to stop.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_and_infer(client: EdgeClient, stop: threading.Event) -> int:
    """Take part in a thread; answer stdin's samples with the final model."""
    from ursa.edge_sdk.federation_end import ONNX_FILENAME
    from ursa.tools.cli.infer import ModelWatch, serve_lines

    failed: list[str] = []

    def participate() -> None:
        try:
            client.run(stop, until_finished=False)
        except ConnectAbortedError:
            pass
        except TransportError as exc:
            failed.append(str(exc))
            stop.set()

    thread = threading.Thread(target=participate, name="ursa-device", daemon=True)
    thread.start()
    watch = ModelWatch(client.final_dir / ONNX_FILENAME)
    try:
        serve_lines(
            sys.stdin, watch, sys.stdout, sys.stderr, ready=client.finished, stop=stop
        )
    finally:
        stop.set()
        thread.join(10)
    if failed:
        print(f"ursa device run: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def _device_repin(args: argparse.Namespace) -> int:
    """Drop the old coordinator's pin and run state; keep the device's identity."""
    from ursa.edge_sdk.state_dir import DeviceStateDir

    config = fleet.device_config(args.config)
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
    try:
        code: int = args.handler(args)
    except ConfigError as exc:
        print(f"ursa: config error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    from ursa.tools.cli.leave import leave

    leave(main())
