"""`ursa device identity`, `ursa coordinator enrol|revoke`: the enrolment commands."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ursa.coordinator.enrolment_list import EnrolmentList
from ursa.crypto.identity import DeviceIdentity
from ursa.tools.cli.app import main


@pytest.fixture(autouse=True)
def _no_ursa_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("URSA_"):
            monkeypatch.delenv(name)


def _device(tmp_path: Path) -> Path:
    path = tmp_path / "device.toml"
    path.write_text(
        f'device_id = "dev001"\nfederation = "f"\nstate_dir = "{tmp_path / "dev"}"\n'
    )
    return path


def _coordinator(tmp_path: Path) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text(
        f'federation = "f"\nstate_dir = "{tmp_path / "coord"}"\n'
        "min_devices = 3\nk = 2\n"
    )
    return path


def test_device_identity_is_created_once_and_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_device(tmp_path))
    assert main(["device", "identity", "--config", config, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    stored = DeviceIdentity.load_or_create(tmp_path / "dev", "dev001").public()
    assert first["device_id"] == "dev001" and first["created"] is True
    assert first["fingerprint"] == stored.fingerprint()

    assert main(["device", "identity", "--config", config]) == 0
    text = capsys.readouterr().out
    assert f"fingerprint {stored.fingerprint()}" in text
    assert "new identity" not in text
    assert f"--device dev001 --fingerprint {stored.fingerprint()}" in text


def test_enrol_and_revoke_write_the_enrolment_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_coordinator(tmp_path))
    fingerprint = "ab" * 16
    argv = ["coordinator", "enrol", "--config", config, "--device", "dev001"]
    assert main([*argv, "--fingerprint", fingerprint.upper()]) == 0
    assert "pinned dev001 = " + fingerprint in capsys.readouterr().out
    assert EnrolmentList.load(tmp_path / "coord").pins == {"dev001": fingerprint}

    assert main([*argv, "--fingerprint", "abc"]) == 2
    assert "32 hex digits" in capsys.readouterr().err

    revoke = ["coordinator", "revoke", "--config", config, "--device", "dev001"]
    assert main(revoke) == 0
    assert "revoked dev001" in capsys.readouterr().out
    listed = EnrolmentList.load(tmp_path / "coord")
    assert (listed.pins, listed.revoked) == ({}, frozenset({"dev001"}))

    assert main(["coordinator", "revoke", "--config", config, "--device", "a/b"]) == 2
    assert "not a device id" in capsys.readouterr().err


def test_a_corrupt_enrolment_list_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(_coordinator(tmp_path))
    (tmp_path / "coord").mkdir()
    (tmp_path / "coord" / "enrolment.json").write_text("{")
    argv = ["coordinator", "revoke", "--config", config, "--device", "dev001"]
    assert main(argv) == 2
    assert "enrolment.json" in capsys.readouterr().err
