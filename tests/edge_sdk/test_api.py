"""The public API of `ursa.edge_sdk`: pinned, and torch-free until asked for."""

from __future__ import annotations

import subprocess
import sys

import ursa.edge_sdk as sdk

PUBLIC = [
    "Climb",
    "ClimbConfig",
    "DeviceCallbacks",
    "DeviceConfig",
    "DeviceContext",
    "DeviceError",
    "DeviceMethod",
    "DeviceTrainingConfig",
    "Dubhe",
    "EdgeClient",
    "FedDisk",
    "FeddiskSettings",
    "FeddiskTrainer",
    "Finished",
    "Flicker",
    "LocalDelta",
    "ModelReceived",
    "ModelTrainer",
    "NoOpTrainer",
    "RoundTrained",
    "Selected",
    "TorchTrainer",
    "TrainConfig",
    "TrainPlan",
    "Trainer",
    "TrainingError",
    "TrainingReport",
    "inference",
    "load_device_config",
]


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(sdk.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(sdk, name) is not None


def test_a_selection_only_device_never_imports_torch() -> None:
    eager = [n for n in PUBLIC if n not in ("TrainConfig", "TrainingError")]
    code = (
        "import sys, ursa.edge_sdk as s; "
        f"[getattr(s, n) for n in {eager!r}]; "
        "assert 'torch' not in sys.modules, 'torch loaded'; "
        "s.TrainConfig; assert 'torch' in sys.modules, 'lazy name did not load'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
