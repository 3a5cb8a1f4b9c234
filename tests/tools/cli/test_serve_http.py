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


def test_tls_files_that_do_not_load_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    cert, key = tmp_path / "missing.pem", tmp_path / "missing.key"
    args = ["coordinator", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    assert cli_service.main([*args, "--http-tls", str(cert), str(key)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ursa coordinator serve: --http-tls ")
    assert "cannot load" in err and err.count("\n") == 1


def test_the_http_section_takes_tls_files_and_allowed_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(
        tmp_path,
        '[http]\nlisten = "127.0.0.1:0"\nallowed_hosts = ["dash.example.org"]\n'
        f'tls_cert = "{tmp_path / "no.pem"}"\ntls_key = "{tmp_path / "no.key"}"\n',
    )
    assert cli_service.main(["coordinator", "serve", "--config", str(config)]) == 2
    assert "--http-tls " in capsys.readouterr().err  # the section's files were tried
    bad_host = _config(tmp_path, '[http]\nlisten = "127.0.0.1:0"\n')
    args = ["coordinator", "serve", "--config", str(bad_host)]
    assert cli_service.main([*args, "--http-allowed-host", "dash:443"]) == 2
    assert "allowed_hosts 'dash:443'" in capsys.readouterr().err


def test_a_tls_cert_without_its_key_is_a_config_error() -> None:
    from pydantic import ValidationError

    from ursa.coordinator.config import HttpConfig

    with pytest.raises(ValidationError, match="go together"):
        HttpConfig(tls_cert=Path("dash.pem"))
    assert HttpConfig(tls_cert=Path("a.pem"), tls_key=Path("a.key")).tls_key


def test_serve_parses_the_tls_and_host_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli_service.register(parser.add_subparsers(dest="command", required=True))
    hosts = ["--http-allowed-host", "a.example", "--http-allowed-host", "b.example"]
    tls = ["--http-tls", "c.pem", "c.key"]
    args = parser.parse_args(
        ["coordinator", "serve", "--config", "c.toml", *tls, *hosts]
    )
    assert args.http_tls == [Path("c.pem"), Path("c.key")]
    assert args.http_allowed_host == ["a.example", "b.example"]
