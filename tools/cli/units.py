"""`ursa service units`: systemd units for the coordinator, devices and Mosquitto.

Writes `ursa-coordinator.service`, the template `ursa-device@.service` (one
instance per device id: `ursa-device@dev001`) and `ursa-mosquitto.service`
(on the config `ursa broker mosquitto-config` wrote; its persistence and log
directories are read from it when it is on this host). Paths are those of the
target host; the defaults follow docs/install.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa service units`."""
    service = sub.add_parser("service", help="run ursa under systemd")
    commands = service.add_subparsers(dest="service_command", required=True)
    units = commands.add_parser(
        "units",
        help="write systemd units for the coordinator, devices and Mosquitto",
        description="Write ursa-coordinator.service, ursa-device@.service and "
        "ursa-mosquitto.service: dedicated users, Restart=on-failure, hardening.",
    )
    units.add_argument("--out", type=Path, required=True, help="output directory")
    units.add_argument(
        "--ursa",
        help="the ursa executable on the target (default: this one)",
    )
    units.add_argument(
        "--user",
        default="ursa",
        help="the coordinator's user (default ursa); devices get dynamic users",
    )
    units.add_argument(
        "--config-dir",
        default="/etc/ursa",
        help="coordinator.toml, device-ID.toml and their .env files",
    )
    units.add_argument(
        "--state-dir",
        default="/var/lib/ursa",
        help="parent of each service's own state directory: coordinator/, "
        "device-ID/ (default /var/lib/ursa)",
    )
    units.add_argument("--mosquitto", help="mosquitto executable (default: found)")
    units.add_argument("--broker-user", default="mosquitto")
    units.add_argument(
        "--broker-config",
        default="/etc/ursa/broker/mosquitto.conf",
        help="the generated mosquitto.conf on the broker host",
    )
    units.add_argument(
        "--force", action="store_true", help="overwrite existing unit files"
    )
    units.set_defaults(handler=_run_units)


def _run_units(args: argparse.Namespace) -> int:
    from ursa.tools.systemd_units import (
        BrokerPaths,
        UnitSettings,
        broker_paths,
        coordinator_state_dir,
        device_state_dir,
        render_units,
    )

    broker = BrokerPaths()
    try:
        broker = broker_paths(Path(args.broker_config).read_text())
    except OSError:
        print(
            f"note: {args.broker_config} not readable here; Mosquitto may write "
            f"{', '.join(broker.writable)} (edit ReadWritePaths= if not)",
            file=sys.stderr,
        )
    settings = UnitSettings(
        ursa=PurePosixPath(args.ursa or _this_ursa()),
        user=args.user,
        config_dir=PurePosixPath(args.config_dir),
        state_dir=PurePosixPath(args.state_dir),
        mosquitto=PurePosixPath(args.mosquitto or _mosquitto()),
        broker_user=args.broker_user,
        broker_config=PurePosixPath(args.broker_config),
        broker=broker,
    )
    try:
        units = render_units(settings)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    clash = [name for name in units if (args.out / name).exists()]
    if clash and not args.force:
        print(f"error: {args.out} already has {clash}; pass --force", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        (args.out / name).write_text(text)
        (args.out / name).chmod(0o644)
    print(f"wrote {', '.join(units)} to {args.out}")
    print(
        f"state: the coordinator config's state_dir = "
        f"{coordinator_state_dir(settings)}, each device's = "
        f"{device_state_dir(settings, 'ID')} (one per instance, its own user)"
    )
    print(
        f"install: copy them to /etc/systemd/system, create the coordinator's "
        f"user (`useradd --system --home-dir {args.state_dir} --shell "
        f"/usr/sbin/nologin {args.user}`), then `systemctl daemon-reload && "
        "systemctl enable --now ursa-mosquitto ursa-coordinator` or "
        "`ursa-device@ID`"
    )
    return 0


def _this_ursa() -> str:
    """This environment's `ursa` (next to the interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "ursa"
    if beside.exists():
        return str(beside.absolute())
    return shutil.which("ursa") or "/usr/local/bin/ursa"


def _mosquitto() -> str:
    from ursa.tools.broker.mosquitto import find_mosquitto

    found = find_mosquitto()
    return str(found) if found is not None else "/usr/sbin/mosquitto"
