"""Files that hold private keys: created atomically with mode 0600, read strictly.

The directories that hold them are private too: `ensure_private_dir` makes a
state directory 0700 and tightens an existing one (a directory left 0755 by
an older install or a hand-made `mkdir` would let every local user list and,
for files not yet 0600, read what a device or coordinator keeps there).

A key file is written to a temporary file opened 0600 from creation, then
hard-linked into place (never overwriting: a second process that lost the
race reads the winner's key). Reading refuses a symlink and a file that group
or others may access, so a key left readable is a start-up error, not a leak.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

from ursa.crypto.errors import CryptoError, UnsafeDirectoryError

__all__ = [
    "MAX_SECRET_FILE_BYTES",
    "ensure_private_dir",
    "read_secret_file",
    "write_new_secret_file",
]

MAX_SECRET_FILE_BYTES = 64 * 1024 * 1024
_log = logging.getLogger(__name__)


def ensure_private_dir(path: Path, what: str) -> bool:
    """Create ``path`` (mode 0700) or make an existing directory 0700.

    Returns True if an existing directory was looser and was tightened (and
    logs a WARNING naming it). A symlink is followed (systemd's
    ``DynamicUser=`` state directories are links into ``/var/lib/private``).

    Raises:
        UnsafeDirectoryError: ``path`` is not a directory, or its mode cannot
            be set (owned by another user).
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = path.stat()
    except OSError as exc:
        raise UnsafeDirectoryError(
            f"cannot make {what} directory {path}: {exc}"
        ) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectoryError(f"{what} directory {path} is not a directory")
    if os.name != "posix" or not info.st_mode & 0o077:
        return False
    try:
        path.chmod(0o700)
    except OSError as exc:
        raise UnsafeDirectoryError(
            f"{what} directory {path} has mode {info.st_mode & 0o777:04o} and "
            f"cannot be made 0700 ({exc}); chmod 700 {path} as its owner"
        ) from exc
    _log.warning(
        "%s directory %s had mode %04o; made it 0700",
        what,
        path,
        info.st_mode & 0o777,
    )
    return True


def write_new_secret_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (0600); False if ``path`` exists."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)  # atomic, never overwrites
        except FileExistsError:
            return False
        except OSError:  # no hard links on this file system
            if path.exists():
                return False
            os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return True


def read_secret_file(path: Path, what: str, max_bytes: int = 65536) -> bytes:
    """The bytes of a key file ``what`` names in errors.

    Raises:
        CryptoError: unreadable, a symlink, or accessible by group or others.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise CryptoError(f"cannot open {what} file {path}: {exc}") from exc
    with os.fdopen(descriptor, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if os.name == "posix" and mode & 0o077:
            raise CryptoError(
                f"{what} file {path} has mode {mode & 0o777:04o}; it must "
                f"not be accessible by group or others (chmod 600 {path})"
            )
        return handle.read(max_bytes)
