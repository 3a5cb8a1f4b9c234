"""The coordinator's ``[[methods]]`` list: which methods a federation runs.

One table per method, told apart by ``kind`` (a discriminated union, unknown
fields refused)::

    [[methods]]
    kind = "dubhe"                    # selection: the encrypted registry (or "random")
    draw = "paper"                    # or "stratified" (ursa's option)
    max_participation = 0.5           # at most this share of any 10 rounds

    [[methods]]
    kind = "climb"                    # training: FedAvg weighted by CLIMB's duals
    dual_timeout_s = 60.0

    [[methods]]
    kind = "fedprox"                  # or: FedAvg with a proximal term on devices
    mu = 0.01                         # signed into each key epoch

    [[methods]]
    kind = "flicker"                  # balancing: before the first key epoch
    nabla = 0.1

A federation has exactly one selection method, at most one training method
(none: rounds end at the selection, a selection-only trial) and at most one
balancing method (FLICKER, run once before the first key epoch). The kinds,
in this order, are the list signed into every `KeyEpochStart`, so a device
configured differently refuses the epoch (``method_mismatch``) instead of
silently skipping a method's steps; the settings devices take from the
coordinator (FedProx's ``mu``) are signed beside them (`method_settings`).

This module imports nothing from the coordinator's runtime (the runtime's
config imports it); `ursa.tools.compose` turns the specs into plugins.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ursa.coordinator.methods.fedprox.settings import FedProxSpec
from ursa.protocol.messages import NAME_PATTERN, MethodSetting
from ursa.protocol.methods import MethodRole, MethodsError, check_method_list
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES

__all__ = [
    "DEFAULT_METHODS",
    "DRAWS",
    "BalancingSpec",
    "ClimbSpec",
    "Draw",
    "DubheSpec",
    "FedAvgSpec",
    "FedProxSpec",
    "FeddiskSpec",
    "FlickerSpec",
    "MethodRole",
    "MethodSpec",
    "MethodsError",
    "RandomSpec",
    "SelectionSpec",
    "TrainingSpec",
    "balancing_spec",
    "check_methods",
    "method_names",
    "method_settings",
    "selection_spec",
    "training_spec",
]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    role: ClassVar[MethodRole]

    def signed_settings(self) -> tuple[MethodSetting, ...]:
        """Settings devices take from the coordinator (default: none)."""
        return ()

    def registers_rank_key(self) -> bool:
        """A selection method whose devices register a rank key (default: no)."""
        return False

    def extra_models(self) -> tuple[str, ...]:
        """Wire names of the models a training method adds to the classifier."""
        return ()


Draw = Literal["paper", "stratified"]
"""Dubhe's volunteer draw (`ursa.edge_sdk.registration`)."""

DRAWS: tuple[Draw, ...] = ("paper", "stratified")


class DubheSpec(_Spec):
    """Dubhe: devices self-select from the Paillier-encrypted registry.

    ``draw``: ``"paper"``, the paper's independent coins, or
    ``"stratified"``, ursa's draw with exact per-category quotas from the
    epoch's shared seed (ranks handed out once per key epoch; each round's
    selection goes to each selected device alone). Devices must be
    configured with the same draw.
    """

    role: ClassVar[MethodRole] = MethodRole.SELECTION
    kind: Literal["dubhe"] = "dubhe"
    draw: Draw = "paper"
    """``paper``: independent coins; ``stratified``: exact per-category quotas."""
    max_participation: float = Field(default=0.5, gt=0.0, le=1.0)
    """Largest share of any ``participation_window`` consecutive rounds one
    device is selected in (coordinator only; 1.0: no cap). A device's draws
    are private, so one that always volunteers looks like an honest device
    of a rare category; the cap bounds what it gains. 0.5: no device in more
    than half the rounds, at a measured cost in balance
    (docs/bounded_influence.md, "Selection")."""
    participation_window: int = Field(default=10, ge=1, le=10_000)
    """The cap's sliding window, in rounds."""

    def registers_rank_key(self) -> bool:
        """The stratified draw: each registration carries a one-time rank key."""
        return self.draw == "stratified"


class RandomSpec(_Spec):
    """Random selection: K of the online registered devices, uniformly (a baseline)."""

    role: ClassVar[MethodRole] = MethodRole.SELECTION
    kind: Literal["random"] = "random"


class FedAvgSpec(_Spec):
    """FedAvg: updates averaged by example count (or equally)."""

    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["fedavg"] = "fedavg"
    weights: Literal["examples", "equal"] = "examples"
    """``examples``: each update weighs its training-set size; ``equal``: one each."""


class ClimbSpec(_Spec):
    """CLIMB: FedAvg weighted by the devices' dual variables (an encrypted mean)."""

    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["climb"] = "climb"
    dual_timeout_s: float = Field(default=60.0, gt=0.0)
    """Dual reports are not waited for after this long."""
    dual_period: int = Field(default=1, ge=1)
    """A dual step in rounds 1, 1 + period, ..."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Most dual reports in one encrypted sum (the devices' codec bound too)."""


class FeddiskSpec(_Spec):
    """FedDisk: a federated MADE first, then density-ratio-weighted training."""

    role: ClassVar[MethodRole] = MethodRole.TRAINING
    kind: Literal["feddisk"] = "feddisk"
    made_initial_weights: Path | None = None
    """The global MADE's version 0 (`ursa model init --model made`)."""
    made_model: str = Field(default="made", pattern=NAME_PATTERN, max_length=24)
    """The wire name of the global MADE (a second model beside the classifier)."""
    max_made_rounds: int = Field(default=50, ge=1)
    """MADE rounds at most; then the switch, whatever the loss does."""
    loss_timeout_s: float = Field(default=60.0, gt=0.0)
    """Loss reports are not waited for after this long (from the request)."""
    verdict_timeout_s: float = Field(default=30.0, gt=0.0)
    """The agent's verdict is not waited for after this long (from the sum)."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Most loss reports in one sum (the devices' codec bound too)."""

    def extra_models(self) -> tuple[str, ...]:
        """The global MADE, trained beside the classifier."""
        return (self.made_model,)


class FlickerSpec(_Spec):
    """FLICKER: CKKS global class counts; the most skewed device resamples.

    Defaults equal `ursa.coordinator.methods.flicker.types`' (the FLICKER paper, §4.1).
    """

    role: ClassVar[MethodRole] = MethodRole.BALANCING
    kind: Literal["flicker"] = "flicker"
    nabla: float = Field(default=0.1, gt=0.0, lt=1.0)
    """The run stops once the global imbalance min/max reaches it."""
    nabla_client: float = Field(default=0.05, gt=0.0, le=1.0)
    """Target local imbalance sent to the dominant device."""
    hop_deadline_s: float = Field(default=30.0, gt=0.0)
    """A ring member holding the running sum longer is skipped."""
    reply_deadline_s: float = Field(default=60.0, gt=0.0)
    """A cosine or resample reply later than this counts as silent."""
    redundancy_deadline_s: float = Field(default=30.0, gt=0.0)
    """A peer silent this long in a redundancy test is skipped."""
    max_updates: int = Field(default=10_000, ge=1)
    """Safety cap on count updates in one run."""
    max_product_ciphertexts: int = Field(default=64, ge=1, le=4096)
    """Most ciphertexts in one peer's redundancy reply (bounds its size)."""


MethodSpec = Annotated[
    DubheSpec
    | RandomSpec
    | FedAvgSpec
    | ClimbSpec
    | FeddiskSpec
    | FedProxSpec
    | FlickerSpec,
    Field(discriminator="kind"),
]
"""One ``[[methods]]`` table."""

SelectionSpec = DubheSpec | RandomSpec
"""The selection methods' specs."""

TrainingSpec = FedAvgSpec | ClimbSpec | FeddiskSpec | FedProxSpec
"""The training methods' specs."""

BalancingSpec = FlickerSpec
"""The balancing methods' specs."""

DEFAULT_METHODS: tuple[MethodSpec, ...] = (DubheSpec(),)
"""Selection only, as before ``[[methods]]`` existed."""


def check_methods(methods: Sequence[MethodSpec]) -> None:
    """Refuse a list that cannot run: one clear reason (`MethodsError`)."""
    check_method_list(methods)


def method_names(methods: Sequence[MethodSpec]) -> tuple[str, ...]:
    """The kinds in order: the list signed into each key epoch."""
    return tuple(m.kind for m in methods)


def method_settings(methods: Sequence[MethodSpec]) -> tuple[MethodSetting, ...]:
    """The methods' settings signed beside their names (FedProx's ``mu``)."""
    return tuple(s for m in methods for s in m.signed_settings())


def balancing_spec(methods: Sequence[MethodSpec]) -> BalancingSpec | None:
    """The balancing method's table (FLICKER's), if the federation runs one."""
    return next((m for m in methods if isinstance(m, BalancingSpec)), None)


def training_spec(methods: Sequence[MethodSpec]) -> TrainingSpec | None:
    """The training method, if any."""
    for spec in methods:
        if isinstance(spec, TrainingSpec):
            return spec
    return None


def selection_spec(methods: Sequence[MethodSpec]) -> SelectionSpec:
    """The selection method (`check_methods` ensures there is exactly one).

    Raises:
        MethodsError: the list has none.
    """
    for spec in methods:
        if spec.role is MethodRole.SELECTION:
            assert isinstance(spec, SelectionSpec)
            return spec
    raise MethodsError("[[methods]] needs a selection method (e.g. dubhe)")
