"""BrokerConfig: one broker section for coordinator and devices."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ursa.protocol.broker_config import BrokerConfig


def test_defaults_reach_a_local_plain_broker() -> None:
    mqtt = BrokerConfig().mqtt_config("coordinator")
    assert (mqtt.host, mqtt.port, mqtt.tls, mqtt.client_id) == (
        "127.0.0.1",
        1883,
        False,
        "coordinator",
    )
    assert mqtt.will_topic is None and mqtt.will_payload == b""


def test_mqtts_uses_tls_its_default_port_the_ca_and_the_will(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    broker = BrokerConfig(
        url="mqtts://broker.example", username="dev7", password="pw", tls_ca_file=ca
    )
    mqtt = broker.mqtt_config("dev7", will=("ursa/v1/f/dev/dev7/status", b"off"))
    assert (mqtt.host, mqtt.port, mqtt.tls, mqtt.tls_ca_file) == (
        "broker.example",
        8883,
        True,
        ca,
    )
    assert (mqtt.will_topic, mqtt.will_payload, mqtt.will_retain) == (
        "ursa/v1/f/dev/dev7/status",
        b"off",
        True,
    )
    assert mqtt.password is not None and "pw" not in repr(broker)


def test_a_ca_file_is_ignored_without_tls(tmp_path: Path) -> None:
    broker = BrokerConfig(
        url="mqtt://h:1999", tls_ca_file=tmp_path / "ca.crt", allow_plaintext=True
    )
    mqtt = broker.mqtt_config("c")
    assert (mqtt.port, mqtt.tls, mqtt.tls_ca_file) == (1999, False, None)


@pytest.mark.parametrize(
    "url", ["http://x", "mqtt://", "x", "mqtt://h:99999", "mqtt://h:port"]
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="broker url"):
        BrokerConfig(url=url)


def test_unknown_fields_are_refused_and_the_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        BrokerConfig.model_validate({"url": "mqtt://h", "surprise": 1})
    broker = BrokerConfig()
    with pytest.raises(ValidationError):
        broker.url = "mqtt://other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "url", ["mqtt://broker.example", "mqtt://10.0.0.5:1883", "mqtt://[fe80::1]"]
)
def test_plaintext_beyond_loopback_is_refused_unless_allowed(url: str) -> None:
    with pytest.raises(ValidationError, match="plaintext MQTT beyond loopback"):
        BrokerConfig(url=url)
    assert not BrokerConfig(url=url, allow_plaintext=True).mqtt_config("c").tls


@pytest.mark.parametrize(
    "url",
    ["mqtt://127.0.0.1:1883", "mqtt://localhost", "mqtt://[::1]:1883",
     "mqtt://127.3.2.1", "mqtts://broker.example"],
)  # fmt: skip
def test_loopback_plaintext_and_any_tls_need_no_permission(url: str) -> None:
    BrokerConfig(url=url)


def test_a_password_file_only_its_owner_reads_gives_the_password(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "dev001.password"
    secret.write_text("s3cret-pw\n")
    secret.chmod(0o600)

    config = BrokerConfig(username="dev001", password_file=secret)

    password = config.mqtt_config("dev001").password
    assert password is not None and password.get_secret_value() == "s3cret-pw"


def test_a_password_file_others_may_read_is_refused_without_its_content(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "dev001.password"
    secret.write_text("s3cret-pw\n")
    secret.chmod(0o644)

    with pytest.raises(ValueError, match="mode 0644: others may read it") as caught:
        BrokerConfig(username="dev001", password_file=secret)
    assert "s3cret-pw" not in str(caught.value)


def test_a_password_and_a_password_file_are_one_too_many(tmp_path: Path) -> None:
    secret = tmp_path / "p"
    secret.write_text("x")
    secret.chmod(0o600)

    with pytest.raises(ValueError, match="not both"):
        BrokerConfig(password="y", password_file=secret)  # type: ignore[arg-type]
