"""The device's ``[[methods]]`` list: what this device runs, as the coordinator's.

Tables told apart by ``kind``, each with the method's device settings::

    [[methods]]
    kind = "dubhe"

    [[methods]]
    kind = "climb"
    eta_d = 0.1                 # `ursa.edge_sdk.methods.climb.dual.ClimbConfig` fields

    [[methods]]
    kind = "fedprox"            # or: mu comes signed from the coordinator

    [[methods]]
    kind = "flicker"            # `FlickerDeviceSpec` fields
    features_file = "centroids.npz"

The list must name the same methods as the federation's (signed into each
`KeyEpochStart`); otherwise the device refuses the epoch with
``method_mismatch``. A training method needs the device's ``[training]``
section (its data and model). Without ``[[methods]]`` a device runs Dubhe,
plus FedAvg when it has a ``[training]`` section.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.protocol.methods import MethodRole, MethodsError, check_method_list

__all__ = [
    "ClimbDeviceSpec",
    "DeviceMethodSpec",
    "DubheDeviceSpec",
    "FedAvgDeviceSpec",
    "FedProxDeviceSpec",
    "FeddiskDeviceSpec",
    "FlickerDeviceSpec",
    "RandomDeviceSpec",
    "TrainingSpec",
    "check_device_methods",
    "default_methods",
    "flicker_spec",
    "selection_kind",
    "training_spec",
]


class DubheDeviceSpec(BaseModel):
    """Dubhe: register the encrypted class counts, volunteer, report.

    ``draw`` must equal the coordinator's: ``"paper"`` (independent coins)
    or ``"stratified"`` (a one-time key with the registration, a rank from
    the agent, exact per-category quotas from the epoch's shared seed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole] = MethodRole.SELECTION
    kind: Literal["dubhe"] = "dubhe"
    draw: Literal["paper", "stratified"] = "paper"
    """Must equal the coordinator's: ``paper`` or ``stratified``."""


class RandomDeviceSpec(BaseModel):
    """Random selection: nothing to do but train when the coordinator picks us."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole] = MethodRole.SELECTION
    kind: Literal["random"] = "random"


class FedAvgDeviceSpec(BaseModel):
    """Plain local training; the coordinator averages."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["fedavg"] = "fedavg"


class FedProxDeviceSpec(BaseModel):
    """FedProx: local training with the proximal term; ``mu`` is the coordinator's.

    The device takes ``mu`` from the key epoch's signed settings
    (`ursa.edge_sdk.methods.fedprox`), so it has nothing to set here.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["fedprox"] = "fedprox"


class ClimbDeviceSpec(ClimbConfig):
    """CLIMB: the dual step's settings (`ClimbConfig`)."""

    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["climb"] = "climb"

    def climb_config(self) -> ClimbConfig:
        """The settings without the table's ``kind``."""
        return ClimbConfig.model_validate(self.model_dump(exclude={"kind"}))


class FeddiskDeviceSpec(FeddiskSettings):
    """FedDisk: the MADE and weighting settings (`FeddiskSettings`)."""

    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["feddisk"] = "feddisk"

    def settings(self) -> FeddiskSettings:
        """The settings without the table's ``kind``."""
        return FeddiskSettings.model_validate(self.model_dump(exclude={"kind"}))


class FlickerDeviceSpec(BaseModel):
    """FLICKER: take part in the ring and resample when the coordinator asks.

    Defaults equal `ursa.edge_sdk.methods.flicker`'s. A training device
    resamples its images (`DataResampler`: rotated copies, under-sampling by a
    shared feature extractor, ``features_file``); a device without one, or
    without ``[training]``, resamples its labels by count (random copies and
    removals).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole] = MethodRole.BALANCING
    kind: Literal["flicker"] = "flicker"
    features_file: Path | None = None
    """``.npz`` with ``centroids`` (K, d) and ``temperature``: the shared
    `CentroidFeatures` (e.g. fit on auxiliary data by the operator)."""
    theta: float = Field(default=0.10, gt=0.0, le=1.0)
    """Share of the majority class examined per under-sampling step."""
    orientation: Literal["rotate", "dihedral"] = "rotate"
    """Over-sampling copies: rotated (digits) or flipped/turned (photos)."""
    global_test: bool = True
    """Ask the other devices before removing a sample (the global test)."""
    max_steps: int = Field(default=200, ge=1)
    """Safety cap on resampling steps."""
    max_context_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest CKKS public context accepted from the coordinator."""
    num_classes: int | None = Field(default=None, ge=2, le=4096)
    """The federation's classes (default: the model's ``num_classes``, else
    the largest local label plus one)."""


DeviceMethodSpec = Annotated[
    DubheDeviceSpec
    | RandomDeviceSpec
    | FedAvgDeviceSpec
    | FedProxDeviceSpec
    | ClimbDeviceSpec
    | FeddiskDeviceSpec
    | FlickerDeviceSpec,
    Field(discriminator="kind"),
]
"""One device ``[[methods]]`` table."""

TrainingSpec = (
    FedAvgDeviceSpec | FedProxDeviceSpec | ClimbDeviceSpec | FeddiskDeviceSpec
)
"""The training methods' tables."""


def default_methods(*, trains: bool) -> tuple[DeviceMethodSpec, ...]:
    """Dubhe, plus FedAvg for a device that trains."""
    return (DubheDeviceSpec(), FedAvgDeviceSpec()) if trains else (DubheDeviceSpec(),)


def check_device_methods(methods: Sequence[DeviceMethodSpec], *, trains: bool) -> None:
    """Refuse a list the device cannot run (one reason).

    A training method without ``[training]`` is fine here: an app that embeds
    the SDK passes its own trainer to `EdgeClient` (which checks the two
    agree); ``ursa device run`` needs the section and says so itself.

    Raises:
        MethodsError: a kind twice, not exactly one selection method, two
            training methods, or ``[training]`` without a training method.
    """
    check_method_list(methods)
    training = [m.kind for m in methods if m.role is MethodRole.TRAINING]
    if "flicker" in {m.kind for m in methods} and "feddisk" in training:
        raise MethodsError("flicker with feddisk is not supported yet")
    if trains and not training:
        raise MethodsError(
            "[training] needs a training method in [[methods]] "
            "(kind = 'fedavg', 'fedprox', 'climb' or 'feddisk')"
        )


def flicker_spec(methods: Sequence[DeviceMethodSpec]) -> FlickerDeviceSpec | None:
    """FLICKER's table, if the device runs it."""
    return next((m for m in methods if isinstance(m, FlickerDeviceSpec)), None)


def training_spec(methods: Sequence[DeviceMethodSpec]) -> TrainingSpec | None:
    """The training method, if any."""
    for spec in methods:
        if isinstance(spec, TrainingSpec):
            return spec
    return None


def selection_kind(methods: Sequence[DeviceMethodSpec]) -> str:
    """The selection method's kind (`check_device_methods` ensures exactly one)."""
    for spec in methods:
        if spec.role is MethodRole.SELECTION:
            return spec.kind
    raise MethodsError("[[methods]] needs a selection method (e.g. dubhe)")
