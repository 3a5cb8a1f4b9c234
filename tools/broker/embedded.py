"""A pure-Python MQTT broker (amqtt) in a background thread, for one-command demos.

**Local demos only: no authentication, no ACL.** Any client that can reach
the port may connect under any client id, read every topic (sealed boxes stay
sealed, but message sizes, timing and every plaintext field are visible) and
publish anywhere, including another device's subtree. It binds to 127.0.0.1 by
default; do not bind it to a public interface. Field trials and production use
Mosquitto with `ursa broker mosquitto-config` (password file + pattern ACL).

amqtt caveats (0.11/0.12):
    - MQTT 3.1.1 only: no MQTT 5 (no shared subscriptions, no session expiry,
      no reason strings); `MqttConfig(protocol="3.1.1")` is the ursa default.
    - Anonymous sessions are not persistent: a device that disconnects loses
      its subscriptions and the QoS 1 messages sent meanwhile (the transport
      re-subscribes on reconnect; retained notices and chunk re-requests
      cover the gap).
    - No packet size limit of its own: the transports' payload cap applies.
    - Pure Python on one asyncio loop: fine for tens of devices on one
      machine, not a benchmark target (use Mosquitto for `ursa bench`).
    - It logs benign warnings (e.g. "PUBACK for unknown pending message").
    - amqtt 0.12 walks its subscription table across an ``await``: a client
      connecting while another subscribes can be dropped ("dictionary
      changed size during iteration" in the broker's log, no SUBACK for the
      subscriber). `ursa demo` therefore connects its devices one at a time
      (a lock shared by the device processes) and retries a failed start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

from ursa.protocol.mqtt import MqttConfig

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = "the embedded broker needs amqtt: pip install 'ursa-fl[broker]'"


class EmbeddedBrokerError(RuntimeError):
    """amqtt is missing, or the broker failed to start or stop."""


class EmbeddedBroker:
    """An amqtt broker on its own asyncio loop in a daemon thread.

    Args:
        host: address to listen on (loopback by default; see the module warning).
        port: TCP port; 0 picks a free one (read it from `port` after `start()`).
        startup_timeout_s: how long `start()` and `stop()` wait.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 10.0
    ) -> None:
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._timeout_s = startup_timeout_s
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The listening port (only after `start()`)."""
        if self._port is None:
            raise EmbeddedBrokerError("the broker is not started")
        return self._port

    @property
    def url(self) -> str:
        """`mqtt://host:port` of the running broker."""
        return f"mqtt://{self.host}:{self.port}"

    @property
    def is_running(self) -> bool:
        """True between a successful `start()` and `stop()`."""
        return (
            self._thread is not None
            and self._thread.is_alive()
            and self._ready.is_set()
        )

    def mqtt_config(self, client_id: str) -> MqttConfig:
        """Return an `MqttConfig` for `client_id` on this broker (no credentials)."""
        return MqttConfig(host=self.host, port=self.port, client_id=client_id)

    def start(self) -> EmbeddedBroker:
        """Start the broker thread and wait until it is listening."""
        if self._thread is not None:
            raise EmbeddedBrokerError("already started")
        try:
            from amqtt.broker import Broker  # noqa: F401  (fail early, in this thread)
        except ImportError as exc:
            raise EmbeddedBrokerError(_INSTALL_HINT) from exc
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(
            target=self._run, name="ursa-embedded-broker", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(self._timeout_s) or self._error is not None:
            self.stop()
            raise EmbeddedBrokerError(
                f"amqtt did not start on {self.host}:{self._requested_port}: "
                f"{self._error or 'timeout'}"
            ) from self._error
        logger.warning(
            "embedded MQTT broker on %s: anonymous, no ACL (local demo only)", self.url
        )
        return self

    def stop(self) -> None:
        """Shut the broker down and join its thread; idempotent."""
        thread, loop, stop_event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop_event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(stop_event.set)
        thread.join(self._timeout_s)
        if thread.is_alive():
            raise EmbeddedBrokerError(f"amqtt did not stop within {self._timeout_s} s")
        self._thread = self._loop = self._stop_event = None
        self._port = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _config(self) -> dict[str, Any]:
        return {
            "listeners": {
                "default": {
                    "type": "tcp",
                    "bind": f"{self.host}:{self._requested_port}",
                }
            },
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {
                    "allow_anonymous": True
                },
            },
        }

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); the thread just ends
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        broker = _closing_broker_class()(self._config(), loop=self._loop)
        await broker.start()
        try:
            server = broker._servers["default"].instance  # no public API for it
            self._port = int(server.sockets[0].getsockname()[1])
            self._ready.set()
            await self._stop_event.wait()
        finally:
            await broker.shutdown()


def _closing_broker_class() -> Any:
    """Amqtt's Broker, closing each connection when its handler returns.

    amqtt 0.12 leaves the socket of a client that disconnects before sending
    CONNECT (a port probe, a health check) to the garbage collector.
    """
    from amqtt.broker import Broker

    class ClosingBroker(Broker):  # type: ignore[misc]
        async def stream_connected(
            self,
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            listener_name: str,
        ) -> None:
            try:
                await super().stream_connected(reader, writer, listener_name)
            finally:
                writer.close()

    return ClosingBroker
