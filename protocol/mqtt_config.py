"""`MqttConfig`: how a transport reaches the broker, and its TLS client context."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ursa.protocol.transport import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MQTT_MAX_PAYLOAD_BYTES,
    validate_topic,
)

__all__ = ["DEFAULT_KEEPALIVE_S", "DEFAULT_TIMEOUT_S", "MqttConfig", "TlsContext"]

DEFAULT_KEEPALIVE_S = 30
DEFAULT_TIMEOUT_S = 10.0


class MqttConfig(BaseModel):
    """How to reach the broker and how to behave on it (frozen).

    The defaults are the ursa wire profile (docs/brokers.md): MQTT 3.1.1 (the
    embedded amqtt broker speaks nothing newer), a persistent session (`clean_start`
    False) so QoS 1 messages wait for a device that is briefly offline, and a
    30 s keepalive. For a device, client id = username = device id.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=1883, ge=1, le=65535)
    client_id: str = Field(min_length=1, max_length=256)
    username: str | None = None
    password: SecretStr | None = None
    protocol: Literal["3.1.1", "5"] = "3.1.1"
    keepalive_s: int = Field(default=DEFAULT_KEEPALIVE_S, ge=1, le=65535)
    clean_start: bool = False
    session_expiry_s: int = Field(default=7 * 24 * 3600, ge=0)
    """MQTT 5 only: how long the broker keeps a persistent session."""
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    max_payload_bytes: int = Field(
        default=DEFAULT_MAX_PAYLOAD_BYTES, gt=0, le=MQTT_MAX_PAYLOAD_BYTES
    )
    max_inflight_messages: int = Field(default=20, ge=1)
    max_queued_messages: int = Field(default=1000, ge=0)
    """QoS >= 1 messages paho may hold unacknowledged (0 = unlimited)."""
    reconnect_min_delay_s: int = Field(default=1, ge=1)
    reconnect_max_delay_s: int = Field(default=60, ge=1)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """How long `connect()` waits for CONNACK and `subscribe()` for SUBACK."""
    will_topic: str | None = None
    will_payload: bytes = b""
    will_qos: Literal[0, 1, 2] = 1
    will_retain: bool = True

    @model_validator(mode="after")
    def _check(self) -> MqttConfig:
        if self.reconnect_min_delay_s > self.reconnect_max_delay_s:
            raise ValueError("reconnect_min_delay_s exceeds reconnect_max_delay_s")
        if not self.tls and (self.tls_ca_file or self.tls_cert_file):
            raise ValueError("tls_ca_file / tls_cert_file given but tls is False")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.password is not None and self.username is None:
            raise ValueError("a password needs a username")
        if self.will_topic is not None:
            validate_topic(self.will_topic)
        return self


class TlsContext(ssl.SSLContext):
    """Verifying TLS client context that closes the sockets paho leaks.

    paho 2.2 does not close its SSLSocket when the handshake fails, so each
    refused attempt would leave a socket to the garbage collector. paho closes
    its previous socket before it wraps a new one, so closing the previously
    wrapped socket here is always safe.
    """

    _last_socket: ssl.SSLSocket | None = None

    @classmethod
    def from_config(cls, config: MqttConfig) -> TlsContext:
        """Return a context that trusts `config`'s CA and presents its client cert."""
        context = cls(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and host name
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if config.tls_ca_file is not None:
            context.load_verify_locations(cafile=config.tls_ca_file)
        else:
            context.load_default_certs()
        if config.tls_cert_file is not None and config.tls_key_file is not None:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        return context

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        """Wrap like SSLContext.wrap_socket, closing the previous socket first."""
        self.close_last_socket()
        wrapped = super().wrap_socket(*args, **kwargs)
        self._last_socket = wrapped
        return wrapped

    def close_last_socket(self) -> None:
        """Close the last socket wrapped (paho closed it already, or leaked it)."""
        last, self._last_socket = self._last_socket, None
        if last is not None:
            last.close()
