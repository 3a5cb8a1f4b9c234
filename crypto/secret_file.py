"""Files that hold private keys: created atomically with mode 0600, read strictly.

A key file is written to a temporary file opened 0600 from creation, then
hard-linked into place (never overwriting: a second process that lost the
race reads the winner's key). Reading refuses a symlink and a file that group
or others may access, so a key left readable is a start-up error, not a leak.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ursa.crypto.errors import CryptoError

__all__ = ["MAX_SECRET_FILE_BYTES", "read_secret_file", "write_new_secret_file"]

MAX_SECRET_FILE_BYTES = 64 * 1024 * 1024


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
