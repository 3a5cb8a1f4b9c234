"""Device side: EdgeClient, registration, self-selection, local training.

`import ursa.edge_sdk` never imports torch, so a selection-only device (or
one training with an `ArrayTrainer`) runs without it: the torch trainers
(`TorchTrainer`, `ModuleTrainer`) import torch on first use, and the names of
`ursa.edge_sdk.training` (which imports torch) load on first access. The
device developer's guide is ``docs/sdk.md``.

`ursa.edge_sdk.inference` serves the final model on onnxruntime, without torch;
`DeviceCallbacks` lets an app follow the device's progress.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ursa.edge_sdk import inference
from ursa.edge_sdk.array_trainer import (
    ArrayModelTrainer,
    ArrayTrainer,
    FitPlan,
    FitResult,
)
from ursa.edge_sdk.callbacks import (
    DeviceCallbacks,
    DeviceError,
    Finished,
    ModelReceived,
    RoundTrained,
    Selected,
)
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.config import DeviceConfig, DeviceTrainingConfig, load_device_config
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, MethodFactory, TrainPlan
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings, FeddiskTrainer
from ursa.edge_sdk.methods.flicker.method import Flicker
from ursa.edge_sdk.module_trainer import ModuleTrainer
from ursa.edge_sdk.shutdown import run_until_signalled
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.trainer import (
    LocalDelta,
    ModelTrainer,
    NoOpTrainer,
    Trainer,
    TrainingReport,
)
from ursa.models.spec import ModelMismatchError
from ursa.protocol.config_file import ConfigError

if TYPE_CHECKING:
    from ursa.edge_sdk.training import (
        TrainConfig,
        TrainingError,
        evaluate_module,
        train_module,
    )

__all__ = [
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

_LAZY = {
    "TrainConfig": "ursa.edge_sdk.training",
    "TrainingError": "ursa.edge_sdk.training",
    "evaluate_module": "ursa.edge_sdk.training",
    "train_module": "ursa.edge_sdk.training",
}
"""Names whose module imports torch: loaded on first access only."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ursa.edge_sdk' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
