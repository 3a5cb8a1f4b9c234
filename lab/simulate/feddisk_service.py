"""FedDisk on the production runtime: `ursa simulate train --engine production`.

A simulated FedDisk federation, as Flower's simulation runs the production
apps: the production coordinator (`ursa.tools.compose.build_coordinator`:
``[[methods]]`` random selection and ``kind = "feddisk"``, so the method
table builds its `FeddiskPlugin` with the MADE's and the classifier's
`TrainingPlugin`, real store in a temporary state dir, key epochs, secure
aggregation) and one production `EdgeClient` per device
(`ursa.tools.compose.build_device`: its ``[training]`` data file, the
`TorchTrainer` the device's method table wraps in a `FeddiskTrainer`, its
`FedDisk` method), all on one synchronous `InMemoryBus` (every message
encoded, routed by topic and decoded, as over MQTT) under a fake clock that
jumps to the coordinator's next deadline. Phase 1 is the plugin's: MADE
rounds, the blind loss mean of every device's validation NLL (Paillier at
``key_bits``), the agent's signed verdict, the switch; the devices then
weight their samples and the classifier's rounds run under secure
aggregation (the production default: masks, fixed point, the devices' key
steps).

What differs from the reference engine (`ursa.lab.simulate.feddisk` and the
simulator's round loop) is where the random numbers come from and how
devices train, not the algorithm: the coordinator's seeded generator picks
the K participants, each device splits off its MADE validation set and seeds
its local MADE from its own seed (the reference uses one stream and starts
the local MADEs from the global initial MADE), the classifier trains in torch
per device (the reference's vectorised numpy twin), the loss mean is rounded
to the codec's fixed point and the update sum to secure aggregation's. Both
engines start from the same classifier and MADE weights. The figures agree
within noise, not to the digit (the test says how close).

The bus being synchronous, the whole run plays inside the calls that start
the devices and tick the coordinator. After ``rounds`` classifier rounds the
harness has the bus drop every delivery, so no next round starts and the
federation never reaches its end (the devices' ONNX export of the final
model is not what is simulated).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
    TrainingSection,
)
from ursa.coordinator.methods_config import FeddiskSpec, RandomSpec
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.config import DeviceConfig, DeviceTrainingConfig
from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.edge_sdk.methods.feddisk.trainer import FeddiskTrainer
from ursa.edge_sdk.methods_config import FeddiskDeviceSpec, RandomDeviceSpec
from ursa.edge_sdk.training import TrainConfig
from ursa.lab.simulate.fake_clock import FakeClock
from ursa.lab.simulate.feddisk import MadePhaseSettings
from ursa.lab.simulate.quiet_runtime import quiet_runtime
from ursa.lab.simulate.stuck_run import ServiceRunError
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR
from ursa.tools.compose import (
    RoundHooks,
    TrainingHooks,
    build_coordinator,
    build_device,
)
from ursa.tools.data.federation import Federation

if TYPE_CHECKING:
    from ursa.coordinator.service import CoordinatorService
    from ursa.coordinator.training import TrainingRoundReport

__all__ = [
    "FeddiskServiceRun",
    "device_settings",
    "feddisk_service_run",
]

FEDERATION = "fdsim"
DEVICE_PREFIX = "dev"
WINDOW_S = 10.0
"""Every window and timeout of the simulated run (the clock jumps them)."""
MAX_IDLE_TICKS = 200
"""Ticks without progress before the run is declared stuck."""


@dataclass(frozen=True)
class FeddiskServiceRun:
    """What one production FedDisk run did.

    Attributes:
        made_rounds: MADE training rounds before the switch.
        best_version: The MADE version the devices' weights come from.
        switch_round: The first classifier round (``made_rounds + 1``).
        selections: Per classifier round, the participants (device indices).
        weighted_devices: Devices whose trainer holds non-uniform sample weights.
        weights: The pooled sample weights' min, max and spread.
        handler_errors: Messages whose handler raised on the bus (0 if healthy).
        elapsed_s: Wall time of the run, the start-up included.
    """

    made_rounds: int
    best_version: int | None
    switch_round: int | None
    selections: tuple[tuple[int, ...], ...]
    weighted_devices: int
    weights: dict[str, float]
    handler_errors: int
    elapsed_s: float

    def summary(self) -> dict[str, Any]:
        """The report's ``feddisk`` diagnostics (JSON-ready)."""
        return {
            "engine": "production",
            "made_rounds": self.made_rounds,
            "best_made_round": self.best_version,
            "switch_round": self.switch_round,
            "weighted_devices": self.weighted_devices,
            "weights": self.weights,
            "handler_errors": self.handler_errors,
        }


def device_settings(made: MadePhaseSettings) -> FeddiskSettings:
    """The device's ``[[methods]] feddisk`` settings of the simulator's phase 1."""
    return FeddiskSettings(
        made_hidden_sizes=(made.made_hidden,),
        made_lr=made.made_lr,
        made_batch_size=made.made_batch_size,
        made_epochs_per_round=made.made_epochs_per_round,
        val_fraction=made.val_fraction,
        local_made_epochs_per_check=made.local_made_epochs_per_check,
        local_made_max_epochs=made.local_made_max_epochs,
        local_made_patience=made.local_made_patience,
        made_patience=made.made_patience,
        classifier_hidden=made.classifier_hidden,
        classifier_epochs=made.classifier_epochs,
        classifier_lr=made.classifier_lr,
        classifier_batch_size=made.classifier_batch_size,
        crossfit_folds=made.crossfit_folds,
        clip=made.clip,
    )


def feddisk_service_run(
    fed: Federation,
    *,
    initial: Arrays,
    made_initial: Arrays,
    hidden_sizes: tuple[int, ...],
    train: TrainConfig,
    made: MadePhaseSettings,
    rounds: int,
    participants: int,
    seed: int,
    key_bits: int,
    on_model: Callable[[Arrays], None],
) -> FeddiskServiceRun:
    """Run FedDisk on ``fed`` with the production coordinator and devices.

    Args:
        fed: The devices' data (device i is ``dev0000<i>``).
        initial: The classifier's version 0.
        made_initial: The global MADE's version 0.
        hidden_sizes: The classifier MLP's hidden widths.
        train: Every device's local classifier training.
        made: Phase 1's settings (``max_made_rounds`` is the coordinator's cap).
        rounds: Classifier rounds to run after the switch.
        participants: K per round (random selection, the coordinator's seed).
        seed: The coordinator's seed and the devices' training seeds' root.
        key_bits: The epochs' Paillier modulus (below 2048: test-only keys).
        on_model: Called with the classifier's global model after each round.

    Raises:
        ValueError: a bad parameter (the configs' own checks), or FedVC.
        ServiceRunError: the run stopped making progress.
    """
    if train.fedvc_samples is not None:
        raise ValueError("FedDisk's production engine has no FedVC (FedAvg only)")
    if rounds < 1:
        raise ValueError(f"need at least one classifier round, got {rounds}")
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="ursa-fdsim-"))
    bus, clock = InMemoryBus(synchronous=True), FakeClock(1_000_000.0)
    model_options = {
        "input_dim": fed.input_dim,
        "num_classes": fed.num_classes,
        "hidden_sizes": list(hidden_sizes),
    }
    trained: list[tuple[int, ...]] = []

    def evaluate(round_index: int, version: int, arrays: Arrays) -> dict[str, Any]:
        if len(trained) < rounds:
            on_model(arrays)
        return {}

    def on_round(record: TrainingRoundReport) -> None:
        trained.append(tuple(sorted(_index(d) for d in record.selected)))
        if len(trained) >= rounds:  # the bus goes quiet: no next round, no end
            bus.drop_filter = _drop_all

    hooks = TrainingHooks(classifier=RoundHooks(evaluate, on_round))
    config = _coordinator_config(
        fed, root, initial, made_initial, made, rounds, participants, seed, key_bits
    )
    settings = device_settings(made)
    clients: list[EdgeClient] = []
    coordinator: CoordinatorService | None = None
    try:
        with quiet_runtime():
            coordinator = build_coordinator(
                config,
                hooks=hooks,
                transport=InMemoryTransport(bus, COORDINATOR),
                clock=clock,
            )
            coordinator.start()
            for i in range(fed.num_devices):
                client = _device(
                    bus, root, fed, i, model_options, train, settings, seed, key_bits
                )
                clients.append(client)
                client.start()
            _drive(coordinator, clients, clock, lambda: len(trained) >= rounds)
        return _result(coordinator, clients, bus, trained[:rounds], started)
    finally:
        with quiet_runtime():
            for client in clients:
                client.stop()
            if coordinator is not None:
                coordinator.stop()
        bus.close()
        shutil.rmtree(root, ignore_errors=True)


def _index(device_id: str) -> int:
    """The federation's row of a simulated device (``dev00007`` is 7)."""
    return int(device_id.removeprefix(DEVICE_PREFIX))


def _drop_all(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
    return True


def _coordinator_config(
    fed: Federation,
    root: Path,
    initial: Arrays,
    made_initial: Arrays,
    made: MadePhaseSettings,
    rounds: int,
    participants: int,
    seed: int,
    key_bits: int,
) -> CoordinatorConfig:
    initial_file, made_file = root / "initial.ursw", root / "made.ursw"
    initial_file.write_bytes(arrays_to_bytes(initial))
    made_file.write_bytes(arrays_to_bytes(made_initial))
    feddisk = FeddiskSpec(
        made_initial_weights=made_file,
        max_made_rounds=made.max_made_rounds,
        loss_timeout_s=WINDOW_S,
        verdict_timeout_s=WINDOW_S,
    )
    return CoordinatorConfig(
        federation=FEDERATION,
        state_dir=root / COORDINATOR,
        enrolment=EnrolmentConfig(mode="tofu"),
        min_devices=fed.num_devices,
        k=participants,
        tries=1,
        # one round more than run: the harness stops before the federation's end
        rounds=made.max_made_rounds + rounds + 1,
        key_bits=key_bits,
        insecure_test_keys=key_bits < 2048,
        seed=seed,
        deadlines=DeadlinesConfig(
            key_epoch_s=WINDOW_S,
            registration_s=WINDOW_S,
            volunteer_s=WINDOW_S,
            distributions_s=WINDOW_S,
            agent_s=WINDOW_S,
            training_s=4 * WINDOW_S,
        ),
        methods=(RandomSpec(), feddisk),
        training=TrainingSection.model_validate(
            {"initial_weights": initial_file, "update_timeout_s": WINDOW_S}
        ),
    )


def _device(
    bus: InMemoryBus,
    root: Path,
    fed: Federation,
    index: int,
    model_options: dict[str, Any],
    train: TrainConfig,
    settings: FeddiskSettings,
    seed: int,
    key_bits: int,
) -> EdgeClient:
    device_id = f"{DEVICE_PREFIX}{index:05d}"
    state_dir = root / device_id
    data = fed.devices[index]
    data_file = root / f"{device_id}.npz"  # beside its state dir, which it creates
    np.savez(data_file, x=data.x, y=data.y)
    device_seed = int(np.random.SeedSequence([seed, index]).generate_state(1)[0])
    config = DeviceConfig(
        device_id=device_id,
        federation=FEDERATION,
        state_dir=state_dir,
        obfuscator_pool_size=0,  # no background thread: one thread runs all
        insecure_test_keys=key_bits < 2048,
        methods=(
            RandomDeviceSpec(),
            FeddiskDeviceSpec.model_validate(settings.model_dump()),
        ),
        training=DeviceTrainingConfig(
            data_file=str(data_file),
            model_options=model_options,
            train=train.model_dump(exclude={"seed"}),
            seed=device_seed,
        ),
    )
    topic, payload = device_will(config)
    transport = InMemoryTransport(bus, device_id, will=(topic, payload, True))
    return build_device(
        config, transport=transport, rng=np.random.default_rng(device_seed)
    )


def _drive(
    coordinator: CoordinatorService,
    clients: list[EdgeClient],
    clock: FakeClock,
    finished: Callable[[], bool],
) -> None:
    """Tick until ``finished``: jump the clock to the next deadline each time.

    The bus is synchronous, so when a tick returns every answer it caused has
    been handled: the next event is a deadline (silence), never a message.
    """
    idle = 0
    while not finished():
        for client in clients:
            client.poll()
        before = _progress(coordinator)
        deadline = coordinator.state.deadline_at
        now = clock()
        clock.advance(deadline - now + 0.001 if deadline and deadline > now else 1.0)
        coordinator.tick()
        idle = 0 if _progress(coordinator) != before else idle + 1
        if coordinator.is_done or idle > MAX_IDLE_TICKS:
            state = coordinator.state
            raise ServiceRunError(
                f"the simulated FedDisk federation stopped at stage {state.stage}, "
                f"round {state.round}"
            )


def _progress(coordinator: CoordinatorService) -> tuple[Any, ...]:
    state = coordinator.state
    return (
        str(state.stage),
        state.round,
        coordinator.transport_stats.messages_received,
    )


def _result(
    coordinator: CoordinatorService,
    clients: list[EdgeClient],
    bus: InMemoryBus,
    selections: list[tuple[int, ...]],
    started: float,
) -> FeddiskServiceRun:
    from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin

    plugin = coordinator.plugin
    if not isinstance(plugin, FeddiskPlugin):  # pragma: no cover - the config's
        raise ServiceRunError(f"the coordinator runs {type(plugin).__name__}")
    weights = [w for w in map(_sample_weights, clients) if w is not None]
    pooled = np.concatenate(weights) if weights else np.ones(1)
    return FeddiskServiceRun(
        made_rounds=plugin.made_rounds,
        best_version=plugin.best_version,
        switch_round=plugin.switch_round,
        selections=tuple(selections),
        weighted_devices=len(weights),
        weights={
            "min": float(pooled.min()),
            "max": float(pooled.max()),
            "std": float(pooled.std()),
            "p10": float(np.percentile(pooled, 10)),
            "p90": float(np.percentile(pooled, 90)),
        },
        handler_errors=bus.handler_errors,
        elapsed_s=time.perf_counter() - started,
    )


def _sample_weights(client: EdgeClient) -> npt.NDArray[np.float64] | None:
    trainer = client.data.trainer
    return trainer.sample_weights if isinstance(trainer, FeddiskTrainer) else None
