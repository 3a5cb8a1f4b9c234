from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ursa import __version__
from ursa.tools.cli.app import BROKEN_PIPE_EXIT, build_parser, main


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


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback(
    tmp_path: Path,
) -> None:
    """``ursa ... | head``: the pipe closes before the command prints."""
    config = tmp_path / "device.toml"
    config.write_text(
        f'device_id = "dev001"\nfederation = "f"\nstate_dir = "{tmp_path / "s"}"\n'
    )
    command = [sys.executable, "-m", "ursa.tools.cli", "device", "identity"]
    proc = subprocess.Popen(
        [*command, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    with proc.stderr:
        err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)

    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == BROKEN_PIPE_EXIT


def test_a_bare_demo_http_serves_on_the_default_loopback_address() -> None:
    from ursa.tools.cli.demo import DEFAULT_DEMO_HTTP

    args = build_parser().parse_args(["demo", "--http"])
    assert args.http == DEFAULT_DEMO_HTTP and DEFAULT_DEMO_HTTP.startswith("127.")
    given = build_parser().parse_args(["demo", "--http", "127.0.0.1:9999"])
    assert given.http == "127.0.0.1:9999"
    assert build_parser().parse_args(["demo"]).http is None
