"""`ursa coordinator serve` and `ursa device run`: the real service and device.

Both read a TOML/JSON config (``--config``) with ``URSA_*`` environment
overrides (secrets such as ``URSA_BROKER__PASSWORD`` belong there, not in the
file), stop cleanly on SIGTERM/SIGINT, and log to stderr. Also runnable as
``python -m ursa.tools.cli.service coordinator serve --config FILE``.

With a ``[training]`` section the coordinator runs `TrainingPlugin` rounds
(initial weights from `ursa model init`, also registered here; FedDisk: a
`FeddiskPlugin` over a MADE and a classifier `TrainingPlugin`) and the device
trains a `TorchTrainer` (FedDisk: inside a `FeddiskTrainer`) on its
``data_file``; torch is imported only then, so a selection-only device and
the coordinator run without it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ursa.tools.cli import model

if TYPE_CHECKING:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.plugin import RoundPlugin
    from ursa.coordinator.service import CoordinatorService
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.config import DeviceConfig, DeviceTrainingConfig
    from ursa.edge_sdk.trainer import Trainer

    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    """Attach `ursa coordinator serve`, `ursa device run` and `ursa model init`."""
    coordinator = sub.add_parser("coordinator", help="the coordinator service")
    commands = coordinator.add_subparsers(dest="coordinator_command", required=True)
    serve = commands.add_parser("serve", help="run the coordinator (SIGTERM stops)")
    serve.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    serve.add_argument(
        "--keep-running",
        action="store_true",
        help="keep serving enrolments after the configured rounds are done",
    )
    serve.set_defaults(handler=_serve)

    device = sub.add_parser("device", help="a device process")
    device_commands = device.add_subparsers(dest="device_command", required=True)
    run = device_commands.add_parser("run", help="run one device until stopped")
    run.add_argument("--config", type=Path, required=True, help="TOML or JSON file")
    run.add_argument(
        "--labels", type=Path, help="labels file (.npy, .txt, .csv); else labels_file"
    )
    run.set_defaults(handler=_device_run)
    model.register(sub)


class ServiceSetupError(ValueError):
    """A config the service or device cannot start from (the message says why)."""


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def training_plugin(config: CoordinatorConfig) -> RoundPlugin | None:
    """The `TrainingPlugin` of a ``[training]`` section (None without one).

    Raises:
        ServiceSetupError: no checkpoint yet and no usable initial weights.
    """
    section = config.training
    if section is None:
        return None
    from ursa.coordinator.feddisk_plugin import FeddiskPlugin
    from ursa.coordinator.models import ModelStoreError
    from ursa.coordinator.training import TrainingPlugin

    try:
        classifier = TrainingPlugin(
            federation=config.federation,
            state_dir=config.state_dir,
            config=section.training_config(),
            initial_weights=section.initial_weights,
        )
        if section.weighting != "feddisk":
            return classifier
        made = TrainingPlugin(
            federation=config.federation,
            state_dir=config.state_dir,
            config=section.made_training_config(),
            initial_weights=section.made_initial_weights,
        )
        return FeddiskPlugin(
            federation=config.federation,
            made=made,
            classifier=classifier,
            config=section.feddisk_config(),
        )
    except (ModelStoreError, OSError, ValueError) as exc:
        raise ServiceSetupError(f"[training]: {exc}") from None


def build_coordinator(config: CoordinatorConfig) -> CoordinatorService:
    """The service `ursa coordinator serve` runs (training if configured)."""
    from ursa.coordinator.service import CoordinatorService

    return CoordinatorService(config, plugin=training_plugin(config))


def _serve(args: argparse.Namespace) -> int:
    from ursa.coordinator.config import load_coordinator_config

    config = load_coordinator_config(args.config, os.environ)
    try:
        service = build_coordinator(config)
    except ServiceSetupError as exc:
        print(f"ursa coordinator serve: {exc}", file=sys.stderr)
        return 2
    stop = _stop_on_signals()
    service.run(stop, until_done=not args.keep_running)
    return 0


def load_labels(path: Path) -> NDArray[np.int64]:
    """Read class labels from .npy (no pickles) or whitespace/comma separated text.

    Raises:
        ValueError: not a 1-D vector of non-negative integers.
    """
    if path.suffix.lower() == ".npy":
        labels = np.load(path, allow_pickle=False)
    else:
        text = path.read_text().replace(",", " ")
        labels = np.array([int(x) for x in text.split()], dtype=np.int64)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: labels must be a 1-D vector of integers")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{path}: labels must be non-negative")
    return labels.astype(np.int64)


def load_training_data(
    data_file: str,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Local samples and labels: a ``.npz`` (``x``, ``y``) or a `load_dataset` spec.

    Raises:
        ServiceSetupError: the file is missing, unreadable or not a data set.
    """
    from ursa.tools.data.datasets import DatasetError
    from ursa.tools.data.loaders import load_dataset

    spec = f"npz:{data_file}" if data_file.lower().endswith(".npz") else data_file
    try:
        data = load_dataset(spec)
    except DatasetError as exc:
        raise ServiceSetupError(f"[training] data_file: {exc}") from None
    return data.x.astype(np.float32), data.y.astype(np.int64)


def device_seed(device_id: str) -> int:
    """A stable training seed from the device id (when the config gives none)."""
    digest = hashlib.sha256(device_id.encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def torch_trainer(
    device_id: str,
    training: DeviceTrainingConfig,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
) -> Trainer:
    """The device's `TorchTrainer` (imports torch).

    Raises:
        ServiceSetupError: torch is missing or a setting is invalid.
    """
    try:
        from ursa.edge_sdk.torch_trainer import TorchTrainer
        from ursa.edge_sdk.training import TrainConfig
        from ursa.models.registry import ModelConfigError, parse_config
    except ImportError:
        raise ServiceSetupError(f"[training] {model.TRAIN_EXTRA_HINT}") from None
    try:
        parse_config(training.architecture, training.model_options)
        train = TrainConfig.model_validate(training.train)
    except (ModelConfigError, ValueError) as exc:
        raise ServiceSetupError(f"[training]: {exc}") from None
    seed = device_seed(device_id) if training.seed is None else training.seed
    trainer = TorchTrainer(
        x,
        y,
        architecture=training.architecture,
        model_config=training.model_options,
        train=train,
        model=training.model,
        climb=training.climb,
        wire_dtype=training.wire_dtype,
        seed=seed,
    )
    if training.feddisk is None:
        return trainer
    from ursa.edge_sdk.feddisk_trainer import FeddiskSettings, FeddiskTrainer

    try:
        settings = FeddiskSettings.model_validate(training.feddisk)
    except ValueError as exc:
        raise ServiceSetupError(f"[training] feddisk: {exc}") from None
    return FeddiskTrainer(trainer, settings=settings, seed=seed)


def build_device(config: DeviceConfig, labels_path: Path | None = None) -> EdgeClient:
    """The `EdgeClient` `ursa device run` runs: trainer from ``[training]`` if set.

    Raises:
        ServiceSetupError: no labels, or labels given to a training device, or
            unusable training data or settings.
        ValueError: an unreadable labels file.
    """
    from ursa.edge_sdk.client import EdgeClient

    if config.training is None:
        path = labels_path or config.labels_file
        if path is None:
            raise ServiceSetupError("give --labels or labels_file (or [training])")
        return EdgeClient(config, load_labels(Path(path)))
    if labels_path is not None:
        raise ServiceSetupError("a training device takes its labels from data_file")
    x, y = load_training_data(config.training.data_file)
    trainer = torch_trainer(config.device_id, config.training, x, y)
    return EdgeClient(config, y, trainer=trainer)


def _device_run(args: argparse.Namespace) -> int:
    from ursa.edge_sdk.config import load_device_config

    config = load_device_config(args.config, os.environ)
    try:
        client = build_device(config, args.labels)
    except ValueError as exc:
        print(f"ursa device run: {exc}", file=sys.stderr)
        return 2
    client.run(_stop_on_signals())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run these subcommands without the full `ursa` CLI (``python -m``)."""
    parser = argparse.ArgumentParser(prog="ursa")
    parser.add_argument("--log-level", default="INFO")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
