"""`ursa coordinator serve --http`: refused before anything starts when unsafe."""

from __future__ import annotations

from pathlib import Path

import pytest

from ursa.tools.cli import service as cli_service


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(
        f'federation = "fed"\nstate_dir = "{tmp_path / "state"}"\n'
        '[broker]\nurl = "mqtt://127.0.0.1:1"\n' + extra
    )
    return path


def test_beyond_loopback_without_a_token_exits_2_naming_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    args = ["coordinator", "serve", "--config", str(config), "--http", "0.0.0.0:0"]
    assert cli_service.main(args) == 2
    err = capsys.readouterr().err
    assert "needs a token" in err and "--http-token" in err
    assert not (tmp_path / "state").exists()  # nothing started


def test_the_http_section_is_read_and_a_bad_address_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, '[http]\nlisten = "nowhere:port"\n')
    assert cli_service.main(["coordinator", "serve", "--config", str(config)]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


def test_serve_parses_the_http_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli_service.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["coordinator", "serve", "--config", "c.toml", "--http", "127.0.0.1:9464"]
    )
    assert args.http == "127.0.0.1:9464" and args.http_token is None
