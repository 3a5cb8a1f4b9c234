"""`ursa broker mosquitto-config` and its device list parsing."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from ursa.tools.cli import broker as cli_broker
from ursa.tools.cli.broker import read_devices, register


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ursa")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def test_read_devices_merges_option_and_file(tmp_path: Path) -> None:
    listing = tmp_path / "devices.txt"
    listing.write_text("# fleet\ndev2:given-pw\n\ndev3  # lab bench\n")
    assert read_devices("dev1, dev2", listing) == {
        "dev1": None,
        "dev2": "given-pw",
        "dev3": None,
    }


def test_mosquitto_config_writes_files_and_never_prints_passwords(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broker"
    assert (
        run(["broker", "mosquitto-config", "--out", str(out), "--devices", "a,b"]) == 0
    )

    printed = capsys.readouterr().out
    credentials = (out / "credentials.txt").read_text().splitlines()
    assert sorted(line.split(":")[0] for line in credentials) == [
        "a",
        "b",
        "coordinator",
    ]
    for line in credentials:
        assert line.split(":", 1)[1] not in printed
    assert "credentials.txt" in printed
    assert "listener 1883 127.0.0.1" in (out / "mosquitto.conf").read_text()


def test_mosquitto_config_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a"]
    assert run(argv) == 0
    assert run(argv) == 1
    assert "overwrite" in capsys.readouterr().err
    assert run([*argv, "--force"]) == 0


def test_mosquitto_config_without_devices_is_a_usage_error(tmp_path: Path) -> None:
    assert run(["broker", "mosquitto-config", "--out", str(tmp_path)]) == 2


def test_mosquitto_config_with_tls_uses_port_8883(tmp_path: Path) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a"]
    assert run([*argv, "--tls", "--hostname", "broker.lan"]) == 0
    conf = (tmp_path / "mosquitto.conf").read_text()
    assert "listener 8883 127.0.0.1" in conf
    assert (tmp_path / "tls" / "ca.crt").exists()


def test_run_embedded_serves_until_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("amqtt")

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_broker, "time", SimpleNamespace(sleep=interrupt))
    assert run(["broker", "run-embedded", "--port", "0"]) == 0
    assert "mqtt://127.0.0.1:" in capsys.readouterr().out
