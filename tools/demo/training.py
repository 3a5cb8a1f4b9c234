"""`ursa demo`: broker, coordinator and N device processes learning on digits.

What runs (all on this machine):

* a broker: the embedded amqtt one (``--broker mqtt://host:port`` for another);
* the coordinator service in this process, with the `TrainingPlugin`
  (FedAvg, or CLIMB over Paillier, or FedDisk: MADE rounds with an encrypted
  fleet validation loss first, then weighted classifier rounds) and an evaluation
  callback that scores every new global model on the held-out test split
  (torch, here in the harness; the service itself never imports torch);
* N devices, each an `EdgeClient` + `TorchTrainer` in its own spawned
  process (``--processes`` groups them when memory is short), holding its
  share of the training split, partitioned with Dubhe's global imbalance
  (rho, average EMD). The test split never leaves the harness.

Selection ``dubhe`` is the real protocol (agent key, encrypted registries, H
tries); ``random`` is the same protocol with a one-slot codebook (G = {C}),
so every device volunteers with P = K/N and the coordinator trims or tops up
uniformly, and one try: a uniform K-subset per round. The harness (not the
coordinator, which sees no label distribution) computes each round's
``||p_o - p_u||_1`` from the partition it made.

``--balance flicker`` runs FLICKER among the device processes before the
first round (`ursa.tools.demo.flicker`): each device then trains on its
resampled training view; the report gains a ``flicker`` section.

Defaults (measured on 2 cores: see README): 20 devices, K = 8, H = 5,
25 rounds, MLP 64-128-128-10, 5 local epochs, batch 4, SGD lr 0.1, 2048-bit
Paillier keys, CLIMB eta_D = 0.1, eps = 0.002, a dual step every round.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from ursa.tools.demo.devices import DeviceReport, DeviceSpec, FleetSpec

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.feddisk_plugin import FeddiskPlugin
    from ursa.coordinator.training import Evaluator, RoundRecord, TrainingPlugin

__all__ = [
    "DemoError",
    "MadeHooks",
    "TrainingDemoSettings",
    "run_training_demo",
    "write_initial_weights",
]

FEDERATION = "demo"
ARCHITECTURE = "mlp"
BAR_WIDTH = 30
SELECTIONS = ("dubhe", "random")
UPDATE_TIMEOUT_S = 120.0
DUAL_TIMEOUT_S = 60.0
WEIGHTINGS = ("none", "climb", "feddisk")
BALANCES = ("none", "flicker")


class DemoError(ValueError):
    """Settings the demo cannot run (the message says why)."""


@dataclass(frozen=True)
class TrainingDemoSettings:
    """What `ursa demo` runs (the CLI's options)."""

    devices: int = 20
    k: int = 8
    tries: int = 5
    rounds: int = 25
    rho: float = 10.0
    emd: float = 1.5
    selection: str = "dubhe"
    weighting: str = "climb"
    balance: str = "none"
    key_bits: int = 2048
    local_epochs: int = 5
    batch_size: int = 4
    lr: float = 0.1
    hidden_sizes: tuple[int, ...] = (128, 128)
    eta_d: float = 0.1
    epsilon: float = 0.002
    dual_period: int = 1
    made_rounds: int = 50
    """FedDisk: the cap on MADE rounds (the phase stops earlier when the
    fleet's validation loss rises)."""
    wire_dtype: str = "float32"
    test_fraction: float = 0.25
    seed: int = 0
    processes: int | None = None
    report_dir: Path = Path("ursa-report")
    broker_url: str | None = None
    timeout_s: float = 900.0
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Raise `DemoError` for settings the demo cannot run."""
        if self.selection not in SELECTIONS:
            raise DemoError(f"selection must be one of {SELECTIONS}")
        if self.balance not in BALANCES:
            raise DemoError(f"balance must be one of {BALANCES}")
        if self.balance == "flicker" and self.devices < 3:
            raise DemoError("--balance flicker needs at least 3 devices (the ring)")
        if self.weighting not in WEIGHTINGS:
            raise DemoError(f"weighting must be one of {WEIGHTINGS}")
        if self.made_rounds < 1:
            raise DemoError("--made-rounds must be at least 1")
        if not 1 <= self.k <= self.devices:
            raise DemoError(f"need 1 <= K <= devices, got K={self.k}")
        if self.rounds < 1:
            raise DemoError("need at least one round")


def write_initial_weights(
    path: Path, model_config: dict[str, Any], *, seed: int, architecture: str = "mlp"
) -> None:
    """Write seeded initial weights for the coordinator (needs the train extra)."""
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_to_bytes

    arrays = initial_arrays(architecture, model_config, seed=seed)
    path.write_bytes(arrays_to_bytes(arrays))


class _Progress:
    """Per-round progress lines on stderr (from the coordinator's thread)."""

    def __init__(self, err: TextIO, total: int) -> None:
        self.err, self.total, self.started = err, total, time.perf_counter()
        self.lock = threading.Lock()

    def line(self, done: int, text: str) -> None:
        filled = BAR_WIDTH * done // max(1, self.total)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        elapsed = time.perf_counter() - self.started
        with self.lock:
            self.err.write(f"[{bar}] {done}/{self.total} {text} ({elapsed:.0f} s)\n")
            self.err.flush()

    def note(self, text: str) -> None:
        with self.lock:
            elapsed = time.perf_counter() - self.started
            self.err.write(f"ursa demo: {text} ({elapsed:.0f} s)\n")
            self.err.flush()


def run_training_demo(
    settings: TrainingDemoSettings,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    as_json: bool = False,
) -> dict[str, Any]:
    """Run the demo, write the report folder, print a summary (or the JSON)."""
    import json

    from ursa.tools.demo.report import json_safe
    from ursa.tools.demo.run import DemoRun

    settings.check()
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    progress = _Progress(err, settings.rounds)
    with tempfile.TemporaryDirectory(prefix="ursa-demo-") as tmp:
        run = DemoRun(settings, Path(tmp), progress)
        report = run.execute()
    if as_json:
        out.write(json.dumps(json_safe(report), allow_nan=False) + "\n")
    else:
        _print_summary(out, report)
    return report


def _print_summary(out: TextIO, report: dict[str, Any]) -> None:
    final = report.get("final_accuracy")
    devices = report.get("device_summary", {})
    onnx = report.get("onnx_check") or {}
    lines = [
        f"rounds completed: {len(report['rounds'])}/{report['settings']['rounds']}"
        + ("" if report["completed"] else "  (NOT all rounds completed)"),
        "final test accuracy: "
        + ("-" if final is None else f"{final:.4f}")
        + f"  worst class {report.get('worst_class')} "
        f"({_fmt(report.get('worst_class_accuracy'))})",
        "per class: "
        + " ".join(_fmt(a, 2) for a in report.get("per_class_accuracy") or []),
        f"mean ||p_o - p_u||_1: {_fmt(report.get('mean_l1_to_uniform'), 3)} "
        f"(random K: {_fmt(report.get('random_selection_l1_to_uniform'), 3)})",
        f"per device: crypto {_fmt(devices.get('crypto_ms_mean'), 1)} ms, sent "
        f"{_fmt(devices.get('bytes_sent_mean', 0) / 1024, 1)} KiB, received "
        f"{_fmt(devices.get('bytes_received_mean', 0) / 1024, 1)} KiB",
        f"ONNX vs torch on the test split: identical={onnx.get('identical')} "
        f"(max |logit diff| {_fmt(onnx.get('max_abs_logit_diff'), 6)})",
        *_flicker_lines(report.get("flicker")),
        *_feddisk_lines(report.get("feddisk")),
        f"report: {report['report_dir']} ({', '.join(report.get('files', []))})",
        f"wall time {report['wall_s']:.1f} s",
    ]
    out.write("\n".join(lines) + "\n")


def _flicker_lines(section: dict[str, Any] | None) -> list[str]:
    if section is None:
        return []
    return [
        f"FLICKER {section['phase']}: GI {_fmt(section.get('gi_before'))} -> "
        f"{_fmt(section.get('gi_after'))} ({section.get('stop_reason')}), "
        f"+{section.get('samples_added', 0)} / -{section.get('samples_removed', 0)} "
        f"samples, {section['wall_s']:.1f} s"
    ]


def _feddisk_lines(section: dict[str, Any] | None) -> list[str]:
    if section is None:
        return []
    return [
        f"FedDisk: {section['made_rounds']} MADE rounds (best version "
        f"{section['best_made_version']}), then classifier rounds from round "
        f"{section['switch_round']}; {section['effective_rounds']} rounds in all"
    ]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass
class DeviceFleet:
    """The running device processes and what they share with the harness."""

    processes: list[Any]
    stop: Any
    results: Any
    connect_lock: Any
    flicker_ready: Any = None
    flicker_done: Any = None


def spawn_devices(
    specs: list[DeviceSpec],
    fleet: dict[str, Any],
    processes: int,
    *,
    flicker: bool = False,
) -> DeviceFleet:
    """Start the device processes (spawn), devices split evenly among them.

    ``flicker``: the devices take part in FLICKER first (``fleet["extra"]``
    holds its settings); the harness reads `DeviceFleet.flicker_ready` and
    sets `DeviceFleet.flicker_done`.
    """
    from ursa.tools.demo.devices import run_device_process

    context = multiprocessing.get_context("spawn")
    handle = DeviceFleet([], context.Event(), context.Queue(), context.Lock())
    sync = None
    if flicker:
        handle.flicker_ready, handle.flicker_done = context.Queue(), context.Event()
        sync = (handle.flicker_ready, handle.flicker_done)
    groups = [g for g in np.array_split(np.arange(len(specs)), processes) if len(g)]
    for group in groups:
        spec = FleetSpec(devices=tuple(specs[i] for i in group), **fleet)
        proc = context.Process(
            target=run_device_process,
            args=(spec, handle.stop, handle.results, handle.connect_lock, sync),
            daemon=True,
        )
        proc.start()
        handle.processes.append(proc)
    return handle


def report_of(device: DeviceReport) -> dict[str, Any]:
    """A device's figures for the JSON report."""
    data = asdict(device)
    data.pop("flicker", None)
    data["crypto_ms"] = 1000.0 * data.pop("crypto_s")
    data["train_ms"] = 1000.0 * data.pop("train_s")
    data["selected_rounds"] = list(device.selected_rounds)
    return data


def start_broker(url: str | None) -> tuple[Any, str]:
    """The embedded broker (started) and its URL, or (None, the given URL)."""
    if url is not None:
        return None, url
    from ursa.tools.broker.embedded import EmbeddedBroker

    broker = EmbeddedBroker().start()
    return broker, broker.url


def coordinator_config(
    s: TrainingDemoSettings, workdir: Path, url: str
) -> CoordinatorConfig:
    """The coordinator's config: all devices must enrol; deadlines for 2 cores."""
    from ursa.coordinator.config import (
        BrokerConfig,
        CoordinatorConfig,
        DeadlinesConfig,
        EnrolmentConfig,
        RegistryConfig,
    )

    random = s.selection == "random"
    registry = (
        RegistryConfig(groups=(10,), sigma=(0.0,)) if random else RegistryConfig()
    )
    return CoordinatorConfig(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        broker=BrokerConfig(url=url),
        enrolment=EnrolmentConfig(mode="tofu"),
        registry=registry,
        min_devices=s.devices,
        k=s.k,
        tries=1 if random else s.tries,
        # FedDisk: up to made_rounds MADE rounds come first; the harness stops
        # the run once s.rounds classifier rounds are done
        rounds=s.rounds + (s.made_rounds if s.weighting == "feddisk" else 0),
        key_bits=s.key_bits,
        seed=s.seed,
        deadlines=DeadlinesConfig(
            key_epoch_s=120,
            registration_s=120,
            volunteer_s=60,
            distributions_s=60,
            agent_s=60,
            training_s=UPDATE_TIMEOUT_S + 2 * DUAL_TIMEOUT_S + 60,
        ),
    )


def training_plugin(
    s: TrainingDemoSettings,
    workdir: Path,
    initial: Path,
    evaluate: Evaluator,
    on_round: Callable[[RoundRecord], None],
    made: MadeHooks | None = None,
) -> TrainingPlugin | FeddiskPlugin:
    """The coordinator's training phase for the chosen weighting.

    FedDisk needs ``made``: the MADE's initial weights and its round hooks.
    """
    from ursa.coordinator.aggregation import Weighting
    from ursa.coordinator.feddisk_plugin import FeddiskConfig, FeddiskPlugin
    from ursa.coordinator.training import TrainingConfig, TrainingPlugin

    weighting = Weighting.CLIMB if s.weighting == "climb" else Weighting.FEDAVG
    config = TrainingConfig(
        weighting=weighting,
        dual_period=s.dual_period,
        update_timeout_s=UPDATE_TIMEOUT_S,
        dual_timeout_s=DUAL_TIMEOUT_S,
    )
    classifier = TrainingPlugin(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        config=config,
        initial_weights=initial,
        evaluate=evaluate,
        on_round=on_round,
    )
    if s.weighting != "feddisk":
        return classifier
    if made is None:
        raise DemoError("feddisk needs the MADE's initial weights")
    feddisk = FeddiskConfig(
        max_made_rounds=s.made_rounds,
        loss_timeout_s=DUAL_TIMEOUT_S,
        verdict_timeout_s=DUAL_TIMEOUT_S,
    )
    made_plugin = TrainingPlugin(
        federation=FEDERATION,
        state_dir=workdir / "coordinator",
        config=config.model_copy(update={"model": feddisk.made_model}),
        initial_weights=made.initial,
        evaluate=made.evaluate,
        on_round=made.on_round,
    )
    return FeddiskPlugin(
        federation=FEDERATION,
        made=made_plugin,
        classifier=classifier,
        state_dir=workdir / "coordinator",
        config=feddisk,
        on_switch=made.on_switch,
    )


@dataclass(frozen=True)
class MadeHooks:
    """FedDisk's MADE rounds in the demo: initial weights and callbacks."""

    initial: Path
    evaluate: Evaluator
    on_round: Callable[[RoundRecord], None]
    on_switch: Callable[[int, int], None]
