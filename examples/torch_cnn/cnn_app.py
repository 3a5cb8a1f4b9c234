"""A device app that trains its own torch CNN (with BatchNorm) on its own file.

    python cnn_app.py --config device.toml --data data/device-0.npz

It builds the model from ``digits_cnn`` (the architecture the coordinator's
``[training]`` names), chooses its own loss, optimiser and batch settings,
and hands them to `ursa.edge_sdk.ModuleTrainer`; Dubhe selects it, FedAvg
averages its deltas (BatchNorm's running statistics included).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from cnn_data import read
from digits_cnn import MODEL_OPTIONS, build

from ursa.edge_sdk import (
    DeviceConfig,
    EdgeClient,
    ModuleTrainer,
    load_device_config,
    run_until_signalled,
)


def build_client(config: DeviceConfig, data_file: Path, *, seed: int = 0) -> EdgeClient:
    """The device: its data, its model, its training settings."""
    x, y = read(data_file)
    trainer = ModuleTrainer(
        build(**MODEL_OPTIONS),
        x,
        y,
        loss=torch.nn.CrossEntropyLoss(reduction="none"),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        train={"epochs": 2, "batch_size": 32},
        seed=seed,
    )
    return EdgeClient(config, trainer.labels, trainer=trainer)


def main() -> None:
    """Run the device until the federation ends, SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = build_client(load_device_config(args.config), args.data)
    run_until_signalled(client)  # starts, polls; SIGTERM or Ctrl-C stop it cleanly


if __name__ == "__main__":
    main()
