"""Mosquitto config writer (password hashes, ACL, TLS) and the broker runner."""

from __future__ import annotations

import base64
import getpass
import os
import pwd
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ursa.protocol.mqtt import MqttTransport
from ursa.tools.broker.bridge import SiteBridge
from ursa.tools.broker.mosquitto import (
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_QUEUED_MESSAGES,
    DEVICE_UP_NAMES,
    MosquittoBroker,
    MosquittoError,
    hash_password,
    write_mosquitto_config,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_hash_matches_mosquitto_passwd(tmp_path: Path) -> None:
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd not installed (apt install mosquitto-clients)")
    passwd = tmp_path / "passwd"
    passwd.touch()
    subprocess.run([tool, "-b", str(passwd), "dev1", "s3cret"], check=True)
    line = passwd.read_text().strip()
    _, _, iterations, salt_b64, _ = line.split(":", 1)[1].split("$")
    salt = base64.b64decode(salt_b64)
    ours = hash_password("s3cret", iterations=int(iterations), salt=salt)
    assert f"dev1:{ours}" == line


def test_hash_has_mosquitto_2_shape_and_fresh_salt() -> None:
    first, second = hash_password("pw"), hash_password("pw")
    assert first.startswith("$7$101$")
    assert first != second  # a random salt per call


def test_writes_private_password_file_acl_and_credentials(tmp_path: Path) -> None:
    files = write_mosquitto_config(
        tmp_path,
        devices=["dev1", "dev2"],
        coordinator_password="given-secret",
        readers=["observer"],
        persistence_dir=None,
    )

    assert set(files.credentials) == {"dev1", "dev2", "coordinator", "observer"}
    assert files.credentials["coordinator"] == "given-secret"
    for path in (files.password_file, files.acl_file, files.credentials_file):
        assert path is not None
        assert _mode(path) == 0o600
    generated = files.credentials_file.read_text() if files.credentials_file else ""
    assert "given-secret" not in generated  # only generated passwords listed
    assert f"dev1:{files.credentials['dev1']}" in generated
    assert files.credentials["dev1"] not in files.password_file.read_text()
    acl = files.acl_file.read_text()
    assert "pattern write ursa/v1/+/dev/%u/up/control" in acl
    assert "up/#" not in acl  # the up names only: retained bytes are bounded
    assert "pattern read ursa/v1/+/dev/%u/down/#" in acl
    assert "user dev1\ntopic read ursa/v1/+/global/#" in acl
    patterns = [line for line in acl.splitlines() if line.startswith("pattern")]
    assert all("%u" in line for line in patterns)  # Mosquitto warns otherwise
    assert "user coordinator\ntopic readwrite ursa/v1/#" in acl
    assert "user observer\ntopic read ursa/v1/#" in acl


def test_listener_options_follow_the_listener_line(tmp_path: Path) -> None:
    conf = write_mosquitto_config(tmp_path, devices=["d"], port=1999).config_file
    lines = conf.read_text().splitlines()
    listener = lines.index("listener 1999 127.0.0.1")
    assert lines.index("use_username_as_clientid true") > listener
    assert "allow_anonymous false" in lines


def test_federation_confines_devices_and_install_dir_sets_paths(
    tmp_path: Path,
) -> None:
    files = write_mosquitto_config(
        tmp_path,
        devices={"d": "pw"},
        federation="trial1",
        install_dir=Path("/etc/mosquitto/ursa"),
    )
    assert "pattern write ursa/v1/trial1/dev/%u/up/transfer" in (
        files.acl_file.read_text()
    )
    assert "password_file /etc/mosquitto/ursa/passwd" in files.config_file.read_text()
    assert files.credentials_file is not None  # the generated coordinator one
    listed = files.credentials_file.read_text().splitlines()
    assert [line.split(":")[0] for line in listed] == ["coordinator"]


@pytest.mark.parametrize("name", ["a/b", "a+b", "a#", "", "a b", "a:b", "x" * 65])
def test_rejects_user_names_that_break_topics_or_files(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(MosquittoError):
        write_mosquitto_config(tmp_path, devices=[name])


def test_rejects_a_device_named_like_the_coordinator(tmp_path: Path) -> None:
    with pytest.raises(MosquittoError):
        write_mosquitto_config(tmp_path, devices=["coordinator"])


def test_refuses_to_overwrite_without_the_flag(tmp_path: Path) -> None:
    write_mosquitto_config(tmp_path, devices=["d"])
    with pytest.raises(MosquittoError, match="overwrite"):
        write_mosquitto_config(tmp_path, devices=["d"])
    write_mosquitto_config(tmp_path, devices=["d"], overwrite=True)


@pytest.mark.integration
def test_runner_listens_only_on_its_own_loopback_port(
    mosquitto: MosquittoBroker,
) -> None:
    assert mosquitto.is_running
    assert mosquitto.port != 1883
    log = mosquitto.read_log()
    assert f"listen socket on port {mosquitto.port}" in log
    assert "port 1883" not in log


@pytest.mark.integration
def test_stop_ends_the_process_and_removes_a_temporary_dir(
    mosquitto_binary: Path,
) -> None:
    broker = MosquittoBroker(devices=["d"], binary=mosquitto_binary).start()
    work_dir = broker.work_dir
    assert broker.is_running

    broker.stop()

    assert not broker.is_running
    assert not work_dir.exists()


@pytest.mark.integration
def test_start_failure_raises_with_the_log(
    mosquitto_binary: Path, tmp_path: Path
) -> None:
    broker = MosquittoBroker(devices=["d"], binary=mosquitto_binary, work_dir=tmp_path)
    broker.files.config_file.write_text("no_such_option 1\n")
    with pytest.raises(MosquittoError, match="exited"):
        broker.start()


@pytest.mark.integration
def test_persistence_keeps_queued_messages_across_a_restart(
    mosquitto_factory: Callable[..., MosquittoBroker],
    connect_mqtt: Callable[..., MqttTransport],
) -> None:
    broker = mosquitto_factory(devices=["d1"], persistence=True)
    topic = "ursa/v1/f/dev/d1/down/cmd"
    connect_mqtt(broker, "d1", subscriptions=[topic]).close()
    coordinator = connect_mqtt(broker, "coordinator")
    coordinator.publish(topic, b"survives", qos=1)
    coordinator.flush(5.0)
    coordinator.close()

    broker.restart()
    got = threading.Event()
    connect_mqtt(broker, "d1", handler=lambda t, p: got.set())

    assert got.wait(5.0), broker.read_log()


def _devices(files_dir: Path) -> dict[str, str]:
    passwd = (files_dir / "passwd").read_text().splitlines()
    return dict(line.split(":", 1) for line in passwd)


def test_overwrite_keeps_passwords_and_rotates_only_what_is_asked(
    tmp_path: Path,
) -> None:
    first = write_mosquitto_config(
        tmp_path, devices=["d1", "d2", "old"], persistence_dir=None
    )
    before = _devices(tmp_path)

    second = write_mosquitto_config(
        tmp_path,
        devices=["d1", "d2", "new"],
        persistence_dir=None,
        overwrite=True,
        rotate=["d2"],
    )

    after = _devices(tmp_path)
    assert after["d1"] == before["d1"]
    assert after["coordinator"] == before["coordinator"]
    assert after["d2"] != before["d2"]
    assert set(after) == {"d1", "d2", "new", "coordinator"}
    assert second.removed == ("old",)
    assert set(second.kept) == {"d1", "coordinator"}
    # Still-listed generated passwords stay in credentials.txt; d2's is new.
    assert second.credentials["d1"] == first.credentials["d1"]
    assert second.credentials["d2"] != first.credentials["d2"]
    assert second.credentials_file is not None
    assert f"d1:{first.credentials['d1']}" in second.credentials_file.read_text()


def test_overwrite_rotates_the_coordinator_only_when_named(tmp_path: Path) -> None:
    write_mosquitto_config(tmp_path, devices=["d1"], persistence_dir=None)
    before = _devices(tmp_path)
    write_mosquitto_config(
        tmp_path,
        devices=["d1"],
        persistence_dir=None,
        overwrite=True,
        rotate=["coordinator"],
    )
    after = _devices(tmp_path)
    assert after["coordinator"] != before["coordinator"]
    assert after["d1"] == before["d1"]


def test_rotating_an_unknown_user_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MosquittoError, match="unknown"):
        write_mosquitto_config(tmp_path, devices=["d1"], rotate=["typo"])


def test_overwrite_keeps_the_tls_ca_unless_rotated(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    files = write_mosquitto_config(tmp_path, devices=["d"], tls=True)
    assert files.tls_ca_file is not None
    ca = files.tls_ca_file.read_bytes()
    write_mosquitto_config(tmp_path, devices=["d"], tls=True, overwrite=True)
    assert files.tls_ca_file.read_bytes() == ca
    write_mosquitto_config(
        tmp_path, devices=["d"], tls=True, overwrite=True, rotate_tls=True
    )
    assert files.tls_ca_file.read_bytes() != ca


def test_persistence_and_log_locations_are_options(tmp_path: Path) -> None:
    data, logs = tmp_path / "data", tmp_path / "log" / "mosquitto.log"
    files = write_mosquitto_config(
        tmp_path / "conf",
        devices=["d"],
        persistence_dir=data,
        log_dest=f"file:{logs}",
        run_as_user=getpass.getuser(),
    )
    conf = files.config_file.read_text()
    assert f"persistence_location {data}/" in conf
    assert f"log_dest file {logs}" in conf
    assert "/var/lib/mosquitto" not in conf
    assert _mode(data) == 0o700
    assert _mode(logs.parent) == 0o700
    assert files.root_commands == ()


def test_a_bad_log_destination_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MosquittoError, match="log destination"):
        write_mosquitto_config(tmp_path, devices=["d"], log_dest="file:relative.log")


def test_files_mosquitto_reads_belong_to_its_user(tmp_path: Path) -> None:
    user = "mosquitto" if os.geteuid() == 0 else getpass.getuser()
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        pytest.skip(f"no {user!r} system user to own the files")
    files = write_mosquitto_config(
        tmp_path, devices=["d"], run_as_user=user, persistence_dir=tmp_path / "data"
    )
    for path in (files.password_file, files.acl_file, tmp_path / "data"):
        assert path.stat().st_uid == entry.pw_uid
    assert files.credentials_file is not None
    assert files.credentials_file.stat().st_uid == os.geteuid()  # the operator's
    assert f"user {user}" in files.config_file.read_text()


def test_users_may_come_from_a_generator(tmp_path: Path) -> None:
    files = write_mosquitto_config(
        tmp_path, devices=(f"d{i}" for i in range(2)), persistence_dir=None
    )
    assert set(files.credentials) == {"d0", "d1", "coordinator"}


def test_bridge_users_get_passwords_and_an_acl_for_their_sites(
    tmp_path: Path,
) -> None:
    files = write_mosquitto_config(
        tmp_path,
        devices=["d1"],
        bridge_users={"site-a": ["d2", "d3"]},
        federation="fed",
        persistence_dir=None,
    )
    assert set(files.credentials) == {"d1", "coordinator", "site-a"}
    acl = files.acl_file.read_text()
    assert "user site-a\n" in acl
    assert "topic read ursa/v1/fed/dev/d3/down/#" in acl
    assert "topic read ursa/bridge/+/state" in acl.split("user coordinator")[1]


@pytest.mark.parametrize(
    "sites",
    [
        {"site-a": ["coordinator"]},  # would read the coordinator's name as %u
        {"site-a": ["site-b"], "site-b": ["d2"]},
        {"site-a": ["bad/id"]},
        {"d1": ["d2"]},  # a bridge named like a device
    ],
)
def test_bridge_users_must_not_collide_with_other_names(
    tmp_path: Path, sites: dict[str, list[str]]
) -> None:
    with pytest.raises(MosquittoError):
        write_mosquitto_config(
            tmp_path, devices=["d1"], bridge_users=sites, persistence_dir=None
        )


def test_a_site_broker_has_no_coordinator_and_includes_its_bridge(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "core-ca.crt"
    ca.write_text("CA")
    out = tmp_path / "site"
    bridge = SiteBridge(
        name="site-a",
        host="core.lan",
        port=8883,
        password="pw",
        devices=("d2",),
        ca_file=ca,
    )
    files = write_mosquitto_config(
        out, devices=["d2"], coordinator_user=None, bridge=bridge, persistence_dir=None
    )
    assert set(files.credentials) == {"d2"}
    assert (out / "bridge" / "ca.crt").read_text() == "CA"
    section = (out / "bridge" / "bridge.conf").read_text()
    assert f"bridge_cafile {out.resolve() / 'bridge' / 'ca.crt'}" in section
    assert _mode(out / "bridge" / "bridge.conf") == 0o600
    assert "user coordinator" not in files.acl_file.read_text()


def test_the_broker_queue_is_capped_in_messages_and_bytes(tmp_path: Path) -> None:
    files = write_mosquitto_config(
        tmp_path / "a", devices=["dev1"], persistence_dir=None
    )
    conf = files.config_file.read_text()
    assert f"max_queued_bytes {DEFAULT_MAX_QUEUED_BYTES}\n" in conf
    assert f"max_queued_messages {DEFAULT_MAX_QUEUED_MESSAGES}\n" in conf
    small = write_mosquitto_config(
        tmp_path / "b",
        devices=["dev1"],
        persistence_dir=None,
        max_queued_messages=50,
        max_queued_bytes=4 * 1024 * 1024,
    )
    assert "max_queued_bytes 4194304\n" in small.config_file.read_text()
    with pytest.raises(MosquittoError, match="max_queued_bytes"):
        write_mosquitto_config(
            tmp_path / "c", devices=["dev1"], persistence_dir=None, max_queued_bytes=0
        )
    acl = files.acl_file.read_text()
    assert all(f"dev/%u/up/{name}\n" in acl for name in DEVICE_UP_NAMES)
