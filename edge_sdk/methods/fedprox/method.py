"""FedProx's device half (Li et al. 2020; coordinator: ``methods/fedprox``).

A selected device minimises its loss plus ``(mu / 2) * ||w - w_global||^2``,
``w_global`` the round's global model, and uploads its delta as under FedAvg;
the coordinator averages by example count. ``mu`` is the federation's: the
coordinator signs it into every `KeyEpochStart` (``method_settings``), and
`FedProx.plan` hands it to the trainer through the `TrainPlan`. A value
outside ``[0, MAX_MU]`` (`ursa.protocol.fedprox`) is refused: the device
logs why and answers the round with ``training_failed``. The coordinator
learns nothing FedAvg does not tell it.

The trainer must add the term itself (`ModelTrainer.proximal`:
`TorchTrainer`, `ModuleTrainer`); a device whose trainer cannot (an
`ArrayTrainer` app) refuses FedProx when it is built.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

from ursa.edge_sdk.method import DeviceContext, DeviceMethod, TrainPlan
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.protocol.fedprox import FEDPROX, MU_SETTING, FedProxMuError, check_mu
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Router

__all__ = ["FedProx", "ProximalUnsupportedError"]

logger = logging.getLogger("ursa.edge_sdk")


class ProximalUnsupportedError(ValueError):
    """The device's trainer cannot add FedProx's proximal term."""


class FedProx(DeviceMethod):
    """FedProx's device half: the signed ``mu`` into each round's `TrainPlan`.

    Raises:
        ProximalUnsupportedError: the device's trainer has no proximal term.
    """

    name: ClassVar[str] = FEDPROX
    role: ClassVar[MethodRole | None] = MethodRole.TRAINING

    def __init__(self, ctx: DeviceContext) -> None:
        trainer = ctx.trainer
        if not isinstance(trainer, ModelTrainer) or not trainer.proximal:
            reason = (
                f"[[methods]] fedprox needs a trainer that adds the proximal "
                f"term (TorchTrainer, ModuleTrainer); {type(trainer).__name__} "
                "does not"
            )
            logger.error("refusing FedProx: %s", reason)
            raise ProximalUnsupportedError(reason)
        self.ctx = ctx
        """The device this method runs on."""

    def register(self, router: Router) -> None:
        """FedProx has no message kinds of its own."""

    def plan(self, plan: TrainPlan) -> TrainPlan:
        """The round trains with the epoch's signed ``mu``.

        Raises:
            FedProxMuError: the epoch signs no ``mu``, or one outside
                ``[0, MAX_MU]`` or not finite (logged).
        """
        return dataclasses.replace(plan, proximal_mu=self.mu(plan.round))

    def mu(self, round_index: int) -> float:
        """The adopted key epoch's signed ``mu``, checked.

        Raises:
            FedProxMuError: none signed, or outside ``[0, MAX_MU]`` (logged).
        """
        notice = self.ctx.epoch
        try:
            value = (
                None if notice is None else notice.method_setting(FEDPROX, MU_SETTING)
            )
            if value is None:
                raise FedProxMuError("the key epoch signs no FedProx mu")
            return check_mu(value)
        except FedProxMuError as exc:
            logger.error(
                "%s: refusing to train round %d: %s",
                self.ctx.device_id,
                round_index,
                exc,
            )
            raise
