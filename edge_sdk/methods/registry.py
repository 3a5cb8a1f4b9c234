"""The device halves a device runs, by ``[[methods]]`` kind.

`compose_methods` builds an `EdgeClient`'s method list: the methods an app
built itself, and every other kind of the configuration from its table (or
implied by the trainer): `Dubhe` when it selects, `FedDisk` for a
`PhasedTrainer`, `Climb` from a ``kind = "climb"`` table or the trainer's
CLIMB settings, `Flicker` (count-level, over the device's labels) from a
``kind = "flicker"`` table, `FedProx` from a ``kind = "fedprox"`` table.
Adding a method adds one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.method import DeviceMethod
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods.feddisk.phased_trainer import PhasedTrainer
from ursa.edge_sdk.methods.fedprox.method import FedProx
from ursa.edge_sdk.methods.flicker.method import Flicker
from ursa.edge_sdk.methods_config import (
    ClimbSpec,
    DeviceMethodSpec,
    DubheSpec,
    FedProxSpec,
    flicker_spec,
    selection_kind,
    training_spec,
)
from ursa.edge_sdk.trainer import ModelTrainer, Trainer

__all__ = ["compose_methods"]

_Factory = tuple[str, Callable[[], DeviceMethod]]


def compose_methods(
    trainer: Trainer,
    specs: Sequence[DeviceMethodSpec],
    labels: NDArray[np.int64],
    given: Sequence[DeviceMethod] = (),
) -> list[DeviceMethod]:
    """``given``, and a method for every other kind the device runs.

    Built-in kinds come first, in the order selection, training, balancing
    (a `TrainPlan` is adjusted in this order); a given method replaces the
    built one of its kind.
    """
    by_kind = {method.name: method for method in given}
    composed = [
        by_kind.pop(kind) if kind in by_kind else build()
        for kind, build in _defaults(trainer, specs, labels)
    ]
    return [*composed, *by_kind.values()]


def _defaults(
    trainer: Trainer, specs: Sequence[DeviceMethodSpec], labels: NDArray[np.int64]
) -> list[_Factory]:
    defaults: list[_Factory] = []
    if selection_kind(specs) == "dubhe":
        draw = next((s.draw for s in specs if isinstance(s, DubheSpec)), "paper")
        defaults.append((Dubhe.name, lambda: Dubhe(draw)))
    if isinstance(trainer, PhasedTrainer):
        defaults.append((FedDisk.name, lambda: FedDisk(trainer)))
    else:
        spec = training_spec(specs)
        if isinstance(spec, ClimbSpec):
            config = spec.climb_config()
            defaults.append((Climb.name, lambda: Climb(config)))
        elif isinstance(spec, FedProxSpec):
            defaults.append((FedProx.name, lambda: FedProx(trainer)))
        elif isinstance(trainer, ModelTrainer) and trainer.climb is not None:
            own = trainer.climb
            defaults.append((Climb.name, lambda: Climb(own)))
    balancing = flicker_spec(specs)
    if balancing is not None:
        defaults.append((Flicker.name, lambda: Flicker(balancing, labels=labels)))
    return defaults
