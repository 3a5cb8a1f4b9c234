"""A device app that trains without torch: NumPy softmax regression on a CSV file.

    python softmax_app.py --config device.toml --data data/device-0.csv

`SoftmaxTrainer` (``softmax_model``) is an `ursa.edge_sdk.ArrayTrainer`;
`ArrayModelTrainer` runs it in the device runtime, so Dubhe selects the
device and FedAvg (or CLIMB) weights its update. torch is never imported.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from softmax_data import read
from softmax_model import MODEL_OPTIONS, SoftmaxTrainer

from ursa.edge_sdk import (
    ArrayModelTrainer,
    DeviceConfig,
    EdgeClient,
    load_device_config,
    run_until_signalled,
)


def build_client(config: DeviceConfig, data_file: Path, *, seed: int = 0) -> EdgeClient:
    """The device: its data and its NumPy trainer."""
    x, y = read(data_file)
    app = SoftmaxTrainer(x, y, **MODEL_OPTIONS)
    trainer = ArrayModelTrainer(app, num_features=x.shape[1], epochs=2, seed=seed)
    return EdgeClient(config, y, trainer=trainer)


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
