"""`ursa service units`: writes the units, reading the generated broker config."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ursa.tools.cli.units import register


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ursa")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


def test_writes_units_with_the_broker_configs_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "mosquitto.conf"
    conf.write_text("persistence_location /srv/mqtt/\nlistener 8883 0.0.0.0\n")
    out = tmp_path / "units"
    argv = ["service", "units", "--out", str(out), "--broker-config", str(conf)]
    argv += ["--ursa", "/opt/ursa/bin/ursa"]

    assert run(argv) == 0

    assert sorted(p.name for p in out.iterdir()) == [
        "ursa-coordinator.service",
        "ursa-device@.service",
        "ursa-mosquitto.service",
    ]
    mosquitto = (out / "ursa-mosquitto.service").read_text()
    assert f"mosquitto -c {conf}\n" in mosquitto
    assert "ReadWritePaths=-/srv/mqtt" in mosquitto
    assert (
        "ExecStart=/opt/ursa/bin/ursa" in (out / "ursa-coordinator.service").read_text()
    )
    assert "systemctl" in capsys.readouterr().out


def test_refuses_to_overwrite_and_bad_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["service", "units", "--out", str(tmp_path), "--ursa", "/opt/u/bin/ursa"]
    assert run(argv) == 0
    assert run(argv) == 1
    assert "--force" in capsys.readouterr().err
    assert run([*argv, "--force"]) == 0
    assert run([*argv, "--force", "--state-dir", "relative"]) == 2
