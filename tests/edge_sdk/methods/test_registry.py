"""The device's one method table: every kind, chosen by ``[[methods]]`` alone."""

from __future__ import annotations

import typing
from collections.abc import Callable

import numpy as np
import pytest

from tests.edge_sdk.methods.conftest import FakeContext, FixedLoss
from ursa.edge_sdk import methods_config as specs
from ursa.edge_sdk.method import DeviceContext
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.edge_sdk.methods.fedprox.method import ProximalUnsupportedError
from ursa.edge_sdk.methods.registry import DEVICE_METHODS, compose_methods
from ursa.edge_sdk.trainer import Trainer
from ursa.protocol.methods import MethodRole

LABELS = np.array([0, 1, 1], dtype=np.int64)


class _Phased(FixedLoss):
    """A model trainer with FedDisk's phases (the `PhasedTrainer` protocol)."""

    def __init__(self) -> None:
        super().__init__(0.5)
        self.settings = FeddiskSettings()
        self.phase: typing.Literal["made", "classifier"] = "made"
        self.model = self.settings.made_model

    def validation_loss(self, made_arrays: object) -> tuple[float, int]:
        return 1.0, 1

    def switch(self, global_made: object) -> dict[str, float]:
        return {}

    def restore_weights(self, weights: object) -> None:
        pass

    @property
    def sample_weights(self) -> None:
        return None


def test_the_table_has_every_kind_a_device_table_may_name() -> None:
    union = typing.get_args(typing.get_args(specs.DeviceMethodSpec)[0])
    kinds = {cls.model_fields["kind"].default: cls for cls in union}
    assert {kind: entry.settings for kind, entry in DEVICE_METHODS.items()} == kinds
    assert DEVICE_METHODS["climb"].role is MethodRole.TRAINING
    assert DEVICE_METHODS["flicker"].role is MethodRole.BALANCING


def _ctx(new_context: Callable[[], FakeContext], trainer: Trainer) -> FakeContext:
    ctx = new_context()
    ctx.trainer = trainer
    return ctx


def test_climb_takes_its_settings_from_its_table_not_the_trainer(
    new_context: Callable[[], FakeContext],
) -> None:
    table = (specs.DubheDeviceSpec(), specs.ClimbDeviceSpec(eta_d=0.25))
    ctx = _ctx(new_context, FixedLoss(0.5))
    dubhe, climb = compose_methods(ctx, table, LABELS)
    assert isinstance(dubhe, Dubhe) and isinstance(climb, Climb)
    assert dubhe.ctx is ctx and climb.ctx is ctx  # built over the device's context
    assert climb.config.eta_d == 0.25
    assert not hasattr(FixedLoss(0.5), "climb")


def test_feddisk_is_chosen_by_its_table(new_context: Callable[[], FakeContext]) -> None:
    phased = _ctx(new_context, _Phased())
    table = (specs.DubheDeviceSpec(), specs.FeddiskDeviceSpec())
    methods = compose_methods(phased, table, LABELS)
    assert [type(m) for m in methods] == [Dubhe, FedDisk]
    with pytest.raises(ValueError, match="name kind = 'feddisk'"):
        compose_methods(
            phased, (specs.DubheDeviceSpec(), specs.FedAvgDeviceSpec()), LABELS
        )
    with pytest.raises(ValueError, match="FedDisk's two phases"):
        compose_methods(_ctx(new_context, FixedLoss(0.5)), table, LABELS)
    other = (specs.DubheDeviceSpec(), specs.FeddiskDeviceSpec(made_lr=0.5))
    with pytest.raises(ValueError, match="differ from the table's"):
        compose_methods(phased, other, LABELS)


def test_a_kind_needing_nothing_builds_nothing_and_a_given_method_wins(
    new_context: Callable[[], FakeContext],
) -> None:
    ctx = _ctx(new_context, FixedLoss(0.5))
    assert compose_methods(ctx, (specs.RandomDeviceSpec(),), LABELS) == []
    contexts: list[DeviceContext] = []

    def own(given: DeviceContext) -> Dubhe:
        contexts.append(given)
        return Dubhe(given, "stratified")

    table = (specs.DubheDeviceSpec(), specs.FedAvgDeviceSpec())
    (built,) = compose_methods(ctx, table, LABELS, [own])
    assert isinstance(built, Dubhe) and built.draw == "stratified"
    assert contexts == [ctx]
    with pytest.raises(ValueError, match="two given methods of kind 'dubhe'"):
        compose_methods(ctx, table, LABELS, [own, Dubhe])
    fedprox = (specs.DubheDeviceSpec(), specs.FedProxDeviceSpec())
    with pytest.raises(ProximalUnsupportedError):
        compose_methods(ctx, fedprox, LABELS)
