"""`PahoClient`: a bare paho client for tests that speak to Mosquitto below ursa.

Bridge and broker tests check what a broker itself does (ACLs, TLS, bridged
retained messages), so they use paho directly rather than an `MqttTransport`.
`close` releases paho's wake-up socket pair at once (``reinitialise``): left
to a garbage-collected cycle it is an unraisable ResourceWarning at session
end, which `filterwarnings = error` turns into a failure.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt

TIMEOUT_S = 10.0


class PahoClient:
    """An MQTT 3.1.1 client (paho's own thread) recording (topic, payload, retain).

    The constructor connects and waits for the CONNACK, refused or not:
    `connack` is its reason code (0: accepted). Use it as a context manager,
    or `close` it.
    """

    def __init__(
        self, port: int, user: str, password: str, ca: Path | None = None
    ) -> None:
        self.received: list[tuple[str, bytes, bool]] = []
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=user, protocol=mqtt.MQTTv311
        )
        self.client.username_pw_set(user, password)
        if ca is not None:
            self.client.tls_set(ca_certs=str(ca))
        self.client.on_message = lambda c, u, m: self.received.append(
            (m.topic, m.payload, bool(m.retain))
        )
        codes: list[int] = []
        answered = threading.Event()

        def on_connect(
            c: mqtt.Client, u: object, f: object, rc: Any, p: object
        ) -> None:
            codes.append(rc.value)
            answered.set()

        self.client.on_connect = on_connect
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not answered.wait(TIMEOUT_S):
            self.close()
            raise AssertionError(f"{user}: no CONNACK from port {port}")
        self.connack = codes[0]

    @property
    def accepted(self) -> bool:
        """True if the broker accepted the connection."""
        return self.connack == 0

    def subscribe(self, topic_filter: str) -> None:
        """Subscribe at QoS 1 and wait for the SUBACK."""
        done = threading.Event()
        self.client.on_subscribe = lambda c, u, mid, rc, p: done.set()
        self.client.subscribe(topic_filter, qos=1)
        assert done.wait(TIMEOUT_S), f"no SUBACK for {topic_filter}"

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish at QoS 1 and wait until paho has sent it."""
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(
            TIMEOUT_S
        )

    def wait_for(self, topic: str, payload: bytes, timeout_s: float = 15.0) -> bool:
        """Wait until (topic, payload) arrives; return its retain flag."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for got, body, retain in list(self.received):
                if (got, body) == (topic, payload):
                    return retain
            time.sleep(0.05)
        raise AssertionError(f"{topic} {payload!r} never arrived: {self.received}")

    def close(self) -> None:
        """Disconnect, stop paho's thread and close its wake-up socket pair now."""
        self.client.disconnect()
        self.client.loop_stop()
        self.client.reinitialise()

    def __enter__(self) -> PahoClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
