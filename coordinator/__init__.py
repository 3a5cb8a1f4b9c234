"""Coordinator service: round state machine, encrypted and model aggregation."""

from ursa.coordinator.before_training import BeforeTraining
from ursa.coordinator.config import CoordinatorConfig, load_coordinator_config
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.methods_config import FeddiskSpec
from ursa.coordinator.plugin import NoTraining, RoundPlugin
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionMethod,
    SelectionRequest,
)
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingPlugin
from ursa.coordinator.training_round import TrainingConfig

__all__ = [
    "BeforeTraining",
    "ClimbDualStep",
    "CoordinatorConfig",
    "CoordinatorService",
    "DubheSelection",
    "FeddiskPlugin",
    "FeddiskSpec",
    "FlickerMethod",
    "NoTraining",
    "RandomSelection",
    "RoundPlugin",
    "Selection",
    "SelectionContext",
    "SelectionMethod",
    "SelectionRequest",
    "TrainingConfig",
    "TrainingPlugin",
    "load_coordinator_config",
]
