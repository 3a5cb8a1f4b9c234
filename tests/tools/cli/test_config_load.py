"""Config mistakes are one clear message (exit 2), never a traceback or a secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ursa.coordinator.config import CoordinatorConfig
from ursa.edge_sdk.config import DeviceConfig
from ursa.tools.cli.app import main
from ursa.tools.cli.config_load import setting_paths

SECRET = "hunter2"


@pytest.fixture(autouse=True)
def _no_ursa_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("URSA_"):
            monkeypatch.delenv(name)


def _coordinator(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(
        f'federation = "f"\nstate_dir = "{tmp_path / "state"}"\n'
        f"min_devices = 3\nk = 2\n{extra}"
    )
    return path


def _device(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "device.toml"
    path.write_text(
        f'device_id = "d1"\nfederation = "f"\nstate_dir = "{tmp_path / "d1"}"\n{extra}'
    )
    return path


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, expect exit 2, return stderr (checked: short, no secret)."""
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "Traceback" not in err and "input_value" not in err
    assert err.startswith("ursa: config error: ")
    assert 1 <= len(err.splitlines()) <= 6
    return err


def test_a_misspelt_password_variable_is_named_with_a_hint(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("URSA_BROKER__PASWORD", SECRET)
    config = str(_coordinator(tmp_path))
    for argv in (
        ["coordinator", "serve", "--config", config],
        ["coordinator", "status", "--config", config],
        ["device", "run", "--config", str(_device(tmp_path))],
    ):
        err = _fails(capsys, *argv)
        assert (
            "URSA_BROKER__PASWORD: no such setting "
            "(did you mean URSA_BROKER__PASSWORD?)" in err
        )


@pytest.mark.parametrize("value", ['["hunter2"]', '{"x": "hunter2"}', '{"hunter2": 1}'])
def test_a_wrong_typed_password_variable_is_not_printed(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    monkeypatch.setenv("URSA_BROKER__PASSWORD", value)
    err = _fails(
        capsys, "coordinator", "status", "--config", str(_coordinator(tmp_path))
    )
    assert "URSA_BROKER__PASSWORD: broker.password:" in err


def test_a_wrong_typed_password_in_the_file_is_not_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _device(tmp_path, f'[broker]\npassword = ["{SECRET}"]\n')
    err = _fails(capsys, "device", "identity", "--config", str(config))
    assert f"{config}: broker.password:" in err


def test_unknown_variables_are_named_with_a_hint(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("URSA_MIN_DEVICE", "3")
    monkeypatch.setenv("URSA_K__X", "1")
    err = _fails(
        capsys, "coordinator", "status", "--config", str(_coordinator(tmp_path))
    )
    assert "URSA_MIN_DEVICE: no such setting (did you mean URSA_MIN_DEVICES?)" in err
    assert "URSA_K__X: no such setting" in err


def test_other_services_and_test_switches_are_not_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("URSA_DEVICE_ID", "d9")  # the device's, on a shared host
    monkeypatch.setenv("URSA_REQUIRE_MOSQUITTO", "1")
    monkeypatch.setenv("URSA_ENROLMENT__PINS__D1", '"' + "0" * 32 + '"')
    config = str(_coordinator(tmp_path))
    assert (
        main(
            [
                "coordinator",
                "enrol",
                "--config",
                config,
                "--device",
                "d1",
                "--fingerprint",
                "1" * 32,
            ]
        )
        == 0
    )
    assert "pinned d1" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("min_device = 3\n", "min_device: Extra inputs are not permitted"),
        ('rounds = "many"\n', "rounds: Input should be a valid integer"),
        ('[enrolment]\nmode = "open"\n', "enrolment.mode: Input should be"),
        ("key_bits = 104\n", "key_bits: Input should be greater than or equal"),
        ("quorum = 1\n", "(the config as a whole): quorum=1 must lie between"),
    ],
)
def test_bad_keys_and_values_name_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, says: str
) -> None:
    config = _coordinator(tmp_path, extra)
    err = _fails(capsys, "coordinator", "serve", "--config", str(config))
    assert f"{config}: {says}" in err


def test_files_that_do_not_parse_or_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text(f'federation = "f\n[broker]\npassword = "{SECRET}"\n')
    err = _fails(capsys, "coordinator", "serve", "--config", str(broken))
    assert f"{broken}: not valid TOML" in err
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"device_id": ')
    err = _fails(capsys, "device", "run", "--config", str(bad_json))
    assert f"{bad_json}: not valid JSON" in err
    missing = tmp_path / "missing.toml"
    err = _fails(capsys, "device", "repin", "--config", str(missing))
    assert f"{missing}: cannot read" in err
    other = tmp_path / "c.yaml"
    other.write_text("k: 1\n")
    err = _fails(capsys, "coordinator", "status", "--config", str(other))
    assert "must end in .toml or .json" in err


def test_many_errors_stay_a_few_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = "".join(f"unknown{i} = 1\n" for i in range(10))
    err = _fails(
        capsys, "coordinator", "serve", "--config", str(_coordinator(tmp_path, extra))
    )
    assert "... and 5 more" in err


def test_setting_paths_cover_nested_sections() -> None:
    coordinator = setting_paths(CoordinatorConfig)
    assert coordinator[("broker", "password")] is False
    assert coordinator[("enrolment", "pins")] is True  # a mapping: any device id
    assert coordinator[("training",)] is True  # extra keys go to TrainingConfig
    device = setting_paths(DeviceConfig)
    assert ("training", "data_file") in device and ("device_id",) in device
