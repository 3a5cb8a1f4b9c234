"""An in-memory federation (coordinator + devices on an InMemoryBus, fake clock)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import CoordinatorConfig, DeadlinesConfig, EnrolmentConfig
from ursa.coordinator.round_state import Stage
from ursa.coordinator.service import CoordinatorService
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.config import DeviceConfig
from ursa.protocol.envelope import decode, encode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.topics import down_topic, name_for, up_topic
from ursa.protocol.trust_config import TrustConfig

FEDERATION = "fed"


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def device_labels(index: int, num_classes: int = 10) -> np.ndarray:
    """Skewed labels: mostly class index % C, some of the next class."""
    main = index % num_classes
    return np.concatenate(
        [
            np.full(40, main),
            np.full(10, (main + 1) % num_classes),
            np.arange(num_classes),
        ]
    )


class Federation:
    """Coordinator and devices wired over one synchronous in-memory bus."""

    def __init__(
        self, tmp_path: Path, *, num_devices: int = 10, **overrides: Any
    ) -> None:
        self.tmp_path = tmp_path
        self.bus = InMemoryBus()
        self.clock = FakeClock()
        settings: dict[str, Any] = {
            "federation": FEDERATION,
            "state_dir": tmp_path / "coordinator",
            "enrolment": EnrolmentConfig(mode="tofu"),
            "min_devices": num_devices,
            "k": 3,
            "tries": 3,
            "rounds": 3,
            "key_bits": 512,
            "seed": 7,
            "deadlines": DeadlinesConfig(
                key_epoch_s=10,
                registration_s=10,
                volunteer_s=10,
                distributions_s=10,
                agent_s=10,
                training_s=10,
            ),
        }
        settings.update(overrides)
        self.config = CoordinatorConfig(**settings)
        self.device_methods: tuple[Any, ...] | None = None
        """The devices' ``[[methods]]`` (None: their default, Dubhe)."""
        self.device_trust: dict[str, TrustConfig] = {}
        """A device's ``[trust]`` (`tests.operator_trust`; none: tofu)."""
        self.coordinator = self.new_coordinator()
        self.devices: dict[str, EdgeClient] = {}
        self.transports: dict[str, InMemoryTransport] = {}
        self.device_ids = [f"d{i:02d}" for i in range(num_devices)]
        self.captured: list[tuple[str, bytes]] = []
        spy = InMemoryTransport(self.bus, "spy")
        spy.set_handler(lambda topic, payload: self.captured.append((topic, payload)))
        spy.subscribe(f"ursa/v1/{FEDERATION}/#")
        spy.connect()

    def messages(self, kind: str) -> list[tuple[str, Any]]:
        """Captured (topic, message) of one kind, in order."""
        out = []
        for topic, payload in self.captured:
            try:
                message = decode(payload)
            except ProtocolError:
                continue
            if message.kind == kind:
                out.append((topic, message))
        return out

    def errors_to(self, device_id: str) -> list[Any]:
        """ErrorReplies sent to a device's down topic."""
        return [m for t, m in self.messages("error") if f"/dev/{device_id}/down/" in t]

    def send_as(self, device_id: str, message: Any, *, on: str | None = None) -> None:
        """Publish `message` on the up topic of `on` (default: `device_id`).

        A message that names no run is sent in the coordinator's, as a device
        that joined it would.
        """
        if not message.run:
            message = message.model_copy(update={"run": self.coordinator.run_id})
        topic = up_topic(FEDERATION, on or device_id, name_for(message.kind))
        self.raw.publish(topic, encode(message))

    def send_down(self, device_id: str, message: Any) -> None:
        """Publish ``message`` on a device's down topic, in the coordinator's run."""
        if not message.run:
            message = message.model_copy(update={"run": self.coordinator.run_id})
        topic = down_topic(FEDERATION, device_id, name_for(message.kind))
        self.raw.publish(topic, encode(message))

    def new_coordinator(self) -> CoordinatorService:
        transport = InMemoryTransport(self.bus, "coordinator")
        self.coordinator_transport = transport
        return CoordinatorService(self.config, transport=transport, clock=self.clock)

    def device_config(self, device_id: str) -> DeviceConfig:
        return DeviceConfig(
            device_id=device_id,
            federation=FEDERATION,
            state_dir=self.tmp_path / device_id,
            obfuscator_pool_size=0,
            methods=self.device_methods,
            insecure_test_keys=True,  # 512-bit keys: the tests are about logic
            trust=self.device_trust.get(device_id, TrustConfig()),
        )

    def new_device(self, device_id: str) -> EdgeClient:
        config = self.device_config(device_id)
        topic, payload = device_will(config)
        transport = InMemoryTransport(self.bus, device_id, will=(topic, payload, True))
        index = int(device_id[1:])
        client = EdgeClient(
            config,
            device_labels(index),
            transport=transport,
            rng=np.random.default_rng(index),
        )
        self.devices[device_id] = client
        self.transports[device_id] = transport
        return client

    def start(self, *, settle: bool = True) -> None:
        """Start the coordinator and the devices; run on while windows move it."""
        self.coordinator.start()
        for device_id in self.device_ids:
            self.new_device(device_id).start()
        if settle:
            self.settle()

    def volunteering(self) -> bool:
        """Whether the coordinator waits in Dubhe's volunteering window."""
        step = getattr(self.coordinator.selection, "step", None)
        selecting = self.coordinator.state.stage is Stage.SELECTING
        return selecting and step == "volunteering"

    def settle(self, windows: int = 100) -> None:
        """Let each volunteering window run out, while that moves the run on.

        Under the explicit-replies threshold (a fleet this small, by default)
        a window closes once every online device has answered, so most rounds
        need no tick; under silence devices that drew no stay silent, and a
        window closes at its deadline unless every try already has K
        volunteers. Stops when a window's end changes nothing (a test holding
        the round on purpose).
        """
        for _ in range(windows):
            if not self.volunteering():
                return
            before = self.coordinator.state
            self.tick(self.config.deadlines.volunteer_s)
            if self.coordinator.state == before and self.volunteering():
                return

    @property
    def raw(self) -> InMemoryTransport:
        """A connected raw transport that publishes anywhere (no ACL in memory)."""
        if not hasattr(self, "_raw"):
            self._raw = InMemoryTransport(self.bus, "raw")
            self._raw.connect()
        return self._raw

    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.coordinator.tick()

    def close(self) -> None:
        for client in self.devices.values():
            client.stop()
        self.coordinator.stop()


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[Callable[..., Federation]]:
    made: list[Federation] = []

    def make(**kwargs: Any) -> Federation:
        fed = Federation(tmp_path, **kwargs)
        made.append(fed)
        return fed

    yield make
    for fed in made:
        fed.close()
        assert fed.bus.handler_errors == 0
