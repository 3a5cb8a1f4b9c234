"""The operator's enrolment list: pins and revocations kept by `ursa coordinator`.

``[enrolment] pins`` in the config file is the operator's own text; the
commands ``ursa coordinator enrol`` and ``ursa coordinator revoke`` write
``<state_dir>/enrolment.json`` instead (replaced atomically, mode 0600)::

    {"pins": {"dev001": "<32 hex>"}, "revoked": ["dev002"]}

The coordinator merges it with the config (`EnrolmentList.policy`: a pin
here wins over the config's for the same device) when a device it does not
know says Hello, so a device enrolled by command may join a running
coordinator. A revoked device's Hello is refused at once; at the
coordinator's next tick (and at a start) a revoked device, and one enrolled
with keys other than its pin here (it lost its state directory and was
enrolled again), are forgotten (`stale_devices`), so their other messages
are refused too, and a forgotten holder of the current key epoch's key
makes the coordinator key a new epoch before the next round.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ursa.coordinator.config import EnrolmentConfig
from ursa.protocol.messages import ID_PATTERN

__all__ = [
    "ENROLMENT_FILENAME",
    "EnrolmentList",
    "EnrolmentListError",
    "EnrolmentWatch",
    "normalise_fingerprint",
]

logger = logging.getLogger("ursa.coordinator")

ENROLMENT_FILENAME = "enrolment.json"
_FINGERPRINT = re.compile(r"[0-9a-f]{32}")


class EnrolmentListError(ValueError):
    """A malformed enrolment file, device id or fingerprint."""


def normalise_fingerprint(text: str) -> str:
    """32 lower-case hex digits (spaces, colons and upper case are accepted).

    Raises:
        EnrolmentListError: not a fingerprint.
    """
    fingerprint = re.sub(r"[\s:]", "", text).lower()
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise EnrolmentListError(
            "a fingerprint is 32 hex digits (`ursa device identity` prints it)"
        )
    return fingerprint


def _check_id(device_id: str) -> str:
    if not re.fullmatch(ID_PATTERN, device_id):
        raise EnrolmentListError(f"not a device id: {device_id!r}")
    return device_id


@dataclass(frozen=True)
class EnrolmentList:
    """Pins and revocations from ``enrolment.json`` (empty when it is missing)."""

    pins: dict[str, str] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()

    @classmethod
    def load(cls, state_dir: Path) -> EnrolmentList:
        """Read the list from ``state_dir``.

        Raises:
            EnrolmentListError: the file does not parse or holds bad entries.
        """
        path = Path(state_dir) / ENROLMENT_FILENAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise EnrolmentListError(f"{path}: {exc}") from None
        try:
            pins = {
                _check_id(str(d)): normalise_fingerprint(str(f))
                for d, f in dict(data.get("pins", {})).items()
            }
            revoked = frozenset(_check_id(str(d)) for d in data.get("revoked", []))
        except (AttributeError, TypeError, ValueError) as exc:
            raise EnrolmentListError(f"{path}: {exc}") from None
        return cls(pins, revoked)

    def save(self, state_dir: Path) -> Path:
        """Write the list to ``state_dir`` atomically (a reader sees old or new)."""
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = state_dir / ENROLMENT_FILENAME
        data = {
            "pins": dict(sorted(self.pins.items())),
            "revoked": sorted(self.revoked),
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return path

    def enrol(self, device_id: str, fingerprint: str) -> EnrolmentList:
        """This list with ``device_id`` pinned to ``fingerprint`` (and not revoked)."""
        pins = {**self.pins, _check_id(device_id): normalise_fingerprint(fingerprint)}
        return EnrolmentList(pins, self.revoked - {device_id})

    def revoke(self, device_id: str) -> EnrolmentList:
        """This list with ``device_id`` revoked and its pin dropped."""
        pins = {d: f for d, f in self.pins.items() if d != device_id}
        return EnrolmentList(pins, self.revoked | {_check_id(device_id)})

    def policy(self, config: EnrolmentConfig) -> EnrolmentConfig:
        """The config's policy with these pins added (these win) and revocations out."""
        pins = {**config.pins, **self.pins}
        kept = {d: f for d, f in pins.items() if d not in self.revoked}
        return config.model_copy(update={"pins": kept})

    def stale_devices(self, enrolled: dict[str, str]) -> dict[str, str]:
        """Enrolled devices (id -> fingerprint) to forget, with the reason."""
        stale = {}
        for device_id, fingerprint in enrolled.items():
            if device_id in self.revoked:
                stale[device_id] = "revoked"
            elif self.pins.get(device_id, fingerprint) != fingerprint:
                stale[device_id] = "enrolled again with other keys"
        return stale


class EnrolmentWatch:
    """The list and its merged policy, re-read only when the file changed.

    The coordinator asks on every Hello of a device it does not know; with
    100,000 pins a parse and merge per Hello would make enrolment O(N²). A
    ``stat`` per Hello (modification time, size, inode: ``save`` replaces
    the file, so a new inode) tells it whether to read again.
    """

    def __init__(self, state_dir: Path, config: EnrolmentConfig) -> None:
        self._state_dir = Path(state_dir)
        self._config = config
        self._seen: tuple[int, int, int] | None = None
        self._listed = EnrolmentList()
        self._policy = config
        self.reads = 0
        """How many times the file was parsed (for tests)."""

    def current(self) -> tuple[EnrolmentList, EnrolmentConfig]:
        """``(list, policy)`` as the file says now.

        A file that changed and no longer parses is logged once; the list
        read before stays in force (its revocations included) until the
        file parses again.
        """
        try:
            info = (self._state_dir / ENROLMENT_FILENAME).stat()
            seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen != self._seen:
            self._seen = seen
            self.reads += 1
            try:
                self._listed = EnrolmentList.load(self._state_dir)
            except EnrolmentListError as exc:
                logger.error("ignoring the changed enrolment list: %s", exc)
            self._policy = self._listed.policy(self._config)
        return self._listed, self._policy
