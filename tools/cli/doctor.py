"""`ursa doctor`: check what a field install needs; exit 1 with a one-line reason.

The checks live in `ursa.tools.doctor` (pure functions over gathered facts);
this module reads the config, runs the probes, and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ursa.protocol.mqtt_config import MqttConfig
    from ursa.tools.doctor import Finding, Needs

    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

_MARKS = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}


def register(sub: Subparsers) -> None:
    """Attach `ursa doctor`."""
    doctor = sub.add_parser(
        "doctor",
        help="check this install: Python, machine, memory, extras, broker, clock",
        description="Check what a field install needs. Exits 1 with a one-line "
        "reason on a blocking problem (Python < 3.10, broker unreachable, an "
        "extra the config needs); warnings do not fail.",
    )
    doctor.add_argument(
        "--config",
        type=Path,
        help="device or coordinator TOML/JSON (its broker, training, methods)",
    )
    doctor.add_argument("--host", help="broker host (overrides the config's)")
    doctor.add_argument("--port", type=int, help="broker port (overrides the config's)")
    doctor.add_argument(
        "--tls", action="store_true", help="with --host and no config: use TLS"
    )
    doctor.add_argument("--ca-file", type=Path, help="with --tls: the broker's CA")
    doctor.add_argument(
        "--login",
        action="store_true",
        help="log in as the config's device (a running device is disconnected "
        "for a moment; its queued messages are kept). Default: anonymous probe",
    )
    doctor.add_argument(
        "--timeout", type=float, default=5.0, help="broker timeout in seconds"
    )
    doctor.add_argument(
        "--no-imports",
        action="store_true",
        help="do not import the extras (in subprocesses) to time and check them",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    doctor.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from ursa.tools import doctor
    from ursa.tools.cli.config_load import ConfigError

    try:
        needs, mqtt = _read_config(args)
    except (OSError, ValueError, ConfigError) as exc:  # no secret in any of them
        print(f"ursa doctor: config: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    host = doctor.gather_host_facts(import_modules=not args.no_imports)
    broker = None if mqtt is None else doctor.probe_broker(mqtt, login=args.login)
    findings = doctor.run_checks(host, needs, broker)
    reason = doctor.blocking_reason(findings)
    if args.json:
        print(doctor.findings_json(findings, host, broker))
    else:
        _print(findings)
    if reason is not None:
        print(f"ursa doctor: {reason}", file=sys.stderr)
        return 1
    return 0


def _print(findings: list[Finding]) -> None:
    width = max(len(f.check) for f in findings)
    for finding in findings:
        mark = _MARKS[str(finding.status)]
        print(f"{mark}  {finding.check:<{width}}  {finding.summary}")


def _config_needs(path: Path) -> tuple[Needs, MqttConfig]:
    """What a device's or the coordinator's config needs, and its broker login.

    A file without ``device_id`` is the coordinator's (its broker user logs in
    with ``--login``); either is read with its own service's checks.
    """
    from ursa.protocol.config_file import read_config_file
    from ursa.protocol.messages import COORDINATOR
    from ursa.tools.cli.fleet import coordinator_config, device_config
    from ursa.tools.doctor import Needs

    if "device_id" in read_config_file(path):
        device = device_config(path)
        kinds = {method.kind for method in device.method_list()}
        needs = Needs(trains=device.training is not None, ckks="flicker" in kinds)
        return needs, device.broker.mqtt_config(device.device_id)
    coordinator = coordinator_config(path)
    kinds = {method.kind for method in coordinator.methods}
    needs = Needs(trains=coordinator.training is not None, ckks="flicker" in kinds)
    return needs, coordinator.broker.mqtt_config(COORDINATOR)


def _read_config(args: argparse.Namespace) -> tuple[Needs, MqttConfig | None]:
    """What the config needs and how to reach its broker (None: no broker given)."""
    from ursa.protocol.mqtt_config import MqttConfig
    from ursa.tools.doctor import Needs

    needs = Needs()
    mqtt: MqttConfig | None = None
    if args.config is not None:
        needs, mqtt = _config_needs(args.config)
    elif args.host is not None:
        mqtt = MqttConfig(
            host=args.host,
            port=args.port or (8883 if args.tls else 1883),
            client_id="ursa-doctor",
            tls=args.tls,
            tls_ca_file=args.ca_file,
        )
    if mqtt is None:
        if args.port is not None or args.login:
            raise ValueError("--port and --login need --host or --config")
        return needs, None
    if args.login and mqtt.username is None:
        raise ValueError("--login needs a username: the config's [broker] username")
    update: dict[str, object] = {"timeout_s": args.timeout}
    if args.host is not None:
        update["host"] = args.host
    if args.port is not None:
        update["port"] = args.port
    return needs, mqtt.model_copy(update=update)
