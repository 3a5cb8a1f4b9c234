"""`BrokerConfig`: where the broker is and how to log in, for coordinator and devices.

Both `ursa.coordinator.config` and `ursa.edge_sdk.config` re-export it (they
cannot import each other); it turns into the transport's `MqttConfig` once
the client id is known. For a device, client id = username = device id
(Mosquitto's ``%u`` ACLs); `DeviceConfig` checks the username.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from typing_extensions import Self

from ursa.protocol.loopback import is_loopback
from ursa.protocol.mqtt_config import DEFAULT_KEEPALIVE_S, DEFAULT_TIMEOUT_S, MqttConfig

__all__ = ["DEFAULT_BROKER_URL", "BrokerConfig"]

DEFAULT_BROKER_URL = "mqtt://127.0.0.1:1883"


class BrokerConfig(BaseModel):
    """Where the broker is and how to log in (the client id is filled in later).

    ``url`` is ``mqtt://host[:port]`` (default port 1883) or
    ``mqtts://host[:port]`` (TLS, default port 8883, verified against
    ``tls_ca_file`` or the system's CAs). Plaintext ``mqtt://`` is refused
    for any host but loopback unless ``allow_plaintext`` says so (a lab
    network): the password and every message would travel in clear.

    The password comes from ``password`` (better from the environment:
    ``URSA_BROKER__PASSWORD``) or from ``password_file``, a file only its
    owner can read (mode 0600 or stricter, checked at load and at connect):
    one file per device under systemd's credentials or a secrets mount, not
    one variable per device.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = DEFAULT_BROKER_URL
    """``mqtt://host[:port]`` or ``mqtts://host[:port]`` (TLS)."""
    username: str | None = None
    """The login (a device's is its device id)."""
    password: SecretStr | None = None
    """Better from ``URSA_BROKER__PASSWORD`` or `password_file`; never printed."""
    password_file: Path | None = None
    """A file holding the password (trailing newline ignored), mode 0600."""
    tls_ca_file: Path | None = None
    """The CA that signed the broker's certificate (None: the system's CAs)."""
    keepalive_s: int = Field(default=DEFAULT_KEEPALIVE_S, ge=5, le=3600)
    """MQTT keep-alive: a silent link is found dead after about 1.5 times it."""
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """How long one connect attempt may take."""
    reconnect_min_delay_s: int = Field(default=1, ge=1)
    """First wait before connecting again (at boot and after a lost connection)."""
    reconnect_max_delay_s: int = Field(default=60, ge=1)
    """Longest wait; the waits double up to it, jittered across a fleet."""
    allow_plaintext: bool = False
    """Allow ``mqtt://`` to a host beyond loopback (a lab; never a field trial)."""

    @model_validator(mode="after")
    def _check_url(self) -> Self:
        if self.reconnect_min_delay_s > self.reconnect_max_delay_s:
            raise ValueError("reconnect_min_delay_s exceeds reconnect_max_delay_s")
        if self.password is not None and self.password_file is not None:
            raise ValueError("give password or password_file, not both")
        if self.password_file is not None:
            _read_password_file(self.password_file)
        parts = urlsplit(self.url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"broker url must be mqtt://host:port, got {self.url!r}")
        try:
            parts.port  # noqa: B018 -- raises on a port out of range or not a number
        except ValueError as exc:
            raise ValueError(f"broker url {self.url!r}: {exc}") from None
        if (
            parts.scheme == "mqtt"
            and not is_loopback(parts.hostname)
            and not self.allow_plaintext
        ):
            raise ValueError(
                f"broker url {self.url!r}: plaintext MQTT beyond loopback sends "
                "the password and every message in clear; use mqtts:// (`ursa "
                "broker mosquitto-config` serves TLS for any bind beyond "
                "loopback), or set allow_plaintext = true for a lab network"
            )
        return self

    def address(self) -> str:
        """The URL for a log line: any ``user:password@`` in it left out."""
        scheme, netloc, path, query, fragment = urlsplit(self.url)
        return urlunsplit((scheme, netloc.rpartition("@")[2], path, query, fragment))

    def mqtt_config(
        self, client_id: str, *, will: tuple[str, bytes] | None = None
    ) -> MqttConfig:
        """The transport config for `client_id`, with a retained last will if given.

        ``will`` is (topic, payload), e.g. a device's `Status(online=False)`.
        """
        parts = urlsplit(self.url)
        tls = parts.scheme == "mqtts"
        return MqttConfig(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (8883 if tls else 1883),
            client_id=client_id,
            username=self.username,
            password=self._password(),
            tls=tls,
            tls_ca_file=self.tls_ca_file if tls else None,
            keepalive_s=self.keepalive_s,
            timeout_s=self.timeout_s,
            reconnect_min_delay_s=self.reconnect_min_delay_s,
            reconnect_max_delay_s=self.reconnect_max_delay_s,
            will_topic=None if will is None else will[0],
            will_payload=b"" if will is None else will[1],
            will_retain=True,
        )

    def _password(self) -> SecretStr | None:
        if self.password_file is None:
            return self.password
        return SecretStr(_read_password_file(self.password_file))


def _read_password_file(path: Path) -> str:
    """The password in ``path``, if only its owner may read the file.

    Raises:
        ValueError: missing, unreadable, empty, or readable by group or others
            (the message names the file and its mode, never its content).
    """
    try:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ValueError(
                f"password_file {path} has mode {mode:04o}: others may read it; "
                f"chmod 600 {path}"
            )
        text = path.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"password_file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"password_file {path}: not UTF-8 text") from None
    if not text:
        raise ValueError(f"password_file {path} is empty")
    return text
