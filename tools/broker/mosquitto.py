"""Mosquitto for ursa: config, password file and ACL writer, and a broker runner.

`write_mosquitto_config` writes what an operator installs (and what the tests
run): `mosquitto.conf`, a password file in Mosquitto 2's PBKDF2-SHA512 format
(hashed here, so no password ever appears on a command line), and the pattern
ACL that confines every device to its own subtree (docs/brokers.md):

    device (username = client id = device id, forced by use_username_as_clientid)
      write      ursa/v1/<fed>/dev/<own id>/up/<name>   (each protocol name)
      readwrite  ursa/v1/<fed>/dev/<own id>/status
      read       ursa/v1/<fed>/dev/<own id>/down/#
      read       ursa/v1/<fed>/global/#
    coordinator  readwrite ursa/v1/#, read ursa/bridge/+/state
    readers      read ursa/v1/#, read ursa/bridge/+/state   (monitoring, capture)
    site bridges (core broker) their site's devices' topics (`bridge_acl`)

A site broker gets no coordinator and a bridge to the core broker instead
(`ursa.tools.broker.bridge`, docs/brokers.md), in `bridge/bridge.conf`.
Optional TLS makes a CA and a server certificate with the `openssl` CLI.
With `run_as_user`, the files Mosquitto reads after dropping privileges go to
that user (`ursa.tools.broker.ownership`). Writing again over existing files
keeps every listed user's password hash and the TLS CA; only `rotate` and
`rotate_tls` make new secrets, so a config update locks no device out.
What one device can make the broker hold is capped: each message by
`max_packet_size`, the coordinator's queue while it is offline by
`max_queued_bytes` / `max_queued_messages` (per client), and retained
messages on its up topics by the finite set of up names (Mosquitto 2 cannot
forbid retain per topic: `retain_available` is global and the coordinator's
notices need it); the coordinator deletes those within `RETAINED_SWEEP_S`.
`MosquittoBroker` runs `mosquitto` on a free loopback port with such a config
in a temporary directory (tests, benchmarks, local trials).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import resource
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import SecretStr

from ursa.protocol.messages import MESSAGE_TYPES
from ursa.protocol.mqtt import MqttConfig
from ursa.tools.broker.bridge import (
    BRIDGE_DIR,
    SiteBridge,
    bridge_acl,
    bridge_section,
    state_topic,
)
from ursa.tools.broker.ownership import OwnerError, OwnerPlan, plan_owner
from ursa.tools.broker.tls import TlsError, make_tls_files

__all__ = [
    "DEFAULT_MAX_PACKET_BYTES",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_QUEUED_MESSAGES",
    "DEFAULT_PERSISTENCE_DIR",
    "DEVICE_UP_NAMES",
    "PERSISTENCE_DIRNAME",
    "MosquittoBroker",
    "MosquittoError",
    "MosquittoFiles",
    "find_mosquitto",
    "free_port",
    "hash_password",
    "write_mosquitto_config",
]

#: Mosquitto's `max_packet_size`: twice the transports' default payload cap.
DEFAULT_MAX_PACKET_BYTES = 2 * 1024 * 1024
#: Mosquitto's `max_queued_messages`: QoS 1 messages queued per client while
#: it is offline (or beyond its in-flight window).
DEFAULT_MAX_QUEUED_MESSAGES = 10_000
#: Mosquitto's `max_queued_bytes`: the same queue's cap in payload bytes. The
#: coordinator's session is the one that matters: an outage's backlog of a
#: few hundred devices (statuses, updates; uploads are asked again) fits, a
#: device flooding it costs at most this much broker memory.
DEFAULT_MAX_QUEUED_BYTES = 128 * 1024 * 1024
#: The names a device may publish under on its up subtree (every message
#: class's topic name): a finite set, so that what a device can leave
#: retained there is at most len(DEVICE_UP_NAMES) x max_packet_size.
DEVICE_UP_NAMES = tuple(sorted({cls.topic for cls in MESSAGE_TYPES.values()}))
#: mosquitto_passwd's own default. Generated passwords carry 192 random bits,
#: so key stretching adds nothing for them; raise it for human-chosen ones.
DEFAULT_PBKDF2_ITERATIONS = 101
#: Where Debian's mosquitto package keeps persistence (owned by `mosquitto`).
DEFAULT_PERSISTENCE_DIR = Path("/var/lib/mosquitto")
#: `ursa broker mosquitto-config`'s persistence folder, beside the config: one
#: database per broker, never the package's shared one.
PERSISTENCE_DIRNAME = "data"
_USERNAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FEDERATION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SEARCH_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")

Users = Mapping[str, str | None] | Iterable[str]
"""User names with passwords (None: generate one), or bare names (all generated)."""


class MosquittoError(RuntimeError):
    """Mosquitto or openssl is missing, failed, or was given a bad name."""


@dataclass(frozen=True)
class MosquittoFiles:
    """What `write_mosquitto_config` wrote."""

    config_file: Path
    password_file: Path
    acl_file: Path
    credentials: Mapping[str, str]
    """Plaintext passwords known to this call: given, generated, or kept ones
    still listed in credentials.txt (keep them out of logs)."""
    credentials_file: Path | None
    """0600 file with the generated passwords (None if none were generated)."""
    port: int
    tls_ca_file: Path | None
    kept: tuple[str, ...] = ()
    """Users whose existing password hashes were kept (`overwrite`)."""
    removed: tuple[str, ...] = ()
    """Users in the old password file that are no longer listed."""
    root_commands: tuple[str, ...] = ()
    """What root must still run on the broker host (file owners, directories)."""


def find_mosquitto() -> Path | None:
    """Return the `mosquitto` binary (PATH, then /usr/sbin), or None."""
    found = shutil.which("mosquitto")
    if found:
        return Path(found)
    for candidate in _SEARCH_PATHS:
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def hash_password(
    password: str, *, iterations: int = DEFAULT_PBKDF2_ITERATIONS, salt: bytes = b""
) -> str:
    """Return `password` in Mosquitto 2's password-file format `$7$it$salt$hash`."""
    salt = salt or secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def write_mosquitto_config(
    out_dir: Path,
    *,
    devices: Users,
    coordinator_user: str | None = "coordinator",
    coordinator_password: str | None = None,
    readers: Users = (),
    bridge_users: Mapping[str, Iterable[str]] | None = None,
    bridge: SiteBridge | None = None,
    federation: str | None = None,
    port: int = 1883,
    bind: str = "127.0.0.1",
    tls: bool = False,
    tls_hostnames: Iterable[str] = ("localhost", "127.0.0.1"),
    install_dir: Path | None = None,
    persistence_dir: Path | None = DEFAULT_PERSISTENCE_DIR,
    log_dest: str | None = None,
    max_packet_bytes: int = DEFAULT_MAX_PACKET_BYTES,
    max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES,
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    run_as_user: str | None = None,
    overwrite: bool = False,
    rotate: Iterable[str] = (),
    rotate_tls: bool = False,
) -> MosquittoFiles:
    """Write mosquitto.conf, the password file and the ACL into `out_dir`.

    Args:
        out_dir: where to write (created; existing files need `overwrite`).
        devices: device ids, or `{device_id: password or None}` (None and bare
            ids get generated passwords).
        coordinator_user: the coordinator's username (reads/writes ursa/v1/#);
            None for a site broker, which has no coordinator.
        coordinator_password: None generates one.
        readers: read-only users of ursa/v1/# (monitoring, captures).
        bridge_users: on a core broker, `{site bridge user: its site's
            devices}`: each gets a generated password and the ACL of
            `ursa.tools.broker.bridge.bridge_acl`.
        bridge: on a site broker, its bridge to the core; the section goes to
            `bridge.conf` (0600: it holds the bridge's password).
        federation: confine devices to one federation (default: any).
        port: the listener's port.
        bind: the listener's address (loopback by default).
        tls: make a CA and server certificate (openssl) and serve TLS.
        tls_hostnames: DNS names / IPs in the server certificate.
        install_dir: where the files will live on the broker host (paths in
            mosquitto.conf point there); default `out_dir`.
        persistence_dir: Mosquitto's persistence location; None disables
            persistence (sessions and retained messages die with the process).
        log_dest: `stderr`, `stdout`, `syslog`, `none` or `file:PATH`; None
            keeps Mosquitto's default (stderr: the journal under systemd).
        max_packet_bytes: Mosquitto's `max_packet_size`.
        max_queued_messages: Mosquitto's `max_queued_messages` (per client).
        max_queued_bytes: Mosquitto's `max_queued_bytes` (per client).
        run_as_user: the system user Mosquitto runs as (its `user` option);
            the password file, ACL, TLS key, persistence and log directories
            are handed to it (see `ursa.tools.broker.ownership`).
        overwrite: update existing files: users already in the password file
            keep their passwords unless named in `rotate` (or given one
            explicitly); users no longer listed are removed; the TLS CA and
            certificate are kept unless `rotate_tls`.
        rotate: user names that get new generated passwords.
        rotate_tls: make a new CA and server certificate even if some exist
            (every device then needs the new ca.crt).

    Generated passwords go to `credentials.txt` (mode 0600) in `out_dir`, never
    to stdout: hand each device its line, then delete the file.
    """
    if federation is not None and not _FEDERATION_RE.match(federation):
        raise MosquittoError(f"invalid federation name {federation!r}")
    if max_queued_messages < 1 or max_queued_bytes < max_packet_bytes:
        raise MosquittoError(
            "max_queued_messages must be positive and max_queued_bytes at "
            "least max_packet_bytes (0, Mosquitto's 'no limit', is refused)"
        )
    log_line = _log_dest_line(log_dest)
    device_names, reader_names = _users(devices), _users(readers)
    coordinators = [] if coordinator_user is None else [coordinator_user]
    sites = {name: tuple(ids) for name, ids in (bridge_users or {}).items()}
    wanted = (
        device_names
        | dict.fromkeys(coordinators, coordinator_password)
        | reader_names
        | dict.fromkeys(sites)
    )
    bad = [u for u in wanted if not _USERNAME_RE.match(u)]
    bad += [d for ids in sites.values() for d in ids if not _USERNAME_RE.match(d)]
    expected = len(device_names) + len(coordinators) + len(reader_names) + len(sites)
    if bad or len(wanted) != expected:
        raise MosquittoError(
            f"user names must be distinct, 1-64 of A-Z a-z 0-9 _ - (bad: {bad})"
        )
    if any(pw == "" for pw in wanted.values()):
        raise MosquittoError("empty passwords are not allowed")
    carried = {d for ids in sites.values() for d in ids}
    if carried & (set(sites) | set(coordinators) | set(reader_names)):
        # The device patterns (%u) would give that user the device's subtree.
        raise MosquittoError(
            "a site device may not share its name with a bridge, the coordinator "
            f"or a reader: {sorted(carried & set(wanted))}"
        )
    rotate = set(rotate)
    if rotate - set(wanted):
        raise MosquittoError(
            f"cannot rotate unknown users {sorted(rotate - set(wanted))}"
        )

    out_dir.mkdir(parents=True, exist_ok=True)
    names = ["mosquitto.conf", "passwd", "acl", "credentials.txt", "tls", BRIDGE_DIR]
    clash = [n for n in names if (out_dir / n).exists()]
    if clash and not overwrite:
        raise MosquittoError(
            f"{out_dir} already has {clash}; pass overwrite to replace"
        )
    old_hashes = _read_pairs(out_dir / "passwd")
    old_plain = _read_pairs(out_dir / "credentials.txt")
    hashes: dict[str, str] = {}
    credentials: dict[str, str] = {}
    listed: dict[str, str] = {}  # credentials.txt: generated, not yet handed out
    kept: list[str] = []
    for user, given in wanted.items():
        if given is not None:
            credentials[user], hashes[user] = given, hash_password(given)
        elif user in old_hashes and user not in rotate:
            hashes[user] = old_hashes[user]
            kept.append(user)
            plain = old_plain.get(user)
            if plain is not None and _matches(plain, old_hashes[user]):
                credentials[user] = listed[user] = plain
        else:
            password = secrets.token_urlsafe(24)
            credentials[user] = listed[user] = password
            hashes[user] = hash_password(password)
    removed = tuple(sorted(set(old_hashes) - set(wanted)))

    home = install_dir or out_dir.resolve()
    local = install_dir is None or install_dir.resolve() == out_dir.resolve()
    try:
        owner = None if run_as_user is None else plan_owner(run_as_user)
    except OwnerError as exc:
        raise MosquittoError(str(exc)) from exc

    def private(name: str, text: str, *, for_broker: bool = True) -> Path:
        path = out_dir / name
        _write_private(path, text)
        if owner is not None and for_broker:
            owner.give(path, home / name)
        return path

    password_file = private("passwd", "".join(f"{u}:{h}\n" for u, h in hashes.items()))
    acl_file = private(
        "acl",
        _acl_text(
            federation or "+",
            coordinators,
            devices=list(device_names),
            readers=list(reader_names),
        )
        + bridge_acl(sites, federation=federation or "+"),
    )
    credentials_file = None
    (out_dir / "credentials.txt").unlink(missing_ok=True)
    if listed:
        credentials_file = private(
            "credentials.txt",
            "".join(f"{u}:{p}\n" for u, p in listed.items()),
            for_broker=False,
        )
    lines = [
        "# ursa broker, written by `ursa broker mosquitto-config`. Every client",
        "# authenticates; the ACL confines each device to its own subtree.",
        "per_listener_settings false",
        "allow_anonymous false",
        f"password_file {home / 'passwd'}",
        f"acl_file {home / 'acl'}",
        f"max_packet_size {max_packet_bytes}",
        f"max_queued_messages {max_queued_messages}",
        f"max_queued_bytes {max_queued_bytes}",
    ]
    if persistence_dir is None:
        lines.append("persistence false")
    else:
        lines += ["persistence true", f"persistence_location {persistence_dir}/"]
        if owner is not None:
            owner.make_dir(persistence_dir, local=local)
    if run_as_user is not None:
        lines.append(f"user {run_as_user}")
    if log_line is not None:
        lines.append(log_line)
        if log_line.startswith("log_dest file ") and owner is not None:
            owner.make_dir(Path(log_line.split(" ", 2)[2]).parent, local=local)
    # Listener options must follow `listener`, or Mosquitto opens a default
    # listener on 0.0.0.0:1883 for them.
    lines += ["", f"listener {port} {bind}", "use_username_as_clientid true"]
    ca_file = None
    if tls:
        ca_file, cert, key = _tls_files(out_dir / "tls", tls_hostnames, rotate_tls)
        if owner is not None:
            owner.give(key, home / "tls" / key.name)
        tls_home = home / "tls"
        lines += [
            f"cafile {tls_home / ca_file.name}",
            f"certfile {tls_home / cert.name}",
            f"keyfile {tls_home / key.name}",
            "tls_version tlsv1.2",
        ]
    shutil.rmtree(out_dir / BRIDGE_DIR, ignore_errors=True)
    if bridge is not None:
        _write_bridge(out_dir / BRIDGE_DIR, home / BRIDGE_DIR, bridge, owner)
        section = bridge_section(
            bridge,
            federation=federation or "+",
            home=home / BRIDGE_DIR,
            max_packet_bytes=max_packet_bytes,
        )
        private(f"{BRIDGE_DIR}/bridge.conf", section)
        # Last: Mosquitto reads the included file where this line stands.
        lines += ["", f"include_dir {home / BRIDGE_DIR}"]
    config_file = out_dir / "mosquitto.conf"
    config_file.write_text("\n".join(lines) + "\n")
    config_file.chmod(0o644)
    return MosquittoFiles(
        config_file=config_file,
        password_file=password_file,
        acl_file=acl_file,
        credentials=credentials,
        credentials_file=credentials_file,
        port=port,
        tls_ca_file=ca_file,
        kept=tuple(kept),
        removed=removed,
        root_commands=tuple(owner.finish() if owner is not None else ()),
    )


def _frozen_users(users: Users) -> Users:
    if isinstance(users, str):
        raise TypeError("pass a list of user names, not one string")
    return dict(users) if isinstance(users, Mapping) else tuple(users)


def _users(users: Users) -> dict[str, str | None]:
    """Return `{name: given password or None}` for a `Users` argument."""
    users = _frozen_users(users)
    return dict(users) if isinstance(users, Mapping) else dict.fromkeys(users)


def _log_dest_line(log_dest: str | None) -> str | None:
    if log_dest is None:
        return None
    if log_dest in ("stderr", "stdout", "syslog", "none"):
        return f"log_dest {log_dest}"
    kind, sep, path = log_dest.partition(":")
    if kind == "file" and sep and Path(path).is_absolute():
        return f"log_dest file {path}"
    raise MosquittoError(
        f"log destination must be stderr, stdout, syslog, none or "
        f"file:/absolute/path, got {log_dest!r}"
    )


def _read_pairs(path: Path) -> dict[str, str]:
    """Read `user:value` lines (password file, credentials.txt); {} if absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except PermissionError:
        raise MosquittoError(
            f"cannot read {path} to keep its passwords (owned by Mosquitto's "
            "user?): run as root"
        ) from None
    pairs = (line.partition(":") for line in text.splitlines())
    return {user: value for user, sep, value in pairs if sep and user}


def _matches(password: str, stored: str) -> bool:
    """True if `password` hashes to `stored` (`$7$it$salt$hash`)."""
    parts = stored.split("$")
    if len(parts) != 5 or parts[1] != "7" or not parts[2].isdigit():
        return False
    try:
        salt = base64.b64decode(parts[3], validate=True)
    except ValueError:
        return False
    return secrets.compare_digest(
        hash_password(password, iterations=int(parts[2]), salt=salt), stored
    )


def _tls_files(
    tls_dir: Path, hostnames: Iterable[str], rotate: bool
) -> tuple[Path, Path, Path]:
    """Keep the CA and certificate already in `tls_dir` unless `rotate`."""
    existing = tls_dir / "ca.crt", tls_dir / "server.crt", tls_dir / "server.key"
    if not rotate and all(p.exists() for p in existing):
        return existing
    try:
        return make_tls_files(tls_dir, hostnames)
    except TlsError as exc:
        raise MosquittoError(str(exc)) from exc


def _acl_text(
    federation: str,
    coordinators: Iterable[str],
    *,
    devices: Iterable[str],
    readers: Iterable[str],
) -> str:
    base = f"ursa/v1/{federation}"
    lines = [
        "# Devices: username = client id = device id (%u). Up: the protocol's",
        "# names only, so what a device can leave retained there is bounded.",
        *(f"pattern write {base}/dev/%u/up/{name}" for name in DEVICE_UP_NAMES),
        f"pattern readwrite {base}/dev/%u/status",
        f"pattern read {base}/dev/%u/down/#",
        "# Every device reads the global subtree: one user block each, since a",
        "# pattern without %u would make Mosquitto warn at every start.",
    ]
    for name in devices:
        lines += ["", f"user {name}", f"topic read {base}/global/#"]
    for name in coordinators:
        lines += ["", f"user {name}", "topic readwrite ursa/v1/#"]
        lines += [f"topic read {state_topic('+')}"]
    for name in readers:
        lines += ["", f"user {name}", "topic read ursa/v1/#"]
        lines += [f"topic read {state_topic('+')}"]
    return "\n".join(lines) + "\n"


def _write_bridge(
    bridge_dir: Path, home: Path, bridge: SiteBridge, owner: OwnerPlan | None
) -> None:
    """Copy the core's CA (and a client certificate and key) beside bridge.conf."""
    bridge_dir.mkdir(mode=0o755)
    copies = [(bridge.ca_file, "ca.crt"), (bridge.cert_file, "client.crt")]
    for source, name in copies:
        if source is not None:
            try:
                (bridge_dir / name).write_bytes(source.read_bytes())
            except OSError as exc:
                raise MosquittoError(f"cannot copy {source}: {exc}") from exc
    if bridge.key_file is not None:
        try:
            key = bridge.key_file.read_text()
        except OSError as exc:
            raise MosquittoError(f"cannot read {bridge.key_file}: {exc}") from exc
        _write_private(bridge_dir / "client.key", key)
        if owner is not None:
            owner.give(bridge_dir / "client.key", home / "client.key")


def _write_private(path: Path, text: str) -> None:
    """Write `text` to a new file readable by its owner only."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _raise_open_files(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (in the child, before exec)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class MosquittoBroker:
    """A private Mosquitto on a free loopback port, with ursa's ACL.

    Use as a context manager or call `start()` / `stop()`. Files (config,
    password file, ACL, `mosquitto.log`) live in `work_dir` (a temporary
    directory, removed by `stop()`, unless one is given).

    Args:
        devices: device users (generated passwords) or `{id: password}`.
        readers: read-only users of ursa/v1/# (traffic capture).
        coordinator_user: the coordinator's username (None: no coordinator).
        bridge_users: core broker: `{site bridge user: its site's devices}`.
        bridge: site broker: its bridge to a core broker.
        tls: serve TLS with a fresh CA (`files.tls_ca_file`).
        persistence: keep sessions and retained messages across `restart()`.
        work_dir: where to put the files.
        port: the listener port; None picks a free one.
        binary: the mosquitto executable; default `find_mosquitto()`.
        startup_timeout_s: how long `start()` waits for the listener.
        open_files: raise mosquitto's open-file limit to this (capped at the
            hard limit) and lift the listener's connection limit: a broker
            for thousands of clients (`ursa bench protocol`).
        max_queued_bytes: Mosquitto's `max_queued_bytes` (tests lower it).
    """

    host = "127.0.0.1"

    def __init__(
        self,
        *,
        devices: Users = (),
        readers: Users = (),
        coordinator_user: str | None = "coordinator",
        bridge_users: Mapping[str, Iterable[str]] | None = None,
        bridge: SiteBridge | None = None,
        tls: bool = False,
        persistence: bool = False,
        work_dir: Path | None = None,
        port: int | None = None,
        binary: Path | None = None,
        startup_timeout_s: float = 10.0,
        open_files: int | None = None,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        found = binary or find_mosquitto()
        if found is None:
            raise MosquittoError("mosquitto not found (Debian: apt install mosquitto)")
        self._binary = found
        self._owns_dir = work_dir is None
        devices, readers = _frozen_users(devices), _frozen_users(readers)
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ursa-mosquitto-"))
        self.log_path = self.work_dir / "mosquitto.log"
        self._startup_timeout_s = startup_timeout_s
        self._fixed_port = port is not None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._devices = devices
        self._readers = readers
        self._bridge_users = {k: tuple(v) for k, v in (bridge_users or {}).items()}
        self._bridge = bridge
        self._tls = tls
        self._persistence = persistence
        self.coordinator_user = coordinator_user
        self._open_files = open_files
        self._max_queued_bytes = max_queued_bytes
        self.files = self._write_files(port or free_port(self.host))

    @property
    def port(self) -> int:
        """The listener port (stable across `restart()`)."""
        return self.files.port

    @property
    def credentials(self) -> Mapping[str, str]:
        """Every user's password."""
        return self.files.credentials

    @property
    def is_running(self) -> bool:
        """True while the mosquitto process is alive."""
        return self._process is not None and self._process.poll() is None

    def mqtt_config(self, username: str, *, client_id: str | None = None) -> MqttConfig:
        """Return an `MqttConfig` for `username` on this broker.

        Mosquitto forces client id = username here; `client_id` only matters
        to paho's own logs. Adjust the rest with `model_copy(update=...)`.
        """
        return MqttConfig(
            host=self.host,
            port=self.port,
            client_id=client_id or username,
            username=username,
            password=SecretStr(self.credentials[username]),
            tls=self.files.tls_ca_file is not None,
            tls_ca_file=self.files.tls_ca_file,
        )

    def start(self) -> MosquittoBroker:
        """Start mosquitto and wait until it accepts connections."""
        if self.is_running:
            return self
        for attempt in range(3):
            self._spawn()
            try:
                self._wait_listening()
                return self
            except MosquittoError:
                self._terminate()
                in_use = "Address already in use" in self.read_log()
                if self._fixed_port or not in_use or attempt == 2:
                    raise
                self.files = self._write_files(free_port(self.host))
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop mosquitto (SIGTERM, then SIGKILL) and remove a temporary work_dir."""
        self._terminate()
        if self._owns_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def restart(self) -> None:
        """Stop and start again on the same port with the same files."""
        self._terminate()
        self.start()

    def read_log(self) -> str:
        """Return mosquitto's log so far (for assertion messages)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _write_files(self, port: int) -> MosquittoFiles:
        files = write_mosquitto_config(
            self.work_dir,
            devices=self._devices,
            readers=self._readers,
            coordinator_user=self.coordinator_user,
            bridge_users=self._bridge_users,
            bridge=self._bridge,
            port=port,
            tls=self._tls,
            persistence_dir=self.work_dir if self._persistence else None,
            run_as_user="root" if os.geteuid() == 0 else None,
            log_dest="stderr",
            max_queued_bytes=self._max_queued_bytes,
            overwrite=True,
        )
        if self._open_files is not None:  # the listener's section is last
            with files.config_file.open("a") as config:
                config.write("max_connections -1\n")
        return files

    def _spawn(self) -> None:
        self._log = self.log_path.open("ab")
        limit = self._open_files
        self._process = subprocess.Popen(
            [str(self._binary), "-c", str(self.files.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=None if limit is None else lambda: _raise_open_files(limit),
        )

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise MosquittoError(f"mosquitto exited:\n{self.read_log()[-2000:]}")
            with contextlib.suppress(OSError):
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            time.sleep(0.02)
        raise MosquittoError(
            f"mosquitto not listening on {self.port} after "
            f"{self._startup_timeout_s} s:\n{self.read_log()[-2000:]}"
        )

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
