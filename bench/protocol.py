"""`ursa bench protocol`: a real MQTT fleet against the real coordinator.

N devices run ursa's own device logic (`build_device`, the `EdgeClient` of
`ursa device run`) in ``--processes`` worker processes, each driving all its
devices from one `MqttPool` loop: one real MQTT connection per device, no
thread per device (the obfuscator pool is off, so a device's Paillier work
happens when the protocol asks for it, on that loop). The coordinator is
``ursa coordinator serve`` in its own process, so its
CPU and RSS are its own; the bench starts its own Mosquitto (password file
with one random password per device, ursa's ACL, open-file limit raised).

Enrolment is trust on first use: a pinned list does not spare the per-device
`Hello`/`EnrolResult` handshake (the device learns the coordinator's identity
from it), and today's coordinator re-reads ``enrolment.json`` on every Hello.
Connections open at ``--connect-rate`` per second over all workers; refusals
and losses are retried by the pool with backoff.

An observer subscribed to the federation timestamps every message. Figures:

* ``enrolment_s``: workers told to connect -> the key-epoch notice (the
  coordinator starts the epoch once all N devices are online and enrolled);
* ``key_epoch_s``: the notice -> the published registry sum;
* ``selection_round_s_median``: announce -> signed selection, over rounds
  (budget: at most `ROUND_BUDGET_S`; the command exits 1 when missed);
* ``explicit_replies``: whether the rounds' announces asked every device to
  answer (the coordinator's default ``[selection] explicit_replies_below``
  puts the bench's 200 devices there: no window is waited out);
* ``coordinator_cpu_s_per_round``: the coordinator process's user+system CPU
  from one round's end (round 1: the registry sum) to the next, mean;
* ``coordinator_inbound_per_round``: messages on device up topics that carry
  the round's number (what the coordinator receives for it), mean;
* ``broker_deliveries_per_round``: computed from the observed traffic of
  the round: a global message reaches N devices, an up or down message one
  client (the observer's own copies are not counted);
* ``coordinator_rss_mib``: its resident set after the last round;
* per device and round: messages and payload bytes of the selection round's
  kinds sent and received (a device receives every global message).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import SecretStr

from ursa.bench.common import Budget, report
from ursa.coordinator.config import BrokerConfig as CoordinatorBroker
from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
)
from ursa.crypto.paillier_keys import MIN_SECURE_KEY_BITS
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import RoundAnnounce
from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.topics import parse_topic
from ursa.tools.broker.mosquitto import MosquittoBroker

if TYPE_CHECKING:
    from ursa.bench.mqtt_pool import MqttPool, PooledTransport
    from ursa.edge_sdk.client import EdgeClient

logger = logging.getLogger(__name__)

FEDERATION = "bench"
_ROUND_KINDS = {
    "round_announce",
    "volunteer",
    "try_assignment",
    "encrypted_distribution",
    "try_sums",
    "agent_answer",
    "selection_result",
}
"""A selection round's messages (the per-device traffic figures count these)."""
_SERVE = "import sys; from ursa.tools.cli.app import main; sys.exit(main())"
"""`ursa coordinator serve` in a fresh interpreter (its arguments follow)."""
ROUND_BUDGET_S = 1.0
"""Issue 33: a selection round at 200 devices (K = 20, H = 5) in at most 1 s."""
OPEN_FILES = 20_000
"""The open-file limit asked for Mosquitto and the workers (capped at the hard one)."""


def raise_open_files(wanted: int = OPEN_FILES) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit towards `wanted`; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def _scratch() -> str | None:
    """Where the devices' stores go: tmpfs when there is one.

    Every device commits its SQLite store on each step; on one shared disk
    N devices' fsyncs queue behind each other, which real devices (each with
    its own flash) never do.
    """
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class FleetSetupError(RuntimeError):
    """The fleet could not be set up (a worker died before it was ready)."""


@dataclass(frozen=True)
class WorkerSpec:
    """What one worker process runs (picklable)."""

    index: int
    devices: list[tuple[str, str]]  # (device id, broker password)
    port: int
    state_root: str
    connect_rate: float
    poll_s: float = 1.0


# --- the worker process ----------------------------------------------------------


def _labels(index: int, rng: np.random.Generator) -> np.ndarray:
    main = index % 10
    return np.concatenate(
        [np.full(int(rng.integers(40, 80)), main), rng.integers(0, 10, 20)]
    )


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Build the devices, connect them at the given rate, serve until told to stop."""
    from ursa.bench.mqtt_pool import MqttPool
    from ursa.edge_sdk.client import device_will
    from ursa.edge_sdk.config import BrokerConfig, DeviceConfig
    from ursa.tools.compose import build_device

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    raise_open_files()
    pool = MqttPool()
    clients: list[tuple[EdgeClient, PooledTransport]] = []
    for device_id, password in spec.devices:
        index = int(device_id[1:])
        config = DeviceConfig(
            device_id=device_id,
            federation=FEDERATION,
            state_dir=Path(spec.state_root) / device_id,
            broker=BrokerConfig(
                url=f"mqtt://127.0.0.1:{spec.port}",
                username=device_id,
                password=SecretStr(password),
            ),
            obfuscator_pool_size=0,
            insecure_test_keys=True,  # the bench's own coordinator picks --key-bits
        )
        transport = pool.transport(
            config.broker.mqtt_config(device_id, will=device_will(config))
        )
        client = build_device(
            config,
            labels=_labels(index, np.random.default_rng(index)),
            transport=transport,
            rng=np.random.default_rng(index),
        )
        clients.append((client, transport))
    conn.send(("ready", len(clients)))
    if conn.recv() != "go":
        return
    started = time.process_time()

    def opener(client: EdgeClient) -> Callable[[PooledTransport], None]:
        def on_connected(transport: PooledTransport) -> None:
            if transport.connections == 1:
                client.start()  # connected: subscribes, says Hello, online

        return on_connected

    for i, (client, transport) in enumerate(clients):
        pool.call_later(i / spec.connect_rate, _bind(transport.open, opener(client)))
    slices = 10
    for part in range(slices):
        chunk = [c for i, (c, _) in enumerate(clients) if i % slices == part]
        pool.call_later(spec.poll_s * part / slices, _poller(pool, chunk, spec.poll_s))
    while not conn.poll():
        pool.run_once(0.2)
    conn.recv()
    conn.send(
        {
            "devices": len(clients),
            "connected": sum(t.is_connected for _, t in clients),
            "cpu_s": time.process_time() - started,
            "crypto_s": sum(c.stats.crypto_s for c, _ in clients),
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }
    )
    pool.close()


def _bind(
    fn: Callable[[Callable[[PooledTransport], None]], None],
    arg: Callable[[PooledTransport], None],
) -> Callable[[], None]:
    return lambda: fn(arg)


def _poller(
    pool: MqttPool, chunk: list[EdgeClient], every_s: float
) -> Callable[[], None]:
    """`EdgeClient.poll` for a slice of the devices every `every_s` (started ones)."""
    from ursa.edge_sdk.client import ClientState

    def poll() -> None:
        for client in chunk:
            if client.state is ClientState.RUNNING:
                client.poll()
        pool.call_later(every_s, poll)

    return poll


# --- the parent: broker, coordinator, observer --------------------------------------


@dataclass
class _Recorder:
    """The observer's handler: first arrival per (kind, round), traffic per round."""

    devices: int
    coordinator_pid: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    first: dict[tuple[str, int], float] = field(default_factory=dict)
    first_kind: dict[str, float] = field(default_factory=dict)
    cpu_at: dict[tuple[str, int], float] = field(default_factory=dict)
    inbound: dict[int, int] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)
    traffic: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    """(round, "sent"/"received") -> [messages, payload bytes] over all devices."""
    last_result: int = 0
    explicit: set[int] = field(default_factory=set)
    """Rounds whose announce asked every device to answer."""
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def __call__(self, topic: str, payload: bytes) -> None:
        at = time.perf_counter()
        if not payload:
            return
        try:
            parsed = parse_topic(topic)
            message = decode(payload)
        except ProtocolError:
            return
        kind, rnd = message.kind, message.round
        with self.lock:
            self.first_kind.setdefault(kind, at)
            if (kind, rnd) not in self.first:
                self.first[kind, rnd] = at
                if kind in ("registry_sum", "selection_result", "key_epoch_start"):
                    self.cpu_at[kind, rnd] = process_cpu_s(self.coordinator_pid)
            up = parsed.direction == "up"
            if up:
                self.inbound[rnd] = self.inbound.get(rnd, 0) + 1
            reach = self.devices if parsed.scope == "global" else 1
            self.deliveries[rnd] = self.deliveries.get(rnd, 0) + reach
            if kind in _ROUND_KINDS:
                tally = self.traffic.setdefault(
                    (rnd, "sent" if up else "received"), [0, 0]
                )
                tally[0] += reach
                tally[1] += reach * len(payload)
            if isinstance(message, RoundAnnounce) and message.explicit_replies:
                self.explicit.add(rnd)
            if kind == "selection_result":
                self.last_result = max(self.last_result, rnd)
                self.changed.notify_all()

    def at(self, kind: str) -> float | None:
        """When `kind` was first seen (any round)."""
        with self.lock:
            return self.first_kind.get(kind)

    def cpu(self, kind: str) -> float | None:
        """The coordinator's CPU when `kind` was first seen (any round)."""
        with self.lock:
            found = [v for (k, _), v in self.cpu_at.items() if k == kind]
        return found[0] if found else None


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (0.0 if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def process_rss_mib(pid: int, key: str = "VmRSS") -> float:
    """A memory figure of process `pid` from /proc/<pid>/status, in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return float("nan")


def _coordinator_file(
    tmp: Path,
    port: int,
    password: str,
    devices: int,
    k: int,
    tries: int,
    rounds: int,
    key_bits: int,
) -> Path:
    config = CoordinatorConfig(
        federation=FEDERATION,
        state_dir=tmp / "coordinator",
        broker=CoordinatorBroker(
            url=f"mqtt://127.0.0.1:{port}",
            username="coordinator",
            password=SecretStr(password),
        ),
        enrolment=EnrolmentConfig(mode="tofu"),
        min_devices=devices,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        insecure_test_keys=key_bits < MIN_SECURE_KEY_BITS,
        deadlines=DeadlinesConfig(
            key_epoch_s=600,
            registration_s=600,
            # Under the explicit-replies threshold a round closes once every
            # device answered; above it (silence means no) it waits for K
            # yes-volunteers per try or this window: 10 s leaves 2 loaded
            # cores time to deliver N announces.
            volunteer_s=10,
            distributions_s=60,
            agent_s=60,
            training_s=60,
        ),
    )
    data = config.model_dump(mode="json", exclude_defaults=True)
    data["broker"]["password"] = password
    path = tmp / "coordinator.json"
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def run(
    *,
    as_json: bool,
    devices: int = 200,
    processes: int = 2,
    k: int = 20,
    tries: int = 5,
    rounds: int = 3,
    key_bits: int = 1024,
    connect_rate: float = 500.0,
    timeout_s: float = 900.0,
) -> int:
    """Run the fleet on Mosquitto and report; 1 if the round budget is missed."""
    began = time.perf_counter()
    raise_open_files()
    processes = max(1, min(processes, devices))
    ids = [f"d{i:05d}" for i in range(devices)]
    passwords = {device_id: secrets.token_urlsafe(18) for device_id in ids}
    context = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="ursa-bench-", dir=_scratch()) as tmp_name,
        MosquittoBroker(
            devices=passwords,
            readers=["observer"],
            work_dir=Path(tmp_name) / "broker",
            open_files=OPEN_FILES,
        ) as broker,
    ):
        tmp = Path(tmp_name)
        recorder = _Recorder(devices)
        observer = MqttTransport(broker.mqtt_config("observer"))
        observer.set_handler(recorder)
        observer.subscribe(f"ursa/v1/{FEDERATION}/#")
        observer.connect()
        config_path = _coordinator_file(
            tmp,
            broker.port,
            broker.credentials["coordinator"],
            devices,
            k,
            tries,
            rounds,
            key_bits,
        )
        log = (tmp / "coordinator.log").open("wb")
        coordinator = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SERVE,
                "--log-level",
                "WARNING",
                "coordinator",
                "serve",
                "--config",
                str(config_path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        recorder.coordinator_pid = coordinator.pid
        workers: list[tuple[Any, Connection]] = []
        try:
            for index in range(processes):
                mine = ids[index::processes]
                parent, child = context.Pipe()
                spec = WorkerSpec(
                    index=index,
                    devices=[(d, passwords[d]) for d in mine],
                    port=broker.port,
                    state_root=str(tmp / "devices"),
                    connect_rate=connect_rate / processes,
                )
                process = context.Process(target=worker_main, args=(spec, child))
                process.start()
                workers.append((process, parent))
            for process, conn in workers:
                if not conn.poll(timeout_s) or conn.recv()[0] != "ready":
                    raise FleetSetupError(f"worker {process.name} did not start")
            go = time.perf_counter()
            for _, conn in workers:
                conn.send("go")
            with recorder.changed:
                recorder.changed.wait_for(
                    lambda: (
                        recorder.last_result >= rounds or coordinator.poll() is not None
                    ),
                    timeout_s,
                )
            rss = process_rss_mib(coordinator.pid)
            peak = process_rss_mib(coordinator.pid, "VmHWM")
            worker_stats = []
            for _, conn in workers:
                conn.send("stop")
            for _, conn in workers:
                if conn.poll(30):
                    worker_stats.append(conn.recv())
            total_s = time.perf_counter() - began
        finally:
            for process, _ in workers:
                process.join(30)
                if process.is_alive():
                    process.kill()
            coordinator.terminate()
            try:
                coordinator.wait(15)
            except subprocess.TimeoutExpired:
                coordinator.kill()
                coordinator.wait()
            log.close()
            observer.close()
        figures = _figures(recorder, go, devices, rounds, key_bits)
        figures.update(
            coordinator_rss_mib=rss,
            coordinator_peak_rss_mib=peak,
            device_processes=processes,
            k=k,
            tries=tries,
            devices_connected_at_end=sum(int(s["connected"]) for s in worker_stats),
            device_cpu_s=sum(float(s["cpu_s"]) for s in worker_stats),
            device_crypto_s=sum(float(s["crypto_s"]) for s in worker_stats),
            device_process_rss_mib_max=max(
                (float(s["rss_mib"]) for s in worker_stats), default=None
            ),
            total_s=total_s,
            broker_deliveries_source="computed from observed traffic",
            load_average_1m=os.getloadavg()[0],
        )
        if figures["rounds_completed"] < rounds:
            tail = (tmp / "coordinator.log").read_text(errors="replace")[-1500:]
            logger.error("coordinator log (tail):\n%s", tail)
    budgets = [
        Budget("rounds_completed", at_least=rounds),
        Budget("selection_round_s_median", at_most=ROUND_BUDGET_S),
    ]
    return report("ursa bench protocol", figures, budgets, as_json=as_json)


def _figures(
    recorder: _Recorder, go: float, devices: int, rounds: int, key_bits: int
) -> dict[str, Any]:
    """The figures; None where a phase did not complete."""
    notice, registry = recorder.at("key_epoch_start"), recorder.at("registry_sum")
    notice_cpu, previous = recorder.cpu("key_epoch_start"), recorder.cpu("registry_sum")
    round_s, cpu_s, inbound, deliveries = [], [], [], []
    with recorder.lock:
        for r in range(1, rounds + 1):
            begin = recorder.first.get(("round_announce", r))
            end = recorder.first.get(("selection_result", r))
            if begin is None or end is None:
                break
            round_s.append(end - begin)
            cpu = recorder.cpu_at.get(("selection_result", r))
            if previous is not None and cpu is not None:
                cpu_s.append(cpu - previous)
            previous = cpu
            inbound.append(recorder.inbound.get(r, 0))
            deliveries.append(recorder.deliveries.get(r, 0))
        per = devices * max(1, len(round_s))
        traffic = {
            f"{unit}_{way}_per_device_round": sum(
                recorder.traffic.get((r, way), [0, 0])[column]
                for r in range(1, len(round_s) + 1)
            )
            / per
            for way in ("sent", "received")
            for column, unit in enumerate(("messages", "bytes"))
        }
    registry_cpu = recorder.cpu("registry_sum")
    return {
        "devices": devices,
        "rounds_completed": len(round_s),
        "key_bits": key_bits,
        "enrolment_s": _minus(notice, go),
        "key_epoch_s": _minus(registry, notice),
        "coordinator_cpu_s_key_epoch": _minus(registry_cpu, notice_cpu),
        "explicit_replies": bool(round_s)
        and all(r in recorder.explicit for r in range(1, len(round_s) + 1)),
        "selection_round_s_median": statistics.median(round_s) if round_s else None,
        "selection_round_s_max": max(round_s) if round_s else None,
        "coordinator_cpu_s_per_round": statistics.fmean(cpu_s) if cpu_s else None,
        "coordinator_inbound_per_round": statistics.fmean(inbound) if inbound else None,
        "broker_deliveries_per_round": statistics.fmean(deliveries)
        if deliveries
        else None,
        **traffic,
    }


def _minus(end: float | None, begin: float | None) -> float | None:
    return None if end is None or begin is None else end - begin
