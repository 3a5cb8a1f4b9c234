"""Key files and the directories that hold them stay private."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ursa.crypto.errors import CryptoError, UnsafeDirectoryError
from ursa.crypto.secret_file import (
    ensure_private_dir,
    read_secret_file,
    write_new_secret_file,
)


def test_a_new_state_directory_is_made_0700(tmp_path: Path) -> None:
    path = tmp_path / "a" / "state"
    assert ensure_private_dir(path, "device state") is False
    assert path.stat().st_mode & 0o777 == 0o700


def test_a_loose_existing_directory_is_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state"
    path.mkdir()
    path.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="ursa.crypto.secret_file"):
        assert ensure_private_dir(path, "coordinator state") is True
    assert path.stat().st_mode & 0o777 == 0o700
    assert "had mode 0755; made it 0700" in caplog.text
    assert ensure_private_dir(path, "coordinator state") is False  # now quiet


def test_a_linked_state_directory_is_followed(tmp_path: Path) -> None:
    """systemd's DynamicUser= state directories are links into /var/lib/private."""
    real = tmp_path / "private" / "device-1"
    real.mkdir(parents=True)
    real.chmod(0o750)
    link = tmp_path / "device-1"
    link.symlink_to(real)
    assert ensure_private_dir(link, "device state") is True
    assert real.stat().st_mode & 0o777 == 0o700


def test_a_file_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_text("not a directory")
    with pytest.raises(UnsafeDirectoryError, match="cannot make"):
        ensure_private_dir(path, "device state")


def test_key_files_are_written_0600_once_and_loose_ones_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "identity.key"
    assert write_new_secret_file(path, b"secret") is True
    assert write_new_secret_file(path, b"other") is False  # never overwrites
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_secret_file(path, "identity") == b"secret"
    path.chmod(0o644)
    with pytest.raises(CryptoError, match="chmod 600"):
        read_secret_file(path, "identity")
