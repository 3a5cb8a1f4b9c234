"""`ursa broker ...`: Mosquitto config for operators, and the embedded demo broker.

`ursa broker mosquitto-config` never prints passwords: generated ones go to
`credentials.txt` (mode 0600) in the output directory, because stdout ends up
in terminal scrollback, CI logs and shell pipelines. Hand each device its
line, then delete the file.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa broker mosquitto-config` and `ursa broker run-embedded`."""
    broker = sub.add_parser("broker", help="MQTT broker setup")
    names = broker.add_subparsers(dest="broker_command", required=True)

    cfg = names.add_parser(
        "mosquitto-config",
        help="write mosquitto.conf, password file and ACL (optionally TLS)",
        description="Write a Mosquitto config in which every device (username = "
        "client id = device id) may publish and read only its own subtree.",
    )
    cfg.add_argument("--out", type=Path, required=True, help="output directory")
    cfg.add_argument("--devices", default="", help="comma-separated device ids")
    cfg.add_argument(
        "--devices-file",
        type=Path,
        help="one device per line: `id` or `id:password` (# starts a comment)",
    )
    cfg.add_argument("--coordinator-user", default="coordinator")
    cfg.add_argument(
        "--reader", action="append", default=[], help="read-only user (repeatable)"
    )
    cfg.add_argument("--federation", help="confine devices to this federation")
    cfg.add_argument("--port", type=int, help="listener port (1883, 8883 with --tls)")
    cfg.add_argument(
        "--bind", default="127.0.0.1", help="listen address (0.0.0.0: all interfaces)"
    )
    cfg.add_argument("--tls", action="store_true", help="make a CA and serve TLS")
    cfg.add_argument(
        "--hostname",
        action="append",
        help="name or IP in the TLS certificate (repeatable; default localhost)",
    )
    cfg.add_argument(
        "--install-dir", type=Path, help="where the files will live on the broker"
    )
    cfg.add_argument(
        "--user",
        default="mosquitto",
        help="system user Mosquitto runs as; owns passwd, acl, the TLS key, the "
        "persistence and log directories (default mosquitto)",
    )
    cfg.add_argument(
        "--persistence-dir",
        type=Path,
        help="Mosquitto's persistence location (default /var/lib/mosquitto, "
        "which Debian's package gives to the mosquitto user)",
    )
    cfg.add_argument(
        "--no-persistence",
        action="store_true",
        help="no persistence: queued messages die with the broker",
    )
    cfg.add_argument(
        "--log-dest",
        help="stderr (Mosquitto's default; the journal under systemd), syslog, "
        "none or file:/var/log/mosquitto/ursa.log",
    )
    cfg.add_argument(
        "--force",
        action="store_true",
        help="update existing files: listed users keep their passwords, "
        "unlisted ones are removed, only --rotate* makes new secrets",
    )
    cfg.add_argument(
        "--rotate",
        action="append",
        default=[],
        metavar="USER",
        help="give this device (or reader) a new password (repeatable; with --force)",
    )
    cfg.add_argument(
        "--rotate-coordinator",
        action="store_true",
        help="give the coordinator a new password",
    )
    cfg.add_argument(
        "--rotate-tls",
        action="store_true",
        help="make a new CA and server certificate (every device needs the new ca.crt)",
    )
    cfg.set_defaults(handler=_run_mosquitto_config)

    embedded = names.add_parser(
        "run-embedded",
        help="run the embedded amqtt broker (anonymous, no ACL: local demo only)",
    )
    embedded.add_argument("--host", default="127.0.0.1")
    embedded.add_argument("--port", type=int, default=1883)
    embedded.set_defaults(handler=_run_embedded)


def read_devices(devices: str, devices_file: Path | None) -> dict[str, str | None]:
    """Collect device ids (and optional passwords) from the two CLI options."""
    found: dict[str, str | None] = {d.strip(): None for d in devices.split(",")}
    if devices_file is not None:
        for raw in devices_file.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line:
                device, sep, password = line.partition(":")
                found[device.strip()] = password if sep else None
    found.pop("", None)
    return found


def _run_mosquitto_config(args: argparse.Namespace) -> int:
    from ursa.tools.broker.mosquitto import (
        DEFAULT_PERSISTENCE_DIR,
        MosquittoError,
        write_mosquitto_config,
    )

    devices = read_devices(args.devices, args.devices_file)
    if not devices:
        print("error: give --devices and/or --devices-file", file=sys.stderr)
        return 2
    try:
        files = write_mosquitto_config(
            args.out,
            devices=devices,
            coordinator_user=args.coordinator_user,
            readers=args.reader,
            federation=args.federation,
            port=args.port or (8883 if args.tls else 1883),
            bind=args.bind,
            tls=args.tls,
            tls_hostnames=args.hostname or ["localhost", "127.0.0.1"],
            install_dir=args.install_dir,
            persistence_dir=None
            if args.no_persistence
            else args.persistence_dir or DEFAULT_PERSISTENCE_DIR,
            log_dest=args.log_dest,
            run_as_user=args.user,
            overwrite=args.force,
            rotate=[
                *args.rotate,
                *([args.coordinator_user] if args.rotate_coordinator else []),
            ],
            rotate_tls=args.rotate_tls,
        )
    except MosquittoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {files.config_file}, {files.password_file}, {files.acl_file}")
    print(f"users: {len(devices)} devices, {args.coordinator_user!r} (coordinator)")
    if files.kept:
        print(f"kept existing passwords: {', '.join(files.kept)}")
    if files.removed:
        print(f"removed users: {', '.join(files.removed)}")
    if files.credentials_file is not None:
        print(
            f"generated passwords: {files.credentials_file} (mode 0600); give each "
            "device its line, then delete the file"
        )
    if files.tls_ca_file is not None:
        print(
            f"TLS: give devices {files.tls_ca_file}; move "
            f"{files.tls_ca_file.with_name('ca.key')} offline"
        )
    home = args.install_dir or args.out.resolve()
    if files.root_commands:
        print(f"then, as root on the broker host (files owned by {args.user!r}):")
        print("  sudo sh -c " + shlex.quote(" && ".join(files.root_commands)))
    print(
        f"run: mosquitto -c {home / 'mosquitto.conf'} (as root it drops to "
        f"{args.user!r}), "
        "or `ursa service units` for systemd"
    )
    return 0


def _run_embedded(args: argparse.Namespace) -> int:
    from ursa.tools.broker.embedded import EmbeddedBroker, EmbeddedBrokerError

    try:
        broker = EmbeddedBroker(args.host, args.port).start()
    except EmbeddedBrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"embedded MQTT broker on {broker.url}: anonymous, no ACL (demo only)")
    print("Ctrl-C stops it", flush=True)
    interrupted = False
    try:
        while broker.is_running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        broker.stop()
    return 0 if interrupted else 1  # the broker thread died
