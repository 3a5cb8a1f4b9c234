"""`ursa bench protocol`: the selection protocol end to end on a local Mosquitto.

N devices (EdgeClients with their own MQTT connections, in this process) and
the coordinator service run against a private Mosquitto with password file
and ACL on loopback. An observer subscribed to the federation records every
message with its arrival time. Figures:

* ``key_epoch_registration_s``: from the signed key-epoch notice to the
  published registry sum (agent key generation, sealing to N devices, N
  encrypted registrations, the running sum);
* ``selection_round_s``: median over rounds of announce -> signed selection
  (volunteers, trim/top-up, H tries of encrypted distributions, the agent's
  decryption and answer); budget <= 2 s;
* per device and round: messages and payload bytes sent and received, counted
  from the broker traffic (a device receives every global message).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import SecretStr

from ursa.bench.common import Budget, report
from ursa.coordinator.config import BrokerConfig as CoordinatorBroker
from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
)
from ursa.edge_sdk.config import BrokerConfig, DeviceConfig
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.topics import parse_topic
from ursa.tools.broker.mosquitto import MosquittoBroker
from ursa.tools.compose import build_coordinator, build_device

FEDERATION = "bench"
BUDGETS = [Budget("selection_round_s", at_most=2.0)]
_ROUND_KINDS = {
    "round_announce",
    "volunteer",
    "try_assignment",
    "encrypted_distribution",
    "try_sums",
    "agent_answer",
    "selection_result",
}


@dataclass(frozen=True)
class _Seen:
    at: float
    kind: str
    round: int
    scope: str  # "global", "up" or "down"
    size: int


class _Recorder:
    """The observer's handler: decode, timestamp, keep small records."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[_Seen] = []

    def __call__(self, topic: str, payload: bytes) -> None:
        at = time.perf_counter()
        try:
            parsed = parse_topic(topic)
            message = decode(payload)
        except ProtocolError:
            return
        scope = parsed.direction or parsed.scope
        with self.lock:
            self.seen.append(
                _Seen(at, message.kind, message.round, scope, len(payload))
            )

    def first(self, kind: str, round_index: int | None = None) -> float | None:
        with self.lock:
            for item in self.seen:
                if item.kind == kind and round_index in (None, item.round):
                    return item.at
        return None


def _labels(index: int, rng: np.random.Generator) -> np.ndarray:
    main = index % 10
    return np.concatenate(
        [np.full(int(rng.integers(40, 80)), main), rng.integers(0, 10, 20)]
    )


def _traffic_per_device(
    recorder: _Recorder, rounds: list[int], devices: int
) -> dict[str, float]:
    sent: defaultdict[str, int] = defaultdict(int)
    received: defaultdict[str, int] = defaultdict(int)
    with recorder.lock:
        items = [
            s for s in recorder.seen if s.kind in _ROUND_KINDS and s.round in rounds
        ]
    for item in items:
        if item.scope == "up":
            sent["messages"] += 1
            sent["bytes"] += item.size
        elif item.scope == "down":
            received["messages"] += 1
            received["bytes"] += item.size
        else:  # every device receives a global message
            received["messages"] += devices
            received["bytes"] += devices * item.size
    per = devices * max(1, len(rounds))
    return {
        "messages_sent_per_device_round": sent["messages"] / per,
        "bytes_sent_per_device_round": sent["bytes"] / per,
        "messages_received_per_device_round": received["messages"] / per,
        "bytes_received_per_device_round": received["bytes"] / per,
    }


def run(
    *,
    as_json: bool,
    devices: int = 200,
    k: int = 20,
    tries: int = 5,
    rounds: int = 3,
    key_bits: int = 2048,
    timeout_s: float = 600.0,
) -> int:
    """Run the protocol on Mosquitto and report; 1 if the round budget is missed."""
    ids = [f"b{i:04d}" for i in range(devices)]
    with (
        tempfile.TemporaryDirectory(prefix="ursa-bench-") as tmp,
        MosquittoBroker(
            devices=ids, readers=["observer"], work_dir=Path(tmp) / "broker"
        ) as broker,
    ):
        recorder = _Recorder()
        observer = MqttTransport(broker.mqtt_config("observer"))
        observer.set_handler(recorder)
        observer.subscribe(f"ursa/v1/{FEDERATION}/#")
        observer.connect()
        url = f"mqtt://127.0.0.1:{broker.port}"
        config = CoordinatorConfig(
            federation=FEDERATION,
            state_dir=Path(tmp) / "coordinator",
            broker=CoordinatorBroker(
                url=url,
                username="coordinator",
                password=SecretStr(broker.credentials["coordinator"]),
            ),
            enrolment=EnrolmentConfig(mode="tofu"),
            min_devices=devices,
            k=k,
            tries=tries,
            rounds=rounds,
            key_bits=key_bits,
            deadlines=DeadlinesConfig(
                key_epoch_s=120,
                registration_s=120,
                volunteer_s=30,
                distributions_s=30,
                agent_s=30,
                training_s=30,
            ),
        )
        service = build_coordinator(config)
        service.start()
        stop = threading.Event()
        loop = threading.Thread(target=service.run, args=(stop,), daemon=True)
        loop.start()
        rng = np.random.default_rng(0)
        clients = []
        started = time.perf_counter()
        try:
            for index, device_id in enumerate(ids):
                client = build_device(
                    DeviceConfig(
                        device_id=device_id,
                        federation=FEDERATION,
                        state_dir=Path(tmp) / device_id,
                        broker=BrokerConfig(
                            url=url,
                            username=device_id,
                            password=SecretStr(broker.credentials[device_id]),
                        ),
                        obfuscator_pool_size=2,
                    ),
                    labels=_labels(index, rng),
                    rng=np.random.default_rng(index),
                )
                client.start()
                clients.append(client)
            connect_s = time.perf_counter() - started
            loop.join(timeout_s)
            done = service.is_done
        finally:
            stop.set()
            loop.join(10)
            for client in clients:
                client.stop()
            observer.close()
        epoch_start = recorder.first("key_epoch_start")
        registry = recorder.first("registry_sum")
        round_s = []
        for r in range(1, rounds + 1):
            begin, end = (
                recorder.first("round_announce", r),
                recorder.first("selection_result", r),
            )
            if begin is not None and end is not None:
                round_s.append(end - begin)
        figures: dict[str, float | int | bool] = {
            "devices": devices,
            "k": k,
            "tries": tries,
            "key_bits": key_bits,
            "rounds_completed": len(round_s),
            "all_rounds_done": done,
            "connect_all_s": connect_s,
            "key_epoch_registration_s": (
                registry - epoch_start
                if registry is not None and epoch_start is not None
                else float("nan")
            ),
            "selection_round_s": statistics.median(round_s)
            if round_s
            else float("inf"),
            "selection_round_max_s": max(round_s) if round_s else float("inf"),
            "device_crypto_ms_mean": 1000.0
            * float(np.mean([c.stats.crypto_s for c in clients])),
        }
        figures.update(
            _traffic_per_device(recorder, list(range(1, rounds + 1)), devices)
        )
    return report("ursa bench protocol", figures, BUDGETS, as_json=as_json)
