r"""Operating a fleet: `ursa coordinator status|enrol|revoke`, `ursa device identity`.

Pinned enrolment, end to end::

    ursa device identity --config device.toml        # on the device: id, fingerprint
    ursa coordinator enrol --config coordinator.toml --device dev001 \
        --fingerprint 0123...                        # on the coordinator's host
    ursa device run --config device.toml             # the device joins

``enrol`` and ``revoke`` write the coordinator's ``enrolment.json``
(`ursa.coordinator.enrolment_list`), never the operator's config file; a
running coordinator admits a newly enrolled device at its next Hello and
refuses a revoked device's Hello at once, forgets a revoked device's
enrolment at its next tick and, if the device holds the current key epoch's
key, starts a new key epoch without it before the next round. ``status``
reads the store read-only (`ursa.coordinator.status`), so it may run beside
a working coordinator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ursa.tools.cli.config_load import load_config

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.enrolment_list import EnrolmentList
    from ursa.coordinator.status import FederationStatus
    from ursa.edge_sdk.config import DeviceConfig

    Commands = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "coordinator_config",
    "device_config",
    "register_coordinator",
    "register_device",
]


def coordinator_config(path: Path) -> CoordinatorConfig:
    """The coordinator's config, or a `ConfigError` saying what is wrong."""
    from ursa.coordinator.config import CoordinatorConfig, load_coordinator_config

    return load_config(CoordinatorConfig, load_coordinator_config, path, os.environ)


def device_config(path: Path) -> DeviceConfig:
    """The device's config, or a `ConfigError` saying what is wrong."""
    from ursa.edge_sdk.config import DeviceConfig, load_device_config

    return load_config(DeviceConfig, load_device_config, path, os.environ)


def register_coordinator(commands: Commands) -> None:
    """Attach ``status``, ``enrol`` and ``revoke`` to ``ursa coordinator``."""
    status = commands.add_parser(
        "status", help="stage, epoch, round, devices, recent errors (read-only)"
    )
    status.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument(
        "--errors", type=int, default=10, help="recent errors shown (default 10)"
    )
    status.set_defaults(handler=_status)
    enrol = commands.add_parser("enrol", help="pin a device's identity fingerprint")
    enrol.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    enrol.add_argument("--device", required=True, help="the device id")
    enrol.add_argument(
        "--fingerprint", required=True, help="from `ursa device identity`"
    )
    enrol.set_defaults(handler=_enrol)
    revoke = commands.add_parser("revoke", help="refuse a device from now on")
    revoke.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    revoke.add_argument("--device", required=True, help="the device id")
    revoke.set_defaults(handler=_revoke)


def register_device(commands: Commands) -> None:
    """Attach ``identity`` to ``ursa device``."""
    identity = commands.add_parser(
        "identity", help="create (if needed) and print the device id and fingerprint"
    )
    identity.add_argument(
        "--config", type=Path, required=True, help="TOML or JSON file"
    )
    identity.add_argument("--json", action="store_true", help="one JSON object")
    identity.set_defaults(handler=_identity)


# --- status -------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from ursa.coordinator.status import StatusError, read_status

    config = coordinator_config(args.config)
    listed = _enrolment_list(config)
    if listed is None:
        return 2
    try:
        status = read_status(config.state_dir, errors=max(args.errors, 0))
    except StatusError as exc:
        print(f"ursa coordinator status: {exc}", file=sys.stderr)
        return 1
    enrolled = {d.device_id for d in status.devices}
    pins = listed.policy(config.enrolment).pins
    extra = {
        "federation": config.federation,
        "rounds_configured": config.rounds,
        "enrolment_mode": config.enrolment.mode,
        "pinned_not_enrolled": sorted(set(pins) - enrolled),
        "revoked": sorted(listed.revoked),
    }
    if args.json:
        print(json.dumps({**extra, **status.to_json()}, indent=2, sort_keys=True))
    else:
        print("\n".join(_status_lines(status, extra)))
    return 0


def _trained_line(model: str, figures: dict[str, Any]) -> str:
    """One model's last training round, as an operator reads it."""

    def fig(key: str) -> str:
        value = figures.get(key)
        return "-" if not isinstance(value, int | float) else f"{value:.4f}"

    said = figures.get("devices") or {}
    loss = said.get("loss")
    extra = "" if not isinstance(loss, int | float) else f", device loss {loss:.4f}"
    epsilon = figures.get("epsilon")
    if isinstance(epsilon, int | float):
        extra += f", privacy spent epsilon {epsilon:.3f}"
    return (
        f"last {model} round {figures.get('round')}: {figures.get('updates')}/"
        f"{figures.get('selected')} updates -> version {figures.get('version')}, "
        f"accuracy {fig('accuracy')} (federated {fig('federated_accuracy')}), "
        f"{figures.get('elapsed_s')} s{extra}"
    )


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def _status_lines(status: FederationStatus, extra: dict[str, Any]) -> list[str]:
    lines = [f"federation {extra['federation']}"]
    deadline = (
        "" if status.deadline_at is None else f", closes {_utc(status.deadline_at)}"
    )
    rekey = ", new key epoch next" if status.rekey else ""
    lines.append(
        f"stage: {status.stage} (key epoch {status.epoch}, round "
        f"{status.round}{deadline}{rekey})"
    )
    lines.append(
        f"rounds completed: {status.completed_rounds} of {extra['rounds_configured']}"
    )
    if status.agent is not None:
        lines.append(
            f"key epoch {status.epoch}: agent {status.agent}, {status.recipients} "
            f"recipients, {status.registered} registered"
        )
    last = status.last_round
    if last is not None:
        selected = "not yet" if last.selected is None else " ".join(last.selected)
        state = "complete" if last.completed else "open"
        lines.append(
            f"last round {last.round} (key epoch {last.epoch}, {state}): "
            f"{last.volunteers} volunteers, selected: {selected}"
        )
    for model in status.models:
        lines.append(
            f"model {model.model}: version {model.version} (round {model.round})"
        )
    for name, figures in sorted(status.trained.items()):
        lines.append(_trained_line(name, figures))
    lines.append(
        f"devices: {len(status.devices)} enrolled, {len(status.online)} online "
        f"({extra['enrolment_mode']} enrolment)"
    )
    for device in status.devices:
        where = "online" if device.online else "offline"
        lines.append(
            f"  {device.device_id:<16} {device.fingerprint}  {where:<7} "
            f"enrolled {_utc(device.enrolled_at)}"
        )
    for label, names in (
        ("pinned, not enrolled yet", extra["pinned_not_enrolled"]),
        ("revoked", extra["revoked"]),
        ("refusing this coordinator", list(status.refusing)),
        (
            "failing training (rounds in a row)",
            [f"{d} ({n})" for d, n in sorted(status.failing.items())],
        ),
        ("live phases", list(status.live_phases)),
    ):
        if names:
            lines.append(f"{label}: {' '.join(names)}")
    if status.sitting_out:
        lines.append(f"sitting key epoch {status.epoch} out:")
        for name, why in sorted(status.sitting_out.items()):
            lines.append(f"  {name:<16} {why or '-'}")
    if status.errors:
        lines.append("recent errors (newest first):")
        for error in status.errors:
            lines.append(
                f"  {_utc(error.at)} {error.device or '-'} {error.what}: "
                f"{error.code}: {error.reason}"
            )
    else:
        lines.append("recent errors: none")
    return lines


# --- enrolment ----------------------------------------------------------------


def _enrolment_list(config: CoordinatorConfig) -> EnrolmentList | None:
    """The coordinator's enrolment list, or None after printing why it is unusable."""
    from ursa.coordinator.enrolment_list import EnrolmentList, EnrolmentListError

    try:
        return EnrolmentList.load(config.state_dir)
    except EnrolmentListError as exc:
        print(f"ursa coordinator: {exc}", file=sys.stderr)
        return None


def _enrol(args: argparse.Namespace) -> int:
    from ursa.coordinator.enrolment_list import EnrolmentListError

    config = coordinator_config(args.config)
    listed = _enrolment_list(config)
    if listed is None:
        return 2
    try:
        updated = listed.enrol(args.device, args.fingerprint)
    except EnrolmentListError as exc:
        print(f"ursa coordinator enrol: {exc}", file=sys.stderr)
        return 2
    path = updated.save(config.state_dir)
    fingerprint = updated.pins[args.device]
    print(f"pinned {args.device} = {fingerprint} in {path}")
    configured = config.enrolment.pins.get(args.device)
    if configured not in (None, fingerprint):
        print("  (this overrides the other pin in the config's [enrolment] pins)")
    if config.enrolment.mode == "tofu":
        print("  (enrolment mode is tofu: pins are checked only in pinned mode)")
    known = _enrolled_fingerprint(config, args.device)
    if known not in (None, fingerprint):
        print(
            f"  {args.device} is enrolled with other keys ({known}): restart the "
            "coordinator to forget them, then the device's Hello is admitted"
        )
    else:
        print(
            f"a running coordinator admits {args.device} at its next Hello "
            "(a device it refused says Hello again within 5 minutes, no restart needed)"
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from ursa.coordinator.enrolment_list import EnrolmentListError

    config = coordinator_config(args.config)
    listed = _enrolment_list(config)
    if listed is None:
        return 2
    try:
        updated = listed.revoke(args.device)
    except EnrolmentListError as exc:
        print(f"ursa coordinator revoke: {exc}", file=sys.stderr)
        return 2
    path = updated.save(config.state_dir)
    print(f"revoked {args.device} in {path}")
    if _enrolled_fingerprint(config, args.device) is not None:
        print(
            "  a running coordinator refuses its messages from its next tick and, "
            "if it holds the current key epoch's key, keys a new epoch without it "
            "before the next round; remove its broker login too (`ursa broker "
            "mosquitto-config --force` without it in --devices, then reload "
            "Mosquitto)"
        )
    elif args.device not in listed.pins and args.device not in config.enrolment.pins:
        print(f"  ({args.device} was neither enrolled nor pinned)")
    return 0


def _enrolled_fingerprint(config: CoordinatorConfig, device_id: str) -> str | None:
    """The fingerprint the store enrolled ``device_id`` with (read-only), if any."""
    from ursa.coordinator.status import StatusError, read_status

    try:
        devices = read_status(config.state_dir, errors=0).devices
    except StatusError:
        return None  # not started yet
    return next((d.fingerprint for d in devices if d.device_id == device_id), None)


# --- the device's identity ----------------------------------------------------


def _identity(args: argparse.Namespace) -> int:
    from ursa.crypto.errors import CryptoError
    from ursa.crypto.identity import IDENTITY_FILENAME, DeviceIdentity

    config = device_config(args.config)
    created = not (config.state_dir / IDENTITY_FILENAME).exists()
    try:
        identity = DeviceIdentity.load_or_create(config.state_dir, config.device_id)
    except (CryptoError, OSError) as exc:
        print(f"ursa device identity: {exc}", file=sys.stderr)
        return 1
    fingerprint = identity.public().fingerprint()
    public = identity.public().to_bytes().hex()
    if args.json:
        data = {
            "device_id": config.device_id,
            "fingerprint": fingerprint,
            "public": public,
            "created": created,
            "state_dir": str(config.state_dir),
        }
        print(json.dumps(data, sort_keys=True))
        return 0
    print(f"device {config.device_id}")
    print(f"fingerprint {fingerprint}")
    print(f"public {public}")
    if created:
        print(f"(new identity in {config.state_dir / IDENTITY_FILENAME})")
    print(
        "enrol it on the coordinator's host: ursa coordinator enrol --config FILE "
        f"--device {config.device_id} --fingerprint {fingerprint}; or certify it "
        f"(operator trust): ursa operator certify device --identity {public} ..."
    )
    return 0
