from __future__ import annotations

import json
from pathlib import Path

import pytest

from ursa.tools.broker.mosquitto import MosquittoBroker, free_port
from ursa.tools.cli.app import main


def write_device_config(path: Path, broker: MosquittoBroker, device: str) -> Path:
    path.write_text(
        f'device_id = "{device}"\n'
        'federation = "trial"\n'
        f'state_dir = "{path.parent / "state"}"\n'
        "[broker]\n"
        f'url = "mqtt://{broker.host}:{broker.port}"\n'
        f'username = "{device}"\n'
    )
    return path


def test_unreachable_broker_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = str(free_port())
    code = main(["doctor", "--no-imports", "--host", "127.0.0.1", "--port", port])
    out, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("ursa doctor: broker: mqtt://127.0.0.1:")
    assert "unreachable" in err
    assert "python" in out and "clock" in out


def test_without_a_broker_only_warnings_and_exit_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--no-imports", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["reason"] is None
    assert data["broker"] is None


def test_a_config_that_does_not_validate_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "device.toml"
    bad.write_text('device_id = "dev 1"\n')
    assert main(["doctor", "--no-imports", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ursa doctor: config: ") and err.count("\n") == 1


@pytest.mark.integration
def test_a_coordinator_config_is_checked_as_the_coordinators(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(
        'federation = "trial"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
        "min_devices = 3\nk = 2\ntries = 2\n"
        "[broker]\n"
        f'url = "mqtt://{mosquitto.host}:{mosquitto.port}"\n'
        'username = "coordinator"\n'
    )
    monkeypatch.setenv("URSA_BROKER__PASSWORD", mosquitto.credentials["coordinator"])
    args = ["doctor", "--no-imports", "--config", str(config), "--login", "--json"]

    code = main(args)

    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    broker = next(c for c in data["checks"] if c["check"] == "broker")
    assert "logged in as coordinator" in broker["summary"]


def test_login_without_a_broker_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--no-imports", "--login"]) == 1
    assert "--login need" in capsys.readouterr().err


@pytest.mark.integration
def test_device_config_logs_in_with_the_environment_password(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_device_config(tmp_path / "device.toml", mosquitto, "dev010")
    monkeypatch.setenv("URSA_BROKER__PASSWORD", mosquitto.credentials["dev010"])
    args = ["doctor", "--no-imports", "--config", str(config), "--login", "--json"]
    code = main(args)
    data = json.loads(capsys.readouterr().out)
    assert code == 0, data
    broker = next(c for c in data["checks"] if c["check"] == "broker")
    assert broker["status"] == "ok"
    assert "logged in as dev010" in broker["summary"]


@pytest.mark.integration
def test_wrong_password_exits_1(
    mosquitto: MosquittoBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_device_config(tmp_path / "device.toml", mosquitto, "dev011")
    monkeypatch.setenv("URSA_BROKER__PASSWORD", "not-the-password")
    assert main(["doctor", "--no-imports", "--config", str(config), "--login"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ursa doctor: broker: ") and err.count("\n") == 1
    assert "refused login as dev011: Not authorized" in err
