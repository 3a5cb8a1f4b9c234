"""A federation of in-process devices on a private Mosquitto (password file + ACL).

`mqtt_federation(n)` starts a fresh broker (users DEVICE_IDS, coordinator,
observer), an observer subscribed to ``#`` that records every payload, and
builds device clients and coordinator configs for it. Devices are EdgeClients
with real MqttTransports (one paho client each) in this process.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import (
    BrokerConfig as CoordinatorBroker,
)
from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
)
from ursa.edge_sdk.callbacks import DeviceCallbacks
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.config import BrokerConfig, DeviceConfig
from ursa.edge_sdk.method import DeviceMethod
from ursa.edge_sdk.trainer import Trainer
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.trust_config import TrustConfig
from ursa.tools.broker.mosquitto import MosquittoBroker

DEVICE_PREFIX = "dev"
KEY_BITS = 1024


def device_labels(index: int, num_classes: int = 10) -> np.ndarray:
    """Skewed labels: one dominant class per device, a second one, a few of all."""
    rng = np.random.default_rng(1000 + index)
    main = index % num_classes
    second = (main + 1 + index // num_classes) % num_classes
    return np.concatenate(
        [
            np.full(int(rng.integers(30, 60)), main),
            np.full(int(rng.integers(5, 15)), second),
            rng.integers(0, num_classes, 10),
        ]
    )


class Capture:
    """Everything an observer subscribed to `#` saw, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, bytes]] = []
        self.on_message: Callable[[str, Any], None] | None = None

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.items.append((topic, payload))
        hook = self.on_message
        if hook is not None:
            with contextlib.suppress(ProtocolError):
                hook(topic, decode(payload))

    def messages(self, kind: str) -> list[tuple[str, Any]]:
        with self.lock:
            items = list(self.items)
        out = []
        for topic, payload in items:
            try:
                message = decode(payload)
            except ProtocolError:
                continue
            if message.kind == kind:
                out.append((topic, message))
        return out

    def wait_for(
        self, predicate: Callable[[], bool], timeout_s: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def serve_coordinator(config_file: Path, env: dict[str, str], log_path: Path) -> Any:
    """Start ``ursa coordinator serve --config`` as a subprocess logging to a file."""
    command = [
        sys.executable,
        "-m",
        "ursa.tools.cli.service",
        "--log-level",
        "DEBUG",
        "coordinator",
        "serve",
        "--config",
        str(config_file),
    ]
    with log_path.open("ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=log)


@contextlib.contextmanager
def polling(clients: list[EdgeClient], every_s: float = 0.5) -> Iterator[None]:
    """Call each client's `poll` in a thread meanwhile (what `EdgeClient.run` does)."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every_s):
            for client in clients:
                client.poll()

    threading.Thread(target=poll, daemon=True).start()
    try:
        yield
    finally:
        stop.set()


class MqttFederation:
    """Broker, observer and device factory for one test."""

    def __init__(
        self, broker: MosquittoBroker, tmp_path: Path, federation: str, connect: Any
    ) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.federation = federation
        self.capture = Capture()
        self.observer = connect(
            broker, "observer", subscriptions=["#"], handler=self.capture
        )
        self.clients: dict[str, EdgeClient] = {}
        self.device_trust: dict[str, TrustConfig] = {}
        """A device's ``[trust]`` (`tests.operator_trust`; none: tofu)."""

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.broker.port}"

    def coordinator_config(
        self, num_devices: int, **overrides: Any
    ) -> CoordinatorConfig:
        settings: dict[str, Any] = {
            "federation": self.federation,
            "state_dir": self.tmp_path / "coordinator",
            "broker": CoordinatorBroker(
                url=self.url,
                username="coordinator",
                password=self.broker.credentials["coordinator"],
                keepalive_s=5,
            ),
            "enrolment": EnrolmentConfig(mode="tofu"),
            "min_devices": num_devices,
            "k": 5,
            "tries": 5,
            "rounds": 5,
            "key_bits": KEY_BITS,
            "seed": 11,
            "deadlines": DeadlinesConfig(
                key_epoch_s=20,
                registration_s=20,
                volunteer_s=2,  # silence means no: most windows run out
                distributions_s=5,
                agent_s=5,
                training_s=5,
            ),
        }
        settings.update(overrides)
        return CoordinatorConfig(**settings)

    def device_ids(self, n: int) -> list[str]:
        return [f"{DEVICE_PREFIX}{i:03d}" for i in range(n)]

    def device_config(self, device_id: str) -> DeviceConfig:
        """A device of this federation on this broker, state under tmp_path."""
        return DeviceConfig(
            device_id=device_id,
            insecure_test_keys=True,  # small keys: these tests are about the wire
            federation=self.federation,
            state_dir=self.tmp_path / device_id,
            broker=BrokerConfig(
                url=self.url,
                username=device_id,
                password=self.broker.credentials[device_id],
                keepalive_s=5,
            ),
            obfuscator_pool_size=2,
            trust=self.device_trust.get(device_id, TrustConfig()),
        )

    def start_device(
        self,
        device_id: str,
        labels: Sequence[int] | np.ndarray,
        *,
        seed: int,
        trainer: Trainer | None = None,
        method_specs: tuple[Any, ...] | None = None,
        methods: Sequence[DeviceMethod] | None = None,
        callbacks: DeviceCallbacks | None = None,
    ) -> EdgeClient:
        """Start an EdgeClient of this federation (its rng seeded with `seed`).

        `method_specs` replaces the methods its config names; `stop` stops it.
        """
        config = self.device_config(device_id)
        if method_specs is not None:
            config = config.model_copy(update={"methods": method_specs})
        client = EdgeClient(
            config,
            labels,
            trainer=trainer,
            methods=methods,
            rng=np.random.default_rng(seed),
            callbacks=callbacks,
        )
        self.clients[device_id] = client
        client.start()
        return client

    def start_devices(self, n: int) -> list[EdgeClient]:
        return [
            self.start_device(device_id, device_labels(index), seed=index)
            for index, device_id in enumerate(self.device_ids(n))
        ]

    def stop(self) -> None:
        for client in self.clients.values():
            client.stop()


@pytest.fixture
def mqtt_federation(
    mosquitto_factory: Any, connect_mqtt: Any, tmp_path: Path
) -> Iterator[Callable[[str], MqttFederation]]:
    made: list[MqttFederation] = []

    def make(federation: str) -> MqttFederation:
        broker = mosquitto_factory()
        fed = MqttFederation(broker, tmp_path, federation, connect_mqtt)
        made.append(fed)
        return fed

    yield make
    for fed in made:
        fed.stop()
