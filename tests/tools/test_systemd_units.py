"""systemd units: content, and `systemd-analyze verify` where it runs."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from ursa.tools.systemd_units import (
    BrokerPaths,
    UnitSettings,
    broker_paths,
    render_units,
)

SETTINGS = UnitSettings(ursa=PurePosixPath("/opt/ursa/bin/ursa"))


def _service(text: str) -> list[str]:
    return text.split("[Service]\n", 1)[1].split("\n\n", 1)[0].splitlines()


def test_every_unit_restarts_on_failure_as_a_dedicated_confined_user() -> None:
    units = render_units(SETTINGS)
    assert set(units) == {
        "ursa-coordinator.service",
        "ursa-device@.service",
        "ursa-mosquitto.service",
    }
    for name, text in units.items():
        service = _service(text)
        if "device" in name:  # a user per instance, none shared
            assert "DynamicUser=yes" in service
            assert not any(line.startswith("User=") for line in service)
        else:
            user = "mosquitto" if "mosquitto" in name else "ursa"
            assert f"User={user}" in service, name
        assert "Restart=on-failure" in service, name
        for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "UMask=0077"):
            assert line in service, (name, line)
        assert "CapabilityBoundingSet=" in service, name
        assert "WantedBy=multi-user.target" in text


def test_services_run_ursa_on_their_configs_and_write_only_their_state() -> None:
    units = render_units(SETTINGS)
    coordinator = _service(units["ursa-coordinator.service"])
    device = _service(units["ursa-device@.service"])
    assert (
        "ExecStart=/opt/ursa/bin/ursa --log-level INFO coordinator serve "
        "--config /etc/ursa/coordinator.toml"
    ) in coordinator
    assert (
        "ExecStart=/opt/ursa/bin/ursa --log-level INFO device run "
        "--config /etc/ursa/device-%i.toml"
    ) in device
    assert "StateDirectory=ursa/coordinator" in coordinator
    assert "ReadWritePaths=/var/lib/ursa/coordinator" in coordinator
    # each instance its own directory: no device may write the coordinator's
    assert "StateDirectory=ursa/device-%i" in device
    assert not any(line.startswith("ReadWritePaths=") for line in device)
    for service in (coordinator, device):
        assert "StateDirectoryMode=0700" in service
        assert "RestartPreventExitStatus=2" in service  # config errors
        assert "ProtectHome=yes" in service
    assert "PrivateDevices=yes" in coordinator
    assert "PrivateDevices=yes" not in device  # GPUs are device nodes


def test_a_venv_in_a_home_directory_stays_readable() -> None:
    units = render_units(UnitSettings(ursa=PurePosixPath("/home/pi/venv/bin/ursa")))
    assert "ProtectHome=read-only" in _service(units["ursa-device@.service"])
    assert "ProtectHome=yes" in _service(units["ursa-mosquitto.service"])


def test_a_state_dir_outside_var_lib_is_only_made_writable() -> None:
    settings = UnitSettings(ursa=SETTINGS.ursa, state_dir=PurePosixPath("/srv/ursa"))
    units = render_units(settings)
    service = _service(units["ursa-coordinator.service"])
    assert "ReadWritePaths=/srv/ursa/coordinator" in service
    assert not any(line.startswith("StateDirectory=") for line in service)
    device = _service(units["ursa-device@.service"])
    assert "ReadWritePaths=/srv/ursa/device-%i" in device
    assert "User=ursa" in device  # no per-instance user outside /var/lib
    assert any("could read the others' keys" in line for line in device)


def test_mosquitto_unit_follows_the_generated_config() -> None:
    conf = (
        "persistence_location /srv/mqtt/\n"
        "log_dest file /var/log/ursa-mqtt/mosquitto.log\n"
        "listener 883 0.0.0.0\n"
    )
    paths = broker_paths(conf)
    assert paths == BrokerPaths(("/srv/mqtt", "/var/log/ursa-mqtt"), 883)
    settings = UnitSettings(ursa=SETTINGS.ursa, broker=paths)
    service = _service(render_units(settings)["ursa-mosquitto.service"])
    assert "ExecStart=/usr/sbin/mosquitto -c /etc/ursa/broker/mosquitto.conf" in service
    assert "ReadWritePaths=-/srv/mqtt" in service
    assert "ReadWritePaths=-/var/log/ursa-mqtt" in service
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in service  # port < 1024
    assert (
        "Conflicts=mosquitto.service"
        in render_units(settings)["ursa-mosquitto.service"]
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"ursa": PurePosixPath("venv/bin/ursa")},
        {"user": "Ursa Service"},
        {"state_dir": PurePosixPath("/var/lib/my ursa")},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        render_units(dataclasses.replace(SETTINGS, **bad))


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (apt install systemd)")
    # ExecStart= must name executables that exist here.
    settings = UnitSettings(
        ursa=PurePosixPath(shutil.which("true") or "/usr/bin/true"),
        mosquitto=PurePosixPath(shutil.which("true") or "/usr/bin/true"),
    )
    for name, text in render_units(settings).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "ursa-device@dev001.service").symlink_to("ursa-device@.service")
    names = ["ursa-coordinator.service", "ursa-mosquitto.service"]
    names.append("ursa-device@dev001.service")
    done = subprocess.run(
        [analyze, "verify", *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        check=False,
    )
    if "Failed to initialize manager" in done.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "ignoring" not in done.stderr, done.stderr  # unknown or bad settings
