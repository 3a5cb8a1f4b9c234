"""systemd unit files for the coordinator, a device and Mosquitto.

Pure text: `render_units` returns `{file name: content}`; `ursa service units`
writes them. Each service runs as a user of its own, restarts on failure
(not on exit code 2, a config error that a restart cannot fix) and is
confined: read-only system, no new privileges, no capabilities, writable only
where its own state lives. The coordinator runs as `--user` with
``<state-dir>/coordinator``; every device instance ``ursa-device@ID`` runs as
a dynamic user of its own (``DynamicUser=yes``) with ``<state-dir>/device-ID``,
so one device's process cannot read another's identity and epoch keys, nor
the coordinator's. Secrets come from an `EnvironmentFile` (root-only, read by
systemd before it drops privileges), never from the world-readable unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = [
    "BrokerPaths",
    "UnitSettings",
    "broker_paths",
    "coordinator_state_dir",
    "device_state_dir",
    "render_units",
]

_VAR_LIB = PurePosixPath("/var/lib")
_CONFIG_DIR = PurePosixPath("/etc/ursa")
_STATE_DIR = PurePosixPath("/var/lib/ursa")
_MOSQUITTO = PurePosixPath("/usr/sbin/mosquitto")
_BROKER_CONFIG = PurePosixPath("/etc/ursa/broker/mosquitto.conf")
_CONFIG_ERROR_EXIT = 2


@dataclass(frozen=True)
class BrokerPaths:
    """What the Mosquitto unit must know of the generated mosquitto.conf."""

    writable: tuple[str, ...] = ("/var/lib/mosquitto",)
    """Persistence and log directories."""
    port: int = 1883


@dataclass(frozen=True)
class UnitSettings:
    """Where things live on the target host (all absolute paths there)."""

    ursa: PurePosixPath
    """The `ursa` executable (in its virtual environment)."""
    user: str = "ursa"
    config_dir: PurePosixPath = _CONFIG_DIR
    state_dir: PurePosixPath = _STATE_DIR
    mosquitto: PurePosixPath = _MOSQUITTO
    broker_user: str = "mosquitto"
    broker_config: PurePosixPath = _BROKER_CONFIG
    broker: BrokerPaths = BrokerPaths()


def broker_paths(config_text: str) -> BrokerPaths:
    """Read persistence/log directories and the port from a mosquitto.conf."""
    writable: list[str] = []
    port = 1883
    for raw in config_text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "persistence_location":
            writable.append(words[1].rstrip("/") or "/")
        elif len(words) >= 3 and words[:2] == ["log_dest", "file"]:
            writable.append(str(PurePosixPath(words[2]).parent))
        elif len(words) >= 2 and words[0] == "listener" and words[1].isdigit():
            port = int(words[1])
    return BrokerPaths(tuple(writable), port)


def render_units(settings: UnitSettings) -> dict[str, str]:
    """Return the three unit files by name."""
    _check(settings)
    return {
        "ursa-coordinator.service": _coordinator(settings),
        "ursa-device@.service": _device(settings),
        "ursa-mosquitto.service": _mosquitto(settings),
    }


def _check(settings: UnitSettings) -> None:
    paths = [settings.ursa, settings.config_dir, settings.state_dir]
    paths += [settings.mosquitto, settings.broker_config]
    relative = [str(p) for p in paths if not p.is_absolute()]
    if relative:
        raise ValueError(f"unit paths must be absolute: {relative}")
    for user in (settings.user, settings.broker_user):
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
            raise ValueError(f"invalid system user name {user!r}")
    if any(c.isspace() for p in paths for c in str(p)):
        raise ValueError("unit paths must not contain white space")


def _hardening(*, home: str, devices: bool) -> list[str]:
    lines = [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ProtectHome={home}",
        "PrivateTmp=yes",
    ]
    if devices:
        lines.append("PrivateDevices=yes")
    return [
        *lines,
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestrictNamespaces=yes",
        "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        "CapabilityBoundingSet=",
        "UMask=0077",
    ]


def _home_protection(executable: PurePosixPath) -> str:
    """`yes` unless the virtual environment itself lives in a home directory."""
    top = executable.parts[1] if len(executable.parts) > 1 else ""
    return "read-only" if top in ("home", "root") else "yes"


def _state_lines(state_dir: PurePosixPath) -> list[str]:
    lines = []
    if _under_var_lib(state_dir):
        # systemd creates it, owned by the unit's user, before the start.
        lines += [
            f"StateDirectory={state_dir.relative_to(_VAR_LIB)}",
            "StateDirectoryMode=0700",
        ]
    return [*lines, f"ReadWritePaths={state_dir}"]


def _under_var_lib(path: PurePosixPath) -> bool:
    return path.is_relative_to(_VAR_LIB) and path != _VAR_LIB


def coordinator_state_dir(settings: UnitSettings) -> PurePosixPath:
    """The coordinator's state directory under ``--state-dir``."""
    return settings.state_dir / "coordinator"


def device_state_dir(settings: UnitSettings, device: str = "%i") -> PurePosixPath:
    """A device instance's state directory (``%i``: the unit's instance)."""
    return settings.state_dir / f"device-{device}"


def _unit(unit: list[str], service: list[str]) -> str:
    lines = [
        "# Written by `ursa service units`; see docs/install.md.",
        "[Unit]",
        *unit,
        "",
        "[Service]",
        *service,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def _coordinator(s: UnitSettings) -> str:
    config = s.config_dir / "coordinator.toml"
    return _unit(
        [
            "Description=ursa coordinator",
            "Wants=network-online.target",
            "After=network-online.target ursa-mosquitto.service mosquitto.service",
        ],
        [
            "Type=exec",
            f"User={s.user}",
            f"Group={s.user}",
            f"EnvironmentFile=-{s.config_dir / 'coordinator.env'}",
            f"ExecStart={s.ursa} --log-level INFO coordinator serve --config {config}",
            "Restart=on-failure",
            "RestartSec=5s",
            f"RestartPreventExitStatus={_CONFIG_ERROR_EXIT}",
            *_state_lines(coordinator_state_dir(s)),
            *_hardening(home=_home_protection(s.ursa), devices=True),
        ],
    )


def _device(s: UnitSettings) -> str:
    config = s.config_dir / "device-%i.toml"
    hardening = _hardening(home=_home_protection(s.ursa), devices=False)
    state = device_state_dir(s)
    if _under_var_lib(state):
        # A user per instance, made and removed by systemd, owning only its
        # own state directory (under /var/lib/private, linked from `state`).
        user = [
            "DynamicUser=yes",
            f"StateDirectory={state.relative_to(_VAR_LIB)}",
            "StateDirectoryMode=0700",
        ]
    else:
        user = [
            "# The state directory is outside /var/lib: every instance runs as",
            f"# {s.user} and could read the others' keys. Prefer /var/lib.",
            f"User={s.user}",
            f"Group={s.user}",
            f"ReadWritePaths={state}",
        ]
    return _unit(
        [
            "Description=ursa device %i",
            "Wants=network-online.target time-sync.target",
            "After=network-online.target time-sync.target",
        ],
        [
            "Type=exec",
            *user,
            f"EnvironmentFile=-{s.config_dir / 'device-%i.env'}",
            f"ExecStart={s.ursa} --log-level INFO device run --config {config}",
            "Restart=on-failure",
            "RestartSec=5s",
            f"RestartPreventExitStatus={_CONFIG_ERROR_EXIT}",
            "# No PrivateDevices=: a Jetson's GPU is a device node (its group,",
            "# e.g. SupplementaryGroups=video, goes in a drop-in).",
            *hardening,
        ],
    )


def _mosquitto(s: UnitSettings) -> str:
    service = [
        "Type=exec",
        f"User={s.broker_user}",
        f"Group={s.broker_user}",
        f"ExecStart={s.mosquitto} -c {s.broker_config}",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=5s",
        # "-": a missing directory is Mosquitto's error to report, not systemd's.
        *(f"ReadWritePaths=-{path}" for path in s.broker.writable),
        *_hardening(home="yes", devices=True),
    ]
    if s.broker.port < 1024:
        index = service.index("CapabilityBoundingSet=")
        service[index : index + 1] = [
            "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
            "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        ]
    return _unit(
        [
            "Description=Mosquitto MQTT broker for ursa",
            "# Replaces Debian's mosquitto.service (same default port).",
            "Conflicts=mosquitto.service",
            "Wants=network-online.target",
            "After=network-online.target",
        ],
        service,
    )
