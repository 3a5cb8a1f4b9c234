"""The hand-run aarch64 check script: it parses, and says how to use it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "platform" / "arm64_check.sh"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_help_needs_no_root_and_names_the_options() -> None:
    out = subprocess.run(
        ["bash", str(SCRIPT), "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "--suite bookworm|trixie" in out and "--wheel PATH" in out


def test_unknown_argument_is_refused() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--no-such-flag"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "unknown argument --no-such-flag" in done.stderr


def test_shellcheck_is_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (apt install shellcheck)")
    subprocess.run(["shellcheck", str(SCRIPT)], check=True)
