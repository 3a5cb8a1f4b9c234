"""FedProx's ``[[methods]]`` table on the coordinator: ``mu``, signed to devices.

Rounds aggregate as FedAvg (by example count); the only thing FedProx adds
on this side is ``mu``, which goes out in every `KeyEpochStart`'s
``method_settings``, so a device trains with the federation's value.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ursa.protocol.fedprox import DEFAULT_MU, FEDPROX, MAX_MU, MU_SETTING, check_mu
from ursa.protocol.messages import MethodSetting
from ursa.protocol.methods import MethodRole

__all__ = ["FedProxSpec"]


class FedProxSpec(BaseModel):
    """FedProx: FedAvg, with devices pulled toward the global model by ``mu``."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["fedprox"] = FEDPROX
    mu: float = Field(default=DEFAULT_MU, ge=0.0, le=MAX_MU)
    """The proximal term's weight: ``(mu / 2) * ||w - w_global||^2``."""

    @field_validator("mu")
    @classmethod
    def _mu(cls, value: float) -> float:
        return check_mu(value)

    def signed_settings(self) -> tuple[MethodSetting, ...]:
        """``mu``, for the key epoch's signed ``method_settings``."""
        return (MethodSetting(method=FEDPROX, name=MU_SETTING, value=self.mu),)

    def extra_models(self) -> tuple[str, ...]:
        """None: FedProx trains the classifier alone."""
        return ()
