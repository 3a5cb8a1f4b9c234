"""The public API of `ursa.edge_sdk`: pinned, and torch-free until asked for."""

from __future__ import annotations

import subprocess
import sys

import ursa.edge_sdk as sdk

PUBLIC = [
    "ArrayModelTrainer",
    "ArrayTrainer",
    "Climb",
    "ClimbConfig",
    "ConfigError",
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
    "FitPlan",
    "FitResult",
    "Flicker",
    "LocalDelta",
    "MethodFactory",
    "ModelMismatchError",
    "ModelReceived",
    "ModelTrainer",
    "ModuleTrainer",
    "NoOpTrainer",
    "RoundTrained",
    "Selected",
    "TorchTrainer",
    "TrainConfig",
    "TrainPlan",
    "Trainer",
    "TrainingError",
    "TrainingReport",
    "evaluate_module",
    "inference",
    "load_device_config",
    "run_until_signalled",
    "train_module",
]
LAZY = ("TrainConfig", "TrainingError", "evaluate_module", "train_module")


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(sdk.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(sdk, name) is not None


def test_a_selection_only_device_never_imports_torch() -> None:
    eager = [n for n in PUBLIC if n not in LAZY]
    code = (
        "import sys, ursa.edge_sdk as s; "
        f"[getattr(s, n) for n in {eager!r}]; "
        "assert 'torch' not in sys.modules, 'torch loaded'; "
        "s.TrainConfig; assert 'torch' in sys.modules, 'lazy name did not load'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_array_trainer_device_trains_without_torch() -> None:
    """A torch-free app: its trainer runs a round and torch stays unloaded."""
    code = """
import sys
import numpy as np
from ursa.edge_sdk import ArrayModelTrainer, ArrayTrainer, FitPlan

class Mean(ArrayTrainer):
    def fit(self, weights, plan):
        return [w + plan.epochs for w in weights], 5, {"loss": 1.0}
    def evaluate(self, weights):
        return {"loss": float(np.abs(weights[0]).mean())}
    def initial_weights(self):
        return [np.zeros(3, np.float32)]

trainer = ArrayModelTrainer(Mean(), epochs=2)
result = trainer.train_delta(1, {"w": np.zeros(3, np.float32)}, delta_scale=0.5)
assert np.allclose(result.delta["w"], 1.0) and result.num_examples == 5
assert "torch" not in sys.modules, "torch loaded"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
