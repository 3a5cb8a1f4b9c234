"""`ursa demo --selection-only`: Dubhe selection over MQTT on one machine.

A broker (the embedded amqtt one, or ``--broker mqtt://host:port``), the
coordinator service and N devices (EdgeClients, each with its own MQTT
connection and delivery thread) on a Dubhe-partitioned population (global
imbalance rho, average EMD between device and global label distributions).
The harness, unlike the coordinator, knows every device's labels: per round
it computes ``||p_o - p_u||_1`` of the selected set, next to the mean over
random K-subsets (the baseline Dubhe improves on). At the end it reports
crypto time and traffic per device.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.config import BrokerConfig as CoordinatorBroker
from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
)
from ursa.coordinator.methods_config import Draw, DubheSpec
from ursa.coordinator.service import CoordinatorService
from ursa.crypto.paillier_keys import MIN_SECURE_KEY_BITS
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.config import BrokerConfig, DeviceConfig
from ursa.edge_sdk.methods_config import DubheDeviceSpec as DeviceDubheSpec
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import SelectionResult
from ursa.protocol.mqtt import MqttConfig, MqttTransport
from ursa.protocol.topics import down_topic, global_topic, name_for
from ursa.tools.data.metrics import distance_to_uniform, distributions
from ursa.tools.data.partition import dubhe_partition
from ursa.tools.demo.settings import VOLUNTEER_S
from ursa.tools.operator_provisioning import OperatorProvisioning

__all__ = ["DemoSettings", "run_selection_demo"]

FEDERATION = "demo"
BAR_WIDTH = 30


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs (the CLI's options)."""

    devices: int = 50
    k: int = 10
    tries: int = 5
    rounds: int = 10
    rho: float = 10.0
    emd: float = 1.5
    samples_per_device: int = 200
    key_bits: int = 2048
    seed: int = 0
    broker_url: str | None = None
    timeout_s: float = 600.0
    draw: Draw = "paper"
    """Dubhe's volunteer draw: ``paper`` or ``stratified``."""


class _Selections:
    """Observer handler: the signed selections, as they are published.

    Under the stratified draw each selected device gets a result naming only
    itself; the demo's observer (the operator, who may read every topic)
    gathers a round's K of them into one.
    """

    def __init__(self, k: int, on_result: Callable[[SelectionResult], None]) -> None:
        self.lock = threading.Lock()
        self.by_round: dict[int, SelectionResult] = {}
        self._parts: dict[int, set[str]] = {}
        self._k = k
        self._on_result = on_result

    def __call__(self, topic: str, payload: bytes) -> None:
        try:
            message = decode(payload)
        except ProtocolError:
            return
        if not isinstance(message, SelectionResult):
            return
        with self.lock:
            if message.round in self.by_round:
                return
            parts = self._parts.setdefault(message.round, set())
            parts.update(message.selected)
            if len(parts) < self._k:
                return
            whole = message.model_copy(update={"selected": tuple(sorted(parts))})
            self.by_round[message.round] = whole
        self._on_result(whole)


def _random_baseline(
    dists: NDArray[np.float64], k: int, rng: np.random.Generator, draws: int = 2000
) -> float:
    picks = np.array(
        [rng.choice(len(dists), size=k, replace=False) for _ in range(draws)]
    )
    return float(distance_to_uniform(dists[picks].mean(axis=1)).mean())


def _progress(err: TextIO, done: int, total: int, text: str) -> None:
    filled = BAR_WIDTH * done // max(1, total)
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    err.write(f"\r[{bar}] {done}/{total} {text}")
    err.flush()


def run_selection_demo(
    settings: DemoSettings,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    as_json: bool = False,
) -> dict[str, Any]:
    """Run the demo; print progress (stderr) and results (stdout); return figures."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    rng = np.random.default_rng(settings.seed)
    population = dubhe_partition(
        settings.devices,
        10,
        settings.rho,
        settings.emd,
        rng,
        samples_per_client=settings.samples_per_device,
    )
    dists = distributions(population.counts)
    baseline = _random_baseline(dists, settings.k, rng)
    ids = [f"demo{i:04d}" for i in range(settings.devices)]
    index = {d: i for i, d in enumerate(ids)}
    per_round: list[dict[str, Any]] = []
    started = time.perf_counter()

    def on_result(result: SelectionResult) -> None:
        chosen = [index[d] for d in result.selected]
        distance = float(distance_to_uniform(dists[chosen].mean(axis=0)))
        per_round.append(
            {
                "round": result.round,
                "selected": len(chosen),
                "try": result.try_index,
                "l1_to_uniform": distance,
                "elapsed_s": time.perf_counter() - started,
            }
        )
        text = f"round {result.round}: ||p_o - p_u||_1 = {distance:.3f}"
        _progress(err, len(per_round), settings.rounds, text)
        if not as_json:
            err.write("\n")

    broker = None
    url = settings.broker_url
    if url is None:
        from ursa.tools.broker.embedded import EmbeddedBroker

        broker = EmbeddedBroker().start()
        url = broker.url
    clients: list[EdgeClient] = []
    observer: MqttTransport | None = None
    with tempfile.TemporaryDirectory(prefix="ursa-demo-") as tmp:
        try:
            host_port = url.split("://", 1)[1]
            host, port = host_port.rsplit(":", 1)
            selections = _Selections(settings.k, on_result)
            observer = MqttTransport(
                MqttConfig(host=host, port=int(port), client_id="demo-observer")
            )
            observer.set_handler(selections)
            result_name = name_for("selection_result")
            observer.subscribe(global_topic(FEDERATION, result_name))
            any_device = down_topic(FEDERATION, "any", result_name)
            observer.subscribe(any_device.replace("/any/", "/+/"))
            observer.connect()
            operator = OperatorProvisioning(Path(tmp) / "operator", FEDERATION)
            service = CoordinatorService(
                CoordinatorConfig(
                    federation=FEDERATION,
                    state_dir=Path(tmp) / "coordinator",
                    trust=operator.coordinator(Path(tmp) / "coordinator"),
                    broker=CoordinatorBroker(url=url),
                    enrolment=EnrolmentConfig(mode="tofu"),
                    min_devices=settings.devices,
                    k=settings.k,
                    tries=settings.tries,
                    rounds=settings.rounds,
                    key_bits=settings.key_bits,
                    seed=settings.seed,
                    deadlines=DeadlinesConfig(
                        volunteer_s=VOLUNTEER_S, distributions_s=20
                    ),
                    methods=(DubheSpec(draw=settings.draw),),
                )
            )
            service.start()
            stop = threading.Event()
            loop = threading.Thread(target=service.run, args=(stop,), daemon=True)
            loop.start()
            err.write(
                f"ursa demo: {settings.devices} devices (rho {settings.rho}, "
                f"EMD {population.emd_avg:.2f}), K={settings.k}, H={settings.tries}, "
                f"{settings.key_bits}-bit keys, broker {url}\n"
            )
            for i, device_id in enumerate(ids):
                labels = np.repeat(np.arange(10), population.counts[i])
                client = EdgeClient(
                    DeviceConfig(
                        device_id=device_id,
                        federation=FEDERATION,
                        state_dir=Path(tmp) / device_id,
                        broker=BrokerConfig(url=url),
                        obfuscator_pool_size=2,
                        methods=(DeviceDubheSpec(draw=settings.draw),),
                        insecure_test_keys=settings.key_bits < MIN_SECURE_KEY_BITS,
                        trust=operator.device(Path(tmp) / device_id, device_id),
                    ),
                    labels,
                    rng=np.random.default_rng([settings.seed, i]),
                )
                client.start()
                clients.append(client)
            loop.join(settings.timeout_s)
            done = service.is_done
            stop.set()
            loop.join(10)
            stats = [c.transport.stats for c in clients if c.transport is not None]
            crypto_ms = [1000.0 * c.stats.crypto_s for c in clients]
        finally:
            for client in clients:
                client.stop()
            if observer is not None:
                observer.close()
            if broker is not None:
                broker.stop()
    err.write("\n")
    per_round.sort(key=lambda r: int(r["round"]))
    distances = [float(r["l1_to_uniform"]) for r in per_round]
    result: dict[str, Any] = {
        "settings": asdict(settings),
        "population_emd_avg": population.emd_avg,
        "population_rho": population.rho,
        "completed": done,
        "rounds": per_round,
        "mean_l1_to_uniform": float(np.mean(distances)) if distances else None,
        "random_selection_l1_to_uniform": baseline,
        "crypto_ms_per_device_mean": float(np.mean(crypto_ms)),
        "crypto_ms_per_device_max": float(np.max(crypto_ms)),
        "bytes_sent_per_device": float(np.mean([s.bytes_sent for s in stats])),
        "bytes_received_per_device": float(np.mean([s.bytes_received for s in stats])),
        "messages_per_device": float(
            np.mean([s.messages_sent + s.messages_received for s in stats])
        ),
        "wall_s": time.perf_counter() - started,
    }
    if as_json:
        out.write(json.dumps(result) + "\n")
    else:
        _print_summary(out, result)
    return result


def _print_summary(out: TextIO, result: dict[str, Any]) -> None:
    for entry in result["rounds"]:
        out.write(
            f"round {entry['round']:>3}  try {entry['try']}  "
            f"||p_o - p_u||_1 = {entry['l1_to_uniform']:.3f}\n"
        )
    mean = result["mean_l1_to_uniform"]
    random_l1 = result["random_selection_l1_to_uniform"]
    if mean is not None:
        out.write(
            f"mean ||p_o - p_u||_1: Dubhe {mean:.3f}, random selection {random_l1:.3f} "
            f"({100 * (1 - mean / random_l1):.1f}% lower)\n"
        )
    out.write(
        f"per device: crypto {result['crypto_ms_per_device_mean']:.1f} ms (max "
        f"{result['crypto_ms_per_device_max']:.1f}), sent "
        f"{result['bytes_sent_per_device'] / 1024:.1f} KiB, received "
        f"{result['bytes_received_per_device'] / 1024:.1f} KiB, "
        f"{result['messages_per_device']:.0f} messages\n"
    )
    if not result["completed"]:
        out.write("NOT all rounds completed before the timeout\n")
