"""One run of `ursa bench learning`: a whole federation in one process, on one thread.

The real coordinator (`ursa.tools.compose.build_coordinator`, with the
training plugin of its ``[[methods]]``) and real `EdgeClient` devices
(`ursa.tools.compose.build_device`: torch trainer, the devices' method
plugins) share a synchronous `InMemoryBus`, so a publish is handled, and
answered, before it returns. The population and settings are `ursa demo`'s
(`ursa.tools.demo`): digits dealt out to the devices with Dubhe's global
imbalance (rho, average EMD), the MLP, the local training, the coordinator
config. Only the broker and the processes differ, so a run is deterministic
for its seed and much faster than the demo.

Time is a `SteppedClock`: when nothing is in flight the harness moves it to
the coordinator's next deadline (a volunteering window closes when it runs
out, as silence means no) and ticks. The harness, not the coordinator, knows
each device's labels and the test split: it scores every global model and
measures each selected set's class balance.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.methods_config import MethodSpec
    from ursa.coordinator.service import CoordinatorService
    from ursa.coordinator.training import TrainingRoundReport
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.method import MethodFactory
    from ursa.tools.demo.settings import TrainingDemoSettings

__all__ = [
    "Combination",
    "LearningStalledError",
    "SteppedClock",
    "UnsupportedCombinationError",
    "run_federation",
]

logger = logging.getLogger("ursa.bench.learning")

FIRST_STEP_S = 0.5
MAX_IDLE_S = 3600.0
"""Simulated seconds without a new round before a run is declared stuck."""
TARGET_ACCURACY = 0.85


class UnsupportedCombinationError(ValueError):
    """A combination this build cannot run (the message says why)."""


class LearningStalledError(RuntimeError):
    """The federation made no progress for `MAX_IDLE_S` simulated seconds."""


@dataclass(frozen=True)
class Combination:
    """A method combination: ``methods`` as ``ursa demo --methods`` names them.

    ``options`` go into the selection method's ``[[methods]]`` entry on both
    sides (e.g. ``{"draw": "stratified"}`` for Dubhe).
    """

    methods: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``dubhe,climb`` or ``dubhe[draw=stratified]``."""
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return ",".join(self.methods) + (f"[{extra}]" if extra else "")

    @property
    def draw(self) -> str:
        """Dubhe's draw: ``paper`` (its config default) unless an option says."""
        if self.methods[0] != "dubhe":
            return "-"
        return str(self.options.get("draw", "paper"))


class SteppedClock:
    """Simulated seconds that move only when the harness says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        """The current simulated time."""
        return self.now


def _with_training(methods: tuple[str, ...]) -> str:
    """``--methods`` with FedAvg named when no training method is (``random``)."""
    names = list(methods)
    if not {"fedavg", "climb", "feddisk"} & set(names):
        names.insert(1, "fedavg")
    return ",".join(names)


def demo_settings(
    base: TrainingDemoSettings, combination: Combination, seed: int
) -> TrainingDemoSettings:
    """The demo's settings for one combination and seed."""
    from ursa.tools.demo.settings import DemoError, methods_options

    try:
        chosen = methods_options(_with_training(combination.methods))
    except DemoError as exc:
        raise UnsupportedCombinationError(str(exc)) from None
    settings = replace(
        base,
        seed=seed,
        selection=chosen["selection"],
        weighting=chosen["weighting"],
        balance=chosen["balance"],
    )
    try:
        settings.check()
    except DemoError as exc:
        raise UnsupportedCombinationError(str(exc)) from None
    return settings


def _selection_spec(
    config: CoordinatorConfig, options: dict[str, Any]
) -> CoordinatorConfig:
    """``config`` with ``options`` in its selection method's ``[[methods]]`` entry.

    Raises:
        UnsupportedCombinationError: the coordinator's config refuses them.
    """
    from pydantic import TypeAdapter, ValidationError

    from ursa.coordinator.methods_config import MethodSpec

    if not options:
        return config
    adapter: TypeAdapter[MethodSpec] = TypeAdapter(MethodSpec)
    specs = list(config.methods or ())
    first = specs[0].model_dump(mode="python") | options
    try:
        specs[0] = adapter.validate_python(first)
    except ValidationError as exc:
        raise UnsupportedCombinationError(
            f"this build's coordinator config refuses {specs[0].kind} options "
            f"{options}: {exc.errors()[0]['msg']}"
        ) from None
    return config.model_copy(update={"methods": tuple(specs)})


def _device_methods(
    s: TrainingDemoSettings, options: dict[str, Any]
) -> tuple[Any, ...]:
    """The devices' ``[[methods]]``, as `ursa.tools.demo.devices` writes them.

    The selection options go to the device's entry too when its config takes
    them (a device may learn them from the coordinator's signed list instead).
    """
    from pydantic import TypeAdapter, ValidationError

    from ursa.edge_sdk.methods_config import DeviceMethodSpec

    training: dict[str, Any] = {"kind": "fedavg"}
    if s.weighting == "climb":
        training = {"kind": "climb", "eta_d": s.eta_d, "epsilon": s.epsilon}
    elif s.weighting == "feddisk":
        training = {"kind": "feddisk"}
    tables: list[dict[str, Any]] = [{"kind": s.selection} | options, training]
    if s.balance == "flicker":
        tables.append({"kind": "flicker"})
    adapter = TypeAdapter(tuple[DeviceMethodSpec, ...])
    try:
        return adapter.validate_python(tuple(tables))
    except ValidationError:
        tables[0] = {"kind": s.selection}
        return adapter.validate_python(tuple(tables))


@dataclass
class _Device:
    client: EdgeClient
    transport: InMemoryTransport


class _Run:
    """One federation: its population, coordinator, devices and bus."""

    def __init__(
        self, s: TrainingDemoSettings, options: dict[str, Any], workdir: Path
    ) -> None:
        from ursa.tools.data.metrics import distance_to_uniform
        from ursa.tools.demo.population import demo_population

        self.s = s
        self.workdir = workdir
        self.fed = demo_population(s)
        self.counts = np.asarray(self.fed.counts, dtype=np.float64)
        self.ids = [f"dev{i:03d}" for i in range(s.devices)]
        self.index = {d: i for i, d in enumerate(self.ids)}
        self.model_config: dict[str, Any] = {
            "input_dim": self.fed.input_dim,
            "num_classes": self.fed.num_classes,
            "hidden_sizes": list(s.hidden_sizes),
        }
        self.rounds: list[dict[str, Any]] = []
        self.watch: Callable[[TrainingRoundReport, Any], None] | None = None
        """Called with each reported round's record and its new global model."""
        self._latest: Any = None
        self.traffic = 0.0
        """Mean payload bytes per device, sent + received, up to the last round."""
        self.initial: dict[str, Any] | None = None
        self._distance = distance_to_uniform
        self.bus = InMemoryBus()
        self.clock = SteppedClock()
        self.service = self._coordinator(options)
        self.devices = [self._device(i, options) for i in range(s.devices)]

    # --- the parts ---------------------------------------------------------------

    def _coordinator(self, options: dict[str, Any]) -> CoordinatorService:
        from ursa.tools.compose import build_coordinator
        from ursa.tools.demo.coordinator import (
            MadeHooks,
            coordinator_config,
            training_hooks,
            write_initial_weights,
        )

        s = self.s
        initial = self.workdir / "initial.ursw"
        write_initial_weights(initial, self.model_config, seed=s.seed)
        made = None
        if s.weighting == "feddisk":
            from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings

            made_config = FeddiskSettings().made_model_config(self.fed.input_dim)
            made_initial = self.workdir / "made.ursw"
            write_initial_weights(
                made_initial, made_config, seed=s.seed, architecture="made"
            )
            made = MadeHooks(
                made_initial, lambda r, v, a: {}, lambda record: None, _no_switch
            )
        config = coordinator_config(
            s,
            self.workdir,
            "mqtt://127.0.0.1:1883",  # unused: the service gets the bus
            initial,
            None if made is None else made.initial,
        )
        # one round more than the harness runs: it stops after its last round,
        # before the federation's end (the devices' final model and ONNX export)
        config = _selection_spec(config, options).model_copy(
            update={"rounds": config.rounds + 1}
        )
        hooks = training_hooks(self._evaluate, self._on_round, made)
        transport = InMemoryTransport(self.bus, COORDINATOR)
        return build_coordinator(
            config, hooks=hooks, transport=transport, clock=self.clock
        )

    def _device(self, i: int, options: dict[str, Any]) -> _Device:
        from ursa.edge_sdk.client import device_will
        from ursa.edge_sdk.config import DeviceConfig, DeviceTrainingConfig
        from ursa.tools.compose import build_device
        from ursa.tools.demo.settings import ARCHITECTURE, FEDERATION

        s, device_id = self.s, self.ids[i]
        seed = 1000 * s.seed + i  # as the demo seeds its devices
        state_dir = self.workdir / "devices" / device_id
        state_dir.mkdir(parents=True)
        data_file = state_dir / "data.npz"
        data = self.fed.devices[i]
        np.savez(data_file, x=data.x, y=data.y)
        config = DeviceConfig(
            device_id=device_id,
            federation=FEDERATION,
            state_dir=state_dir,
            obfuscator_pool_size=0,  # no background thread: one thread runs all
            allow_plain_aggregation=s.aggregation == "plain",
            insecure_test_keys=True,  # the bench's --key-bits is its own choice
            methods=_device_methods(s, options),
            training=DeviceTrainingConfig(
                data_file=str(data_file),
                architecture=ARCHITECTURE,
                model_options=dict(self.model_config),
                train={
                    "epochs": s.local_epochs,
                    "batch_size": s.batch_size,
                    "lr": s.lr,
                },
                wire_dtype="float16" if s.wire_dtype == "float16" else "float32",
                seed=seed,
                eval_fraction=s.eval_fraction,
            ),
        )
        own: list[MethodFactory] = []
        if s.balance == "flicker":
            from ursa.tools.demo.fleet import DeviceSpec
            from ursa.tools.demo.flicker import device_flicker, flicker_extra

            extra = flicker_extra(
                self.fed.test_x, self.fed.test_y, self.fed.num_classes
            )
            own.append(
                device_flicker(extra, DeviceSpec(device_id, data.x, data.y, seed))
            )
        topic, payload = device_will(config)
        transport = InMemoryTransport(self.bus, device_id, will=(topic, payload, True))
        client = build_device(
            config, transport=transport, rng=np.random.default_rng(seed), methods=own
        )
        return _Device(client, transport)

    # --- the harness's view ------------------------------------------------------

    def _score(self, arrays: Any) -> dict[str, Any]:
        from ursa.edge_sdk.training import evaluate
        from ursa.tools.demo.settings import ARCHITECTURE

        result = evaluate(
            ARCHITECTURE, self.model_config, arrays, self.fed.test_x, self.fed.test_y
        )
        per_class = [float(a) for a in result.per_class_accuracy]
        finite = [a for a in per_class if np.isfinite(a)]
        return {
            "accuracy": float(result.accuracy),
            "worst_class_accuracy": min(finite) if finite else float("nan"),
        }

    def _evaluate(self, round_index: int, version: int, arrays: Any) -> dict[str, Any]:
        self._latest = arrays
        return self._score(arrays)

    def _on_round(self, record: TrainingRoundReport) -> None:
        if len(self.rounds) >= self.s.rounds:
            return  # FedDisk: a round after the last one, not reported
        chosen = [self.index[d] for d in record.selected if d in self.index]
        pooled = self.counts[chosen].sum(axis=0)
        l1 = float(self._distance(pooled / max(1.0, float(pooled.sum()))))
        self.rounds.append(
            {
                "round": record.round,
                "accuracy": float(record.metrics.get("accuracy", float("nan"))),
                "worst_class_accuracy": float(
                    record.metrics.get("worst_class_accuracy", float("nan"))
                ),
                "selection_l1": l1,
                "selected": len(record.selected),
                "contributed": len(record.contributed),
            }
        )
        if self.watch is not None:
            self.watch(record, self._latest)
        if len(self.rounds) == self.s.rounds:
            self.traffic = self.bytes_per_device()

    # --- the loop ----------------------------------------------------------------

    def execute(self, on_round: Any = None) -> None:
        """Start everything; step the clock until the rounds are done."""
        from ursa.models.weights import arrays_from_bytes

        self.service.start()
        version0 = arrays_from_bytes((self.workdir / "initial.ursw").read_bytes())
        self.initial = self._score(version0)
        for device in self.devices:
            device.client.start()
        idle, step, seen = 0.0, FIRST_STEP_S, 0
        while len(self.rounds) < self.s.rounds and not self.service.is_done:
            for device in self.devices:
                device.client.poll()
            before = self._progress()
            now, deadline = self.clock.now, self.service.state.deadline_at
            jump = (
                deadline - now + 0.001
                if deadline is not None and deadline > now
                else step
            )
            self.clock.now += jump
            self.service.tick()
            if self._progress() != before:
                idle, step = 0.0, FIRST_STEP_S
            else:
                idle += jump
                step = min(step * 2, 60.0)
                if idle > MAX_IDLE_S:
                    state = self.service.state
                    raise LearningStalledError(
                        f"no progress in {MAX_IDLE_S:.0f} simulated s (stage "
                        f"{state.stage}, round {state.round}, "
                        f"{len(self.rounds)} rounds done)"
                    )
            if on_round is not None and len(self.rounds) > seen:
                seen = len(self.rounds)
                on_round(seen)

    def _progress(self) -> tuple[Any, ...]:
        state = self.service.state
        stats = self.service.transport_stats
        return (
            str(state.stage),
            state.round,
            stats.messages_received,
            len(self.rounds),
        )

    def close(self) -> None:
        """Stop everything without a federation's end or a fleet going offline.

        The devices' links close first, quietly (no will, no offline status),
        so the coordinator neither sees an outage nor reaches a device with
        what it says as it stops (the final model: an ONNX export per device).
        """
        for device in self.devices:
            device.transport.close()
        self.service.stop()
        for device in self.devices:
            device.client.stop()

    def bytes_per_device(self) -> float:
        """Payload bytes each device sent and received, mean over the devices."""
        totals = [
            d.transport.stats.bytes_sent + d.transport.stats.bytes_received
            for d in self.devices
        ]
        return float(np.mean(totals)) if totals else 0.0


def _await_final_exports(timeout_s: float = 120.0) -> None:
    """Let the devices' final-model exports end before the run's folder goes.

    Each device exports in a thread of its own, and exports in one process
    run one at a time.
    """
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if thread.name.startswith("ursa-final-"):
            thread.join(max(0.0, deadline - time.monotonic()))


def _no_switch(round_index: int, made_version: int) -> None:
    """FedDisk's switch to classifier rounds needs no action here."""


def run_federation(
    base: TrainingDemoSettings,
    combination: Combination,
    seed: int,
    on_round: Any = None,
    watch: Callable[[TrainingRoundReport, Any], None] | None = None,
) -> dict[str, Any]:
    """Run one combination with one seed; its figures and per-round curves.

    Raises:
        UnsupportedCombinationError: this build cannot run the combination.
        LearningStalledError: the federation stopped making progress.
    """
    s = demo_settings(base, combination, seed)
    with tempfile.TemporaryDirectory(prefix="ursa-bench-learning-") as tmp:
        run = _Run(s, combination.options, Path(tmp))
        run.watch = watch
        try:
            run.execute(on_round)
        finally:
            run.close()
            _await_final_exports()
    figures = run_figures(combination, seed, run.rounds, run.initial, run.traffic)
    # messages whose handler raised on the bus: 0 in a healthy run
    figures["handler_errors"] = run.bus.handler_errors
    return figures


def run_figures(
    combination: Combination,
    seed: int,
    rounds: list[dict[str, Any]],
    initial: dict[str, Any] | None,
    bytes_per_device: float,
) -> dict[str, Any]:
    """One run's JSON row from its rounds (pure: the summary's tests use it)."""
    accuracy = [_finite(r["accuracy"]) for r in rounds]
    worst = [_finite(r["worst_class_accuracy"]) for r in rounds]
    reached = [
        i + 1 for i, a in enumerate(accuracy) if a is not None and a >= TARGET_ACCURACY
    ]
    l1 = [r["selection_l1"] for r in rounds]
    return {
        "methods": combination.label,
        "draw": combination.draw,
        "seed": seed,
        "final_accuracy": accuracy[-1] if accuracy else None,
        "worst_class_accuracy": worst[-1] if worst else None,
        f"rounds_to_{TARGET_ACCURACY}": reached[0] if reached else None,
        "selection_l1_mean": float(np.mean(l1)) if l1 else None,
        "bytes_per_device": bytes_per_device,
        "initial_accuracy": None if initial is None else initial["accuracy"],
        "rounds_completed": len(rounds),
        "made_rounds": rounds[0]["round"] - 1 if rounds else 0,
        "accuracy_per_round": accuracy,
        "worst_class_per_round": worst,
    }


def _finite(value: float) -> float | None:
    """JSON has no NaN: an unscored round is None."""
    return float(value) if np.isfinite(value) else None
