"""A device's state directory: what survives a restart of the edge SDK.

    identity.key        Ed25519 + X25519 identity (ursa.crypto.identity, 0600)
    coordinator.pub     the pinned coordinator identity (hex)
    run.json            the coordinator's run this device joined, and the runs
                        it left (never joined again)
    epoch.json          current key epoch: signed notice, agent identity, public key
    epoch-<n>.key       that epoch's Paillier secret key (0600, written atomically)
    draws.json          this epoch's per-round volunteer draws (so a re-announce
                        after a coordinator restart gets the same answer)
    methods.json        each method's progress, by method name (CLIMB's dual
                        variable, FedDisk's phase), one file written atomically

The directory is created 0700. Precomputed obfuscators are **not** persisted:
the pool is refilled in the background after a restart (each costs one
``r**n mod n**2``), which is cheaper than encrypting them at rest. The secret
key file is as sensitive as the identity key: protect the storage medium.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.paillier import PaillierSecretKey
from ursa.crypto.secret_file import ensure_private_dir

__all__ = ["METHODS_FILE", "DeviceStateDir", "StoredEpoch", "StoredRun"]

MAX_STORED_ROUNDS = 256
MAX_LEFT_RUNS = 64
"""Runs a device remembers having left (a replay of one is refused)."""
METHODS_FILE = "methods.json"
RUN_FILE = "run.json"
_RUN_FILES = ("epoch.json", "epoch-*.key", "draws.json", METHODS_FILE)
"""What belongs to one run of the coordinator (dropped when a new run starts)."""
_SECRET_MODE = 0o600


@dataclass(frozen=True)
class StoredEpoch:
    """The key epoch a device last adopted (all public, verified before saving)."""

    notice: bytes
    agent: bytes | None = None
    public_key: bytes | None = None


@dataclass(frozen=True)
class StoredRun:
    """The run a device joined ("" for none yet) and the runs it left."""

    run: str = ""
    left: tuple[str, ...] = ()


class DeviceStateDir:
    """Typed access to one device's state directory."""

    def __init__(self, path: Path) -> None:
        """Use (and create, or tighten to, 0700) the directory at `path`.

        Raises:
            UnsafeDirectoryError: not a directory, or its mode cannot be made
                0700 (a ValueError: ``ursa device run`` exits 2 with its line).
        """
        self.path = Path(path)
        ensure_private_dir(self.path, "device state")

    # --- coordinator pin ------------------------------------------------------

    def load_coordinator(self) -> DevicePublicIdentity | None:
        """The pinned coordinator identity, if any."""
        path = self.path / "coordinator.pub"
        if not path.exists():
            return None
        return DevicePublicIdentity.from_bytes(bytes.fromhex(path.read_text().strip()))

    def save_coordinator(self, identity: DevicePublicIdentity) -> None:
        """Pin the coordinator identity."""
        _write_atomic(self.path / "coordinator.pub", identity.to_bytes().hex().encode())

    def forget_coordinator(self) -> list[str]:
        """Drop the pin and everything of the old coordinator's run; what was removed.

        For a replaced coordinator: the device keeps its identity (and its
        data, which is not here) and enrols with the next coordinator that
        answers, pinning it. Key epochs, draws and method progress belong to
        the old run.
        """
        return self._remove(("coordinator.pub", RUN_FILE, *_RUN_FILES))

    # --- run ------------------------------------------------------------------

    def load_run(self) -> StoredRun:
        """The run this device joined and the runs it left.

        Raises:
            ValueError: the file is not what `save_run` writes.
        """
        path = self.path / RUN_FILE
        if not path.exists():
            return StoredRun()
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        run, left = data.get("run", ""), data.get("left", [])
        if not isinstance(run, str) or not isinstance(left, list):
            raise ValueError(f"{path} is malformed")
        return StoredRun(run, tuple(str(r) for r in left))

    def save_run(self, run: StoredRun) -> None:
        """Record the joined run (the newest `MAX_LEFT_RUNS` left runs are kept)."""
        data = {"run": run.run, "left": list(run.left[-MAX_LEFT_RUNS:])}
        _write_atomic(self.path / RUN_FILE, json.dumps(data).encode())

    def leave_run(self) -> list[str]:
        """Drop the old run's state (key epoch, draws, methods' progress); the names.

        The identity and the pin stay: the same coordinator started a new run.
        """
        return self._remove(_RUN_FILES)

    def _remove(self, patterns: tuple[str, ...]) -> list[str]:
        removed = []
        for pattern in patterns:
            for path in sorted(self.path.glob(pattern)):
                path.unlink()
                removed.append(path.name)
        return removed

    # --- key epoch ------------------------------------------------------------

    def load_epoch(self) -> StoredEpoch | None:
        """The last adopted key epoch, if any."""
        path = self.path / "epoch.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return StoredEpoch(
            notice=bytes.fromhex(data["notice"]),
            agent=_opt_hex(data.get("agent")),
            public_key=_opt_hex(data.get("public_key")),
        )

    def save_epoch(self, epoch: StoredEpoch) -> None:
        """Record the current key epoch."""
        data = {
            "notice": epoch.notice.hex(),
            "agent": None if epoch.agent is None else epoch.agent.hex(),
            "public_key": None if epoch.public_key is None else epoch.public_key.hex(),
        }
        _write_atomic(self.path / "epoch.json", json.dumps(data).encode())

    def secret_key_path(self, epoch: int) -> Path:
        """Where an epoch's secret key lives."""
        return self.path / f"epoch-{epoch}.key"

    def load_secret_key(self, epoch: int) -> PaillierSecretKey | None:
        """An epoch's secret key, if stored (refused if group/world readable)."""
        path = self.secret_key_path(epoch)
        if not path.exists():
            return None
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise PermissionError(f"{path} has mode {mode:04o}; it must be 0600")
        return PaillierSecretKey.secret_from_bytes(path.read_bytes())

    def save_secret_key(self, epoch: int, secret_key: PaillierSecretKey) -> None:
        """Store an epoch's secret key (0600) and delete older epochs' keys."""
        _write_atomic(self.secret_key_path(epoch), secret_key.secret_to_bytes())
        for old in self.path.glob("epoch-*.key"):
            if old.name != f"epoch-{epoch}.key":
                old.unlink(missing_ok=True)

    # --- per-method state -----------------------------------------------------

    def method_state(self, method: str) -> dict[str, Any] | None:
        """What ``method`` last saved, if anything.

        A device upgraded from a version that kept ``<method>.json`` files has
        that file read instead (and replaced at the method's next save).

        Raises:
            ValueError: the stored state is not a JSON object.
        """
        everything = self._methods()
        if method in everything:
            return dict(everything[method])
        legacy = self.path / f"{method}.json"
        if not legacy.exists():
            return None
        data = json.loads(legacy.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{legacy} does not hold a JSON object")
        return data

    def save_method_state(self, method: str, data: Mapping[str, Any]) -> None:
        """Replace ``method``'s saved state (the other methods' are kept)."""
        everything = self._methods()
        everything[method] = dict(data)
        _write_atomic(self.path / METHODS_FILE, json.dumps(everything).encode())
        (self.path / f"{method}.json").unlink(missing_ok=True)

    def _methods(self) -> dict[str, dict[str, Any]]:
        path = self.path / METHODS_FILE
        if not path.exists():
            return {}
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a JSON object")
        return data

    # --- per-round draws ------------------------------------------------------

    def load_draws(self, epoch: int, round_index: int) -> tuple[bool, ...] | None:
        """The draws made for a round of this epoch, if any."""
        rounds = self._draws(epoch)
        found = rounds.get(str(round_index))
        return None if found is None else tuple(bool(x) for x in found)

    def save_draws(self, epoch: int, round_index: int, draws: tuple[bool, ...]) -> None:
        """Persist a round's draws (keeps the latest `MAX_STORED_ROUNDS`)."""
        rounds = self._draws(epoch)
        rounds[str(round_index)] = list(draws)
        keep = sorted(rounds, key=int)[-MAX_STORED_ROUNDS:]
        data = {"epoch": epoch, "rounds": {r: rounds[r] for r in keep}}
        _write_atomic(self.path / "draws.json", json.dumps(data).encode())

    def _draws(self, epoch: int) -> dict[str, list[bool]]:
        path = self.path / "draws.json"
        if not path.exists():
            return {}
        data = json.loads(path.read_text())
        if data.get("epoch") != epoch:
            return {}
        return dict(data.get("rounds", {}))


def _opt_hex(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a file atomically, created 0600 (never briefly readable by others)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(temporary, flags, _SECRET_MODE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
