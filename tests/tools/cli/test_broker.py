"""`ursa broker mosquitto-config` and its device list parsing."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.paho_client import PahoClient
from ursa.tools.broker.mosquitto import free_port
from ursa.tools.cli import broker as cli_broker
from ursa.tools.cli.broker import read_devices, register

#: Keep tests out of /var/lib/mosquitto and the files with the test's user.
LOCAL = ["--no-persistence", "--user", getpass.getuser()]


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
        run(
            [
                "broker",
                "mosquitto-config",
                "--out",
                str(out),
                "--devices",
                "a,b",
                *LOCAL,
            ]
        )
        == 0
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
    argv += LOCAL
    assert run(argv) == 0
    assert run(argv) == 1
    assert "overwrite" in capsys.readouterr().err
    assert run([*argv, "--force"]) == 0


def test_force_rotates_only_the_coordinator_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a,b"]
    argv += LOCAL
    assert run(argv) == 0
    before = (tmp_path / "passwd").read_text().splitlines()
    capsys.readouterr()

    assert run([*argv, "--force", "--rotate-coordinator"]) == 0

    after = (tmp_path / "passwd").read_text().splitlines()
    assert after[:2] == before[:2]  # a, b
    assert after[2].startswith("coordinator:") and after[2] != before[2]
    assert "kept existing passwords: a, b" in capsys.readouterr().out


def test_mosquitto_config_without_devices_is_a_usage_error(tmp_path: Path) -> None:
    assert run(["broker", "mosquitto-config", "--out", str(tmp_path)]) == 2


def test_mosquitto_config_with_tls_uses_port_8883(tmp_path: Path) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a"]
    argv += LOCAL
    assert run([*argv, "--tls", "--hostname", "broker.lan"]) == 0
    conf = (tmp_path / "mosquitto.conf").read_text()
    assert "listener 8883 127.0.0.1" in conf
    assert (tmp_path / "tls" / "ca.crt").exists()


def test_a_bind_beyond_loopback_serves_tls_unless_plaintext_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["broker", "mosquitto-config", "--devices", "a", *LOCAL]
    argv += ["--bind", "0.0.0.0"]
    assert run([*argv, "--out", str(tmp_path / "tls")]) == 0
    conf = (tmp_path / "tls" / "mosquitto.conf").read_text()
    assert "listener 8883 0.0.0.0" in conf and "certfile" in conf
    assert "since --bind 0.0.0.0 is beyond loopback" in capsys.readouterr().out

    assert run([*argv, "--out", str(tmp_path / "plain"), "--insecure-plaintext"]) == 0
    conf = (tmp_path / "plain" / "mosquitto.conf").read_text()
    assert "listener 1883 0.0.0.0" in conf and "certfile" not in conf
    assert "WARNING: a plaintext listener on 0.0.0.0" in capsys.readouterr().err
    both = [*argv, "--out", str(tmp_path / "x"), "--tls", "--insecure-plaintext"]
    assert run(both) == 2


def test_loopback_stays_plaintext_by_default(tmp_path: Path) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a"]
    assert run([*argv, *LOCAL]) == 0
    assert "listener 1883 127.0.0.1" in (tmp_path / "mosquitto.conf").read_text()


def test_run_embedded_serves_until_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("amqtt")

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_broker, "time", SimpleNamespace(sleep=interrupt))
    assert run(["broker", "run-embedded", "--port", "0"]) == 0
    assert "mqtt://127.0.0.1:" in capsys.readouterr().out


def _broker_user_and_dir(tmp_path: Path) -> tuple[str, Path]:
    """As root: the real `mosquitto` user, in a directory it can traverse.

    Otherwise the current user (Mosquitto then runs as us and `user` is moot).
    """
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("mosquitto")
        except KeyError:
            return "root", tmp_path
        shared = Path(tempfile.mkdtemp(prefix="ursa-broker-test-"))
        shared.chmod(0o755)
        return "mosquitto", shared
    return getpass.getuser(), tmp_path


def _connect(port: int, ca: Path, user: str, password: str) -> int:
    """CONNECT over TLS as `user`; return the CONNACK reason code (0: accepted)."""
    with PahoClient(port, user, password, ca) as client:
        return client.connack


def _listening(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(500):
        assert process.poll() is None, "mosquitto exited"
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        time.sleep(0.02)
    raise AssertionError("mosquitto is not listening")


def _wait_for_line(log: Path, text: str) -> None:
    """Mosquitto's loop is single-threaded: once it logs `text`, it is done
    before it reads the next packet."""
    for _ in range(500):
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in {log}")


@pytest.mark.integration
def test_mosquitto_runs_on_the_generated_config_over_tls(
    mosquitto_binary: Path, tmp_path: Path
) -> None:
    user, out_root = _broker_user_and_dir(tmp_path)
    out, data = out_root / "broker", out_root / "data"
    log = out_root / "log" / "mosquitto.log"
    port = free_port()
    argv = ["broker", "mosquitto-config", "--out", str(out), "--devices", "d1,d2"]
    argv += ["--tls", "--port", str(port), "--user", user]
    argv += ["--persistence-dir", str(data), "--log-dest", f"file:{log}"]
    process: subprocess.Popen[bytes] | None = None
    try:
        assert run(argv) == 0
        credentials = dict(
            line.split(":", 1)
            for line in (out / "credentials.txt").read_text().splitlines()
        )
        ca = out / "tls" / "ca.crt"
        process = subprocess.Popen(
            [str(mosquitto_binary), "-c", str(out / "mosquitto.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _listening(port, process)

        assert _connect(port, ca, "d1", credentials["d1"]) == 0
        assert _connect(port, ca, "coordinator", credentials["coordinator"]) == 0
        assert _connect(port, ca, "d1", credentials["d2"]) != 0

        # Rotate d2 only; Mosquitto re-reads its password file on SIGHUP.
        assert run([*argv, "--force", "--rotate", "d2"]) == 0
        rotated = dict(
            line.split(":", 1)
            for line in (out / "credentials.txt").read_text().splitlines()
        )
        process.send_signal(signal.SIGHUP)
        _wait_for_line(log, "Reloading config")
        assert rotated["d1"] == credentials["d1"]
        assert rotated["coordinator"] == credentials["coordinator"]
        assert _connect(port, ca, "d2", rotated["d2"]) == 0
        assert _connect(port, ca, "d1", credentials["d1"]) == 0
        assert log.exists()
        assert "Opening ipv4 listen socket" in log.read_text()
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=10)
        if out_root != tmp_path:
            shutil.rmtree(out_root)


def _core_and_site(tmp_path: Path, *extra_site: str) -> tuple[Path, Path, int]:
    """Write a core config with a user for site-a, then site-a's config."""
    (tmp_path / "site-a.txt").write_text("d3\nd4\n")
    core, site = tmp_path / "core", tmp_path / "site"
    argv = ["broker", "mosquitto-config", "--out", str(core), "--devices", "d1,d2"]
    argv += [*LOCAL, "--bridge-user", f"site-a={tmp_path / 'site-a.txt'}"]
    assert run(argv) == 0
    argv = ["broker", "mosquitto-config", "--out", str(site)]
    argv += ["--devices-file", str(tmp_path / "site-a.txt"), *LOCAL]
    argv += ["--bridge-to", "core.lan:1883"]
    argv += ["--bridge-credentials", str(core / "credentials.txt"), *extra_site]
    return core, site, run(argv)


def test_bridge_user_and_bridge_to_write_both_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    core, site, code = _core_and_site(tmp_path, "--bridge-name", "site-a")
    assert code == 0
    printed = capsys.readouterr().out

    core_acl = (core / "acl").read_text()
    assert "user site-a\n" in core_acl
    assert "topic write ursa/v1/+/dev/d3/up/#" in core_acl
    assert "d1/up" not in core_acl.split("user site-a")[1]
    password = dict(
        line.split(":", 1) for line in (core / "credentials.txt").read_text().split()
    )["site-a"]

    bridge = site / "bridge" / "bridge.conf"
    assert stat.S_IMODE(bridge.stat().st_mode) == 0o600
    assert f"remote_password {password}" in bridge.read_text()
    assert "address core.lan:1883" in bridge.read_text()
    assert password not in printed
    conf = (site / "mosquitto.conf").read_text()
    assert password not in conf
    assert conf.rstrip().endswith(f"include_dir {(site / 'bridge').resolve()}")
    # A site broker has no coordinator: only its devices log in there.
    site_users = (site / "credentials.txt").read_text().split()
    assert sorted(line.split(":")[0] for line in site_users) == ["d3", "d4"]
    assert "no coordinator" in printed


def test_bridge_name_defaults_to_the_only_user_in_the_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, code = _core_and_site(tmp_path)  # the core's file lists 4 users
    assert code == 2
    assert "--bridge-name" in capsys.readouterr().err
    only = tmp_path / "bridge-credentials.txt"
    only.write_text("site-a:pw\n")
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path / "s2")]
    argv += ["--devices", "d3", *LOCAL, "--bridge-to", "core.lan:1883"]
    assert run([*argv, "--bridge-credentials", str(only)]) == 0
    assert "connection site-a" in (tmp_path / "s2/bridge/bridge.conf").read_text()


@pytest.mark.parametrize(
    "extra",
    [
        ["--bridge-to", "core.lan:1883"],  # no credentials
        ["--bridge-name", "x"],  # no --bridge-to
        ["--bridge-user", "site-a"],  # no device file
        ["--bridge-to", "core.lan", "--bridge-credentials", "/dev/null"],
    ],
)
def test_bad_bridge_options_are_usage_errors(
    tmp_path: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["broker", "mosquitto-config", "--out", str(tmp_path), "--devices", "a"]
    assert run([*argv, *LOCAL, *extra]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "mosquitto.conf").exists()


def test_regenerating_a_site_without_a_bridge_removes_its_password(
    tmp_path: Path,
) -> None:
    _, site, code = _core_and_site(tmp_path, "--bridge-name", "site-a")
    assert code == 0
    argv = ["broker", "mosquitto-config", "--out", str(site), "--devices", "d3,d4"]
    assert run([*argv, *LOCAL, "--force"]) == 0
    assert not (site / "bridge").exists()
    assert "include_dir" not in (site / "mosquitto.conf").read_text()


def test_persistence_defaults_to_a_folder_beside_the_config(tmp_path: Path) -> None:
    """Two brokers on one host never share Debian's /var/lib/mosquitto."""
    for name in ("site-a", "site-b"):
        out = tmp_path / name
        argv = ["broker", "mosquitto-config", "--out", str(out), "--devices", "d1"]
        assert run([*argv, "--user", getpass.getuser()]) == 0
        conf = (out / "mosquitto.conf").read_text()
        assert f"persistence_location {out.resolve() / 'data'}/" in conf
        assert "/var/lib/mosquitto" not in conf
        assert (out / "data").is_dir()
