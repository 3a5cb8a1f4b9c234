"""Dubhe on the production runtime: `ursa simulate selection --engine service`.

A simulated federation, as Flower's simulation runs the production apps: the
production `CoordinatorService` (which builds its `DubheSelection` through
`ursa.coordinator.methods.registry.selection_method`, with its real store in
a temporary state dir, router, signing point, key epoch and clock) and one
production `EdgeClient` per device (its Dubhe method, registration and
roster), all on one synchronous `InMemoryBus` (every message encoded, routed
by topic and decoded, as over MQTT), under a fake clock that jumps from one
window's end to the next. The key epoch is real: the agent's Paillier key
(at a test-only size, ``insecure_test_keys``: the crypto is not what is
measured here), the encrypted registrations and registry sum, the encrypted
distributions, the agent's signed answer. Each device holds the labels of its
row of the population (its label distribution is that row); the coordinator
is given the sigma the lab's search adopted as ``[registry] sigma``.

What differs from the fast engine (`ursa.lab.simulate.selection_draws`) is
only where the random numbers come from: each device draws its coins from
its own generator, the coordinator trims and tops up from its seeded one, and
the agent compares the 24-bit fixed-point sums it decrypted. The selections
are therefore not the fast engine's, but their distribution is (the test
checks the mean ``||p_o - p_u||_1`` within three standard errors). The same
seed gives the same selections under the paper's draw; the stratified draw's
shared seed comes from the epoch's secret key, fresh each run. No
participation cap (``max_participation = 1.0``): the paper has none and the
fast engine neither.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
    RegistryConfig,
)
from ursa.coordinator.methods.registry import VOLUNTEER_ROWS
from ursa.coordinator.methods_config import Draw, DubheSpec
from ursa.coordinator.service import CoordinatorService
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.methods_config import DubheDeviceSpec
from ursa.lab.simulate.fake_clock import FakeClock
from ursa.lab.simulate.quiet_runtime import quiet_runtime
from ursa.lab.simulate.stuck_run import ServiceRunError
from ursa.protocol.codebook import Codebook
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR

__all__ = [
    "SERVICE_KEY_BITS",
    "SERVICE_MAX_CLIENTS",
    "ServiceRounds",
    "service_rounds",
]

FEDERATION = "selsim"
SERVICE_KEY_BITS = 512
"""Paillier modulus of the simulated key epochs (test-only: not what is measured)."""
SERVICE_MAX_CLIENTS = 2000
"""Largest N a service run accepts without ``force`` (one client per device)."""
WINDOW_S = 10.0
"""Every window of the simulated run; the fake clock jumps one window per tick."""
MAX_TICKS_PER_ROUND = 200
"""Ticks a round may take before the run is declared stuck."""

STREAM_DEVICES = 100
"""Random stream of the devices' generators (``[seed, STREAM_DEVICES, i]``),
apart from `ursa.lab.simulate.selection_draws`' streams."""


@dataclass(frozen=True)
class ServiceRounds:
    """What one simulated federation selected.

    Attributes:
        selections: Rounds x K device indices (rows of the population), sorted.
        volunteers: Per round, how many devices drew yes in try 0.
        key_epochs: Key epochs the run took (1 unless the agent failed).
        elapsed_s: Wall time of the run, the start-up included.
    """

    selections: NDArray[np.int64]
    volunteers: NDArray[np.int64]
    key_epochs: int
    elapsed_s: float


def device_id(index: int) -> str:
    """The simulated device of population row ``index``."""
    return f"d{index:05d}"


def check_service_size(num_clients: int, *, force: bool = False) -> None:
    """Refuse a service run above `SERVICE_MAX_CLIENTS` unless forced.

    Raises:
        ValueError: ``num_clients`` is too large and ``force`` is False.
    """
    if num_clients > SERVICE_MAX_CLIENTS and not force:
        raise ValueError(
            f"--engine service with N={num_clients} > {SERVICE_MAX_CLIENTS}: one "
            "device runtime and state dir per device; pass --force to run it anyway"
        )


def _scratch() -> str | None:
    """A memory-backed temp dir when there is one: every state write is fsynced."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _draw(name: str) -> Draw:
    """``name`` as the configs' draw (they accept these two only).

    Raises:
        ValueError: another name.
    """
    if name == "paper":
        return "paper"
    if name == "stratified":
        return "stratified"
    raise ValueError(f"unknown draw {name!r}: 'paper' or 'stratified'")


def _labels(row: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.repeat(np.arange(row.size, dtype=np.int64), row)


def service_rounds(
    counts: NDArray[np.int64],
    codebook: Codebook,
    sigma: Sequence[float],
    *,
    k: int,
    tries: int,
    rounds: int,
    seed: int,
    draw: str = "paper",
    key_bits: int = SERVICE_KEY_BITS,
) -> ServiceRounds:
    """Run ``rounds`` Dubhe rounds of a federation of ``counts``' devices.

    Args:
        counts: N x C label counts, one row per device (its local data).
        codebook: The registry's classes and groups.
        sigma: One threshold per group but the last (the adopted sigma).
        k: Participants per round.
        tries: H, the tentative sets per round.
        rounds: How many rounds.
        seed: The coordinator's seed and the devices' generators' root.
        draw: ``"paper"`` or ``"stratified"``.
        key_bits: The Paillier modulus (512 or more).

    Raises:
        ValueError: a bad population or parameter (the configs' own checks).
        ServiceRunError: the run did not finish its rounds.
    """
    started = time.perf_counter()
    kind = _draw(draw)
    table = np.asarray(counts, dtype=np.int64)
    n = table.shape[0]
    root = Path(tempfile.mkdtemp(prefix="ursa-selsim-", dir=_scratch()))
    bus, clock = InMemoryBus(synchronous=True), FakeClock(1_000_000.0)
    windows = DeadlinesConfig(
        key_epoch_s=WINDOW_S,
        registration_s=WINDOW_S,
        volunteer_s=WINDOW_S,
        distributions_s=WINDOW_S,
        agent_s=WINDOW_S,
        training_s=WINDOW_S,
    )
    config = CoordinatorConfig(
        federation=FEDERATION,
        state_dir=root / COORDINATOR,
        enrolment=EnrolmentConfig(mode="tofu"),
        min_devices=n,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        insecure_test_keys=True,
        seed=seed,
        deadlines=windows,
        registry=RegistryConfig(
            num_classes=codebook.num_classes,
            groups=codebook.groups,
            sigma=(*sigma, 0.0),
        ),
        methods=(DubheSpec(draw=kind, max_participation=1.0),),
    )
    clients: list[EdgeClient] = []
    with quiet_runtime():
        coordinator = CoordinatorService(
            config, transport=InMemoryTransport(bus, COORDINATOR), clock=clock
        )
    try:
        with quiet_runtime():
            coordinator.start()
            for i in range(n):
                client = _device(bus, root, i, table[i], kind, seed)
                clients.append(client)
                client.start()
            for _ in range(MAX_TICKS_PER_ROUND * (rounds + 1)):
                if coordinator.is_done:
                    break
                clock.advance(WINDOW_S)
                coordinator.tick()
            if not coordinator.is_done:
                raise ServiceRunError(
                    f"the simulated federation stopped at {coordinator.state}"
                )
            return _collected(coordinator, n, rounds, started)
    finally:
        with quiet_runtime():
            for client in clients:
                client.stop()
            coordinator.stop()
        shutil.rmtree(root, ignore_errors=True)


def _device(
    bus: InMemoryBus,
    root: Path,
    index: int,
    row: NDArray[np.int64],
    draw: Draw,
    seed: int,
) -> EdgeClient:
    config = DeviceConfig(
        device_id=device_id(index),
        federation=FEDERATION,
        state_dir=root / device_id(index),
        obfuscator_pool_size=0,
        methods=(DubheDeviceSpec(draw=draw),),
        insecure_test_keys=True,
    )
    topic, payload = device_will(config)
    transport = InMemoryTransport(bus, config.device_id, will=(topic, payload, True))
    return EdgeClient(
        config,
        _labels(row),
        transport=transport,
        rng=np.random.default_rng([seed, STREAM_DEVICES, index]),
    )


def _first_draw(stored: bytes) -> bool:
    """Whether a stored answer (Dubhe's JSON list of H draws) drew yes in try 0."""
    draws = json.loads(stored)
    return isinstance(draws, list) and bool(draws) and bool(draws[0])


def _collected(
    coordinator: CoordinatorService, n: int, rounds: int, started: float
) -> ServiceRounds:
    """The rounds' selections and try-0 volunteers, read from the store."""
    store = coordinator.store
    method, prefix = VOLUNTEER_ROWS
    index = {device_id(i): i for i in range(n)}
    selections, volunteers, epochs = [], [], set()
    for r in range(1, rounds + 1):
        record = store.round(r)
        if record is None or record.selected is None:
            raise ServiceRunError(f"round {r} has no selection")
        selections.append(sorted(index[d] for d in record.selected))
        epochs.add(record.epoch)
        drawn = store.method_rows(method, f"{prefix}{r}").values()
        volunteers.append(sum(1 for draws in drawn if _first_draw(draws)))
    return ServiceRounds(
        selections=np.asarray(selections, dtype=np.int64),
        volunteers=np.asarray(volunteers, dtype=np.int64),
        key_epochs=len(epochs),
        elapsed_s=time.perf_counter() - started,
    )
