"""`ursa broker ...`: Mosquitto config for operators, and the embedded demo broker.

`ursa broker mosquitto-config` never prints passwords: generated ones go to
`credentials.txt` (mode 0600) in the output directory, because stdout ends up
in terminal scrollback, CI logs and shell pipelines. Hand each device its
line, then delete the file.

Sites (docs/brokers.md): the core broker's config gets a user per site bridge
(`--bridge-user SITE=DEVICES_FILE`); each site broker's config gets a bridge
to the core (`--bridge-to HOST:PORT`), whose password it reads from the
core's credentials.txt (`--bridge-credentials`), never from the command line.
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ursa.tools.broker.bridge import SiteBridge

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
    bridges = cfg.add_argument_group(
        "bridges", "a site broker per group of devices, bridged to a core broker"
    )
    bridges.add_argument(
        "--bridge-user",
        action="append",
        default=[],
        metavar="SITE=DEVICES_FILE",
        help="core broker: a user for site SITE's bridge, allowed to carry the "
        "topics of the devices in DEVICES_FILE (format of --devices-file; "
        "repeatable)",
    )
    bridges.add_argument(
        "--bridge-to",
        metavar="HOST:PORT",
        help="site broker: bridge this broker's devices to the core broker at "
        "HOST:PORT (no coordinator user here)",
    )
    bridges.add_argument(
        "--bridge-name",
        metavar="SITE",
        help="site broker: the bridge's user on the core (its SITE; default the "
        "only user in --bridge-credentials)",
    )
    bridges.add_argument(
        "--bridge-credentials",
        metavar="FILE",
        type=Path,
        help="site broker: a `user:password` file with the bridge's password "
        "(e.g. the core's credentials.txt)",
    )
    bridges.add_argument(
        "--bridge-cafile",
        metavar="CA",
        type=Path,
        help="site broker: the core's ca.crt; the bridge then speaks TLS",
    )
    bridges.add_argument(
        "--bridge-certfile",
        metavar="CERT",
        type=Path,
        help="site broker: client certificate, if the core requires one",
    )
    bridges.add_argument(
        "--bridge-keyfile", type=Path, metavar="KEY", help="its private key"
    )
    cfg.add_argument(
        "--reader", action="append", default=[], help="read-only user (repeatable)"
    )
    cfg.add_argument("--federation", help="confine devices to this federation")
    cfg.add_argument("--port", type=int, help="listener port (1883, 8883 with --tls)")
    cfg.add_argument(
        "--bind", default="127.0.0.1", help="listen address (0.0.0.0: all interfaces)"
    )
    cfg.add_argument(
        "--tls",
        action="store_true",
        help="make a CA and serve TLS (the default for any --bind beyond loopback)",
    )
    cfg.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="a plaintext listener beyond loopback (a lab network only: device "
        "passwords and every message travel in clear)",
    )
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
        help="Mosquitto's persistence location (default: data/ beside the "
        "config, so two brokers on one host never share a database)",
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
    cfg.add_argument(
        "--max-queued-messages",
        type=int,
        help="QoS 1 messages Mosquitto queues per offline client (default 10000)",
    )
    cfg.add_argument(
        "--max-queued-bytes",
        type=int,
        help="the same queue's cap in bytes (default 128 MiB; docs/brokers.md)",
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
    from ursa.protocol.loopback import is_loopback
    from ursa.tools.broker.bridge import BridgeError
    from ursa.tools.broker.mosquitto import (
        DEFAULT_MAX_QUEUED_BYTES,
        DEFAULT_MAX_QUEUED_MESSAGES,
        PERSISTENCE_DIRNAME,
        MosquittoError,
        write_mosquitto_config,
    )

    devices = read_devices(args.devices, args.devices_file)
    if not devices:
        print("error: give --devices and/or --devices-file", file=sys.stderr)
        return 2
    try:
        bridge = _site_bridge(args, tuple(devices))
        bridge_users = _bridge_users(args.bridge_user)
    except (BridgeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    coordinator = None if bridge is not None else args.coordinator_user
    if args.tls and args.insecure_plaintext:
        print("error: --tls and --insecure-plaintext contradict", file=sys.stderr)
        return 2
    beyond_loopback = not is_loopback(args.bind)
    tls = args.tls or (beyond_loopback and not args.insecure_plaintext)
    if beyond_loopback and not tls:
        print(
            f"WARNING: a plaintext listener on {args.bind} (--insecure-plaintext): "
            "device passwords and every message cross the network in clear",
            file=sys.stderr,
        )
    elif tls and not args.tls:
        print(
            f"TLS: on, since --bind {args.bind} is beyond loopback "
            "(--insecure-plaintext for a lab network)",
        )
    try:
        files = write_mosquitto_config(
            args.out,
            devices=devices,
            coordinator_user=coordinator,
            readers=args.reader,
            bridge_users=bridge_users,
            bridge=bridge,
            federation=args.federation,
            port=args.port or (8883 if tls else 1883),
            bind=args.bind,
            tls=tls,
            tls_hostnames=args.hostname or _default_hostnames(args.bind),
            install_dir=args.install_dir,
            persistence_dir=None
            if args.no_persistence
            else args.persistence_dir
            or (args.install_dir or args.out.resolve()) / PERSISTENCE_DIRNAME,
            log_dest=args.log_dest,
            max_queued_messages=args.max_queued_messages or DEFAULT_MAX_QUEUED_MESSAGES,
            max_queued_bytes=args.max_queued_bytes or DEFAULT_MAX_QUEUED_BYTES,
            run_as_user=args.user,
            overwrite=args.force,
            rotate=[
                *args.rotate,
                *([coordinator] if args.rotate_coordinator and coordinator else []),
            ],
            rotate_tls=args.rotate_tls,
        )
    except MosquittoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {files.config_file}, {files.password_file}, {files.acl_file}")
    if coordinator is not None:
        print(f"users: {len(devices)} devices, {coordinator!r} (coordinator)")
    else:
        print(f"users: {len(devices)} devices (site broker: no coordinator)")
    for site, site_devices in bridge_users.items():
        print(f"site bridge user {site!r}: carries {len(site_devices)} devices")
    if bridge is not None:
        print(
            f"bridge {bridge.name!r} to {bridge.host}:{bridge.port} "
            f"({'TLS' if bridge.ca_file else 'no TLS'}): its password is in "
            f"{args.out / 'bridge' / 'bridge.conf'} (mode 0600)"
        )
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


def _bridge_users(specs: list[str]) -> dict[str, tuple[str, ...]]:
    """Parse `--bridge-user SITE=DEVICES_FILE` options."""
    from ursa.tools.broker.bridge import BridgeError, check_name

    found: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        site, sep, path = spec.partition("=")
        if not sep or not path:
            raise BridgeError(f"--bridge-user wants SITE=DEVICES_FILE, got {spec!r}")
        devices = tuple(read_devices("", Path(path)))
        if not devices:
            raise BridgeError(f"{path} lists no devices for site {site!r}")
        if check_name(site, "site name") in found:
            raise BridgeError(f"site {site!r} given twice")
        found[site] = devices
    return found


def _default_hostnames(bind: str) -> list[str]:
    """The names the certificate covers without --hostname.

    Loopback, this host's name, and the bind address when it is one: devices
    must reach the broker by one of them.
    """
    names = ["localhost", "127.0.0.1", socket.gethostname()]
    if bind not in ("0.0.0.0", "::", "") and bind not in names:
        names.append(bind)
    return names


def _site_bridge(
    args: argparse.Namespace, devices: tuple[str, ...]
) -> SiteBridge | None:
    """The `--bridge-*` options as a SiteBridge (None without --bridge-to)."""
    from ursa.tools.broker.bridge import BridgeError, SiteBridge, parse_address

    extra = [
        args.bridge_name,
        args.bridge_credentials,
        args.bridge_cafile,
        args.bridge_certfile,
        args.bridge_keyfile,
    ]
    if args.bridge_to is None:
        if any(x is not None for x in extra):
            raise BridgeError("the --bridge-* options of a site need --bridge-to")
        return None
    if args.bridge_credentials is None:
        raise BridgeError("--bridge-to needs --bridge-credentials (user:password)")
    host, port = parse_address(args.bridge_to)
    known = {
        user: password
        for user, sep, password in (
            line.partition(":")
            for line in args.bridge_credentials.read_text().splitlines()
        )
        if sep and user.strip()
    }
    name = args.bridge_name
    if name is None:
        if len(known) != 1:
            raise BridgeError(
                f"{args.bridge_credentials} has {len(known)} users: "
                "say which with --bridge-name"
            )
        (name,) = known
    if name not in known:
        raise BridgeError(f"no password for {name!r} in {args.bridge_credentials}")
    return SiteBridge(
        name=name,
        host=host,
        port=port,
        password=known[name],
        devices=devices,
        ca_file=args.bridge_cafile,
        cert_file=args.bridge_certfile,
        key_file=args.bridge_keyfile,
    )


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
