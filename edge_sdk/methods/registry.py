"""The device halves a device runs: one table, by ``[[methods]]`` kind.

`DEVICE_METHODS` maps every kind to its settings class (the table's model in
`ursa.edge_sdk.methods_config`, which carries the role) and the builder of
its device half (None: the kind needs nothing on the device, e.g. ``fedavg``
or ``random``). It is the only place outside ``methods/`` that names a
method's class: a trainer never says which method it runs, the device's
``[[methods]]`` list does (CLIMB's settings are its table's, FedDisk is
built for a ``kind = "feddisk"`` table over a `PhasedTrainer`). Adding a
method adds one entry here.

A training method that trains through a trainer of its own (FedDisk's two
phases around the classifier's) says so in its entry (``trainer``);
`method_trainer` wraps the device's trainer by it, so composition never asks
which method it builds for.

`compose_methods` builds an `EdgeClient`'s method list from the table over
the device's `DeviceContext` (every builder and every app factory is handed
it): the methods the app's factories build, and one built half for every
other kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel

from ursa.edge_sdk.method import DeviceContext, DeviceMethod, MethodFactory
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods.feddisk.phased_trainer import PhasedTrainer
from ursa.edge_sdk.methods.fedprox.method import FedProx
from ursa.edge_sdk.methods.flicker.method import Flicker
from ursa.edge_sdk.methods_config import (
    ClimbDeviceSpec,
    DeviceMethodSpec,
    DubheDeviceSpec,
    FedAvgDeviceSpec,
    FeddiskDeviceSpec,
    FedProxDeviceSpec,
    FlickerDeviceSpec,
    RandomDeviceSpec,
    training_spec,
)
from ursa.edge_sdk.trainer import ModelTrainer, Trainer
from ursa.protocol.methods import MethodRole

__all__ = [
    "DEVICE_METHODS",
    "DeviceEntry",
    "MethodInputs",
    "compose_methods",
    "method_trainer",
]


@dataclass(frozen=True)
class MethodInputs:
    """What the device gives a builder besides the method's own table."""

    trainer: Trainer
    labels: NDArray[np.int64]


Builder = Callable[[Any, DeviceContext, MethodInputs], DeviceMethod]
"""``build(spec, ctx, inputs)``: the device half of one ``[[methods]]`` table."""

TrainerBuilder = Callable[[Any, ModelTrainer, int], Trainer]
"""``trainer(spec, classifier, seed)``: the trainer a training method runs."""


@dataclass(frozen=True)
class DeviceEntry:
    """One kind: its settings class (with its role) and its device half."""

    settings: type[BaseModel]
    build: Builder | None
    trainer: TrainerBuilder | None = None
    """A training method's own trainer around the classifier's (None: that one)."""

    @property
    def role(self) -> MethodRole:
        """Selection, training or balancing (the settings class says)."""
        role: MethodRole = getattr(self.settings, "role")  # noqa: B009 - ClassVar
        return role


def _dubhe(
    spec: DubheDeviceSpec, ctx: DeviceContext, inputs: MethodInputs
) -> DeviceMethod:
    return Dubhe(ctx, spec.draw)


def _climb(
    spec: ClimbDeviceSpec, ctx: DeviceContext, inputs: MethodInputs
) -> DeviceMethod:
    return Climb(ctx, spec.climb_config())


def _fedprox(
    spec: FedProxDeviceSpec, ctx: DeviceContext, inputs: MethodInputs
) -> DeviceMethod:
    return FedProx(ctx)


def _feddisk(
    spec: FeddiskDeviceSpec, ctx: DeviceContext, inputs: MethodInputs
) -> DeviceMethod:
    trainer = inputs.trainer
    if not isinstance(trainer, ModelTrainer) or not isinstance(trainer, PhasedTrainer):
        raise ValueError(
            "[[methods]] feddisk needs a trainer with FedDisk's two phases "
            f"(FeddiskTrainer); {type(trainer).__name__} has none"
        )
    if trainer.settings != spec.settings():
        raise ValueError(
            "[[methods]] feddisk: the trainer's FeddiskSettings differ from the "
            "table's (build the FeddiskTrainer with settings=spec.settings())"
        )
    return FedDisk(ctx, trainer)


def _feddisk_trainer(
    spec: FeddiskDeviceSpec, classifier: ModelTrainer, seed: int
) -> Trainer:
    from ursa.edge_sdk.methods.feddisk.trainer import FeddiskTrainer
    from ursa.edge_sdk.module_trainer import ModuleTrainer
    from ursa.edge_sdk.torch_trainer import TorchTrainer

    if not isinstance(classifier, (TorchTrainer, ModuleTrainer)):
        raise ValueError(
            f"FedDisk trains a TorchTrainer's or a ModuleTrainer's model, not "
            f"{type(classifier).__name__}'s"
        )
    return FeddiskTrainer(classifier, settings=spec.settings(), seed=seed)


def _flicker(
    spec: FlickerDeviceSpec, ctx: DeviceContext, inputs: MethodInputs
) -> DeviceMethod:
    return Flicker(ctx, spec, labels=inputs.labels)


DEVICE_METHODS: Mapping[str, DeviceEntry] = {
    "dubhe": DeviceEntry(DubheDeviceSpec, _dubhe),
    "random": DeviceEntry(RandomDeviceSpec, None),
    "fedavg": DeviceEntry(FedAvgDeviceSpec, None),
    "fedprox": DeviceEntry(FedProxDeviceSpec, _fedprox),
    "climb": DeviceEntry(ClimbDeviceSpec, _climb),
    "feddisk": DeviceEntry(FeddiskDeviceSpec, _feddisk, _feddisk_trainer),
    "flicker": DeviceEntry(FlickerDeviceSpec, _flicker),
}
"""Every kind a device's ``[[methods]]`` may name."""


def method_trainer(
    specs: Sequence[DeviceMethodSpec], classifier: ModelTrainer, seed: int
) -> Trainer:
    """The trainer the device's training method runs over ``classifier``.

    ``seed`` is the device's training seed (a method's own draws follow it).
    """
    spec = training_spec(specs)
    if spec is None:
        return classifier
    build = DEVICE_METHODS[spec.kind].trainer
    return classifier if build is None else build(spec, classifier, seed)


_ORDER = (MethodRole.SELECTION, MethodRole.TRAINING, MethodRole.BALANCING)
"""The order hooks run in (a `TrainPlan` is adjusted in this order)."""


def compose_methods(
    ctx: DeviceContext,
    specs: Sequence[DeviceMethodSpec],
    labels: NDArray[np.int64],
    given: Sequence[MethodFactory] = (),
) -> list[DeviceMethod]:
    """The methods ``given`` builds, and one for every other kind of ``specs``.

    Every method is built over ``ctx`` (its trainer is the one the tables
    are checked against). Built kinds come first, in the order selection,
    training, balancing; a given method replaces the built one of its kind.

    Raises:
        ValueError: a table the trainer cannot run (FedDisk without phases
            or with other settings than the table's, FedProx without a
            proximal term), or a trainer with FedDisk's phases and no
            ``kind = "feddisk"`` table; two given methods of one kind.
    """
    trainer = ctx.trainer
    kinds = {spec.kind for spec in specs}
    if "feddisk" not in kinds and isinstance(trainer, PhasedTrainer):
        raise ValueError(
            f"{type(trainer).__name__} trains FedDisk's phases: name "
            "kind = 'feddisk' in [[methods]]"
        )
    by_kind: dict[str, DeviceMethod] = {}
    for build in given:
        method = build(ctx)
        if method.name in by_kind:
            raise ValueError(f"two given methods of kind {method.name!r}")
        by_kind[method.name] = method
    inputs = MethodInputs(trainer, labels)
    composed = []
    for role in _ORDER:
        for spec in specs:
            entry = DEVICE_METHODS[spec.kind]
            if entry.role is not role:
                continue
            if spec.kind in by_kind:
                composed.append(by_kind.pop(spec.kind))
            elif entry.build is not None:
                composed.append(entry.build(spec, ctx, inputs))
    return [*composed, *by_kind.values()]
