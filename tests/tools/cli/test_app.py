from __future__ import annotations

import subprocess
import sys

import pytest

from ursa import __version__
from ursa.tools.cli.app import build_parser, main


def test_version_flag_prints_the_package_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ursa {__version__}"


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ursa.tools.cli", "--version"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert __version__ in out


def test_unknown_subcommand_exits_with_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["no-such-command"])
    assert exit_info.value.code == 2
