"""Coordinator configuration: frozen pydantic models, loaded from TOML/JSON + env.

Only the entry point (`ursa coordinator serve`) calls `load_coordinator_config`;
everything else receives a `CoordinatorConfig`. A file looks like::

    federation = "trial1"
    state_dir = "/var/lib/ursa/coordinator"
    min_devices = 30
    k = 10
    tries = 5
    rounds = 100
    key_bits = 2048

    [broker]
    url = "mqtt://127.0.0.1:1883"     # mqtts:// for TLS
    username = "coordinator"
    # password: better from the environment, URSA_BROKER__PASSWORD

    [enrolment]
    mode = "pinned"                   # or "tofu"
    pins = { dev001 = "<32 hex digits from `ursa device run` / identity>" }

    [deadlines]
    key_epoch_s = 60.0
    registration_s = 60.0
    volunteer_s = 10.0
    distributions_s = 10.0
    agent_s = 10.0
    training_s = 600.0

    [registry]
    num_classes = 10
    groups = [1, 2, 10]
    sigma = [0.7, 0.1, 0.0]

    [training]                        # optional: without it rounds only select
    initial_weights = "weights.ursw"  # `ursa model init ... --out weights.ursw`
    weighting = "climb"               # none (= fedavg) | fedavg | equal | climb
                                      # | feddisk
    model = "classifier"              # the wire name devices train (their `model`)
    update_timeout_s = 300.0          # any other `TrainingConfig` field too
    dual_timeout_s = 60.0
    # FedDisk only: the global MADE's initial weights (`ursa model init --model
    # made ...`) and `FeddiskConfig` fields
    made_initial_weights = "made.ursw"
    feddisk = { max_made_rounds = 50 }

The ``[training]`` section holds `TrainingConfig`'s fields plus
``initial_weights``, adopted as version 0 when no checkpoint exists yet; the
architecture and its shape are the devices' business (their ``[training]``),
so the coordinator needs no torch. With ``weighting = "feddisk"`` the
classifier rounds are FedAvg and a `FeddiskPlugin` runs the MADE rounds first
(the same deadlines and chunking, model name ``feddisk.made_model``).

Environment overrides: ``URSA_<FIELD>`` for a top-level field and
``URSA_<SECTION>__<FIELD>`` for a nested one (``URSA_K=20``,
``URSA_ENROLMENT__MODE=tofu``, ``URSA_BROKER__PASSWORD=...``). Values are
parsed as JSON when they parse, else taken as strings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

from ursa._compat import tomllib
from ursa.protocol.broker_config import BrokerConfig
from ursa.protocol.codebook import Codebook, CodebookError
from ursa.protocol.messages import ID_PATTERN

if TYPE_CHECKING:  # imported lazily: training_round -> core -> this module
    from ursa.coordinator.feddisk_plugin import FeddiskConfig
    from ursa.coordinator.training_round import TrainingConfig

__all__ = [
    "DEFAULT_ENV_PREFIX",
    "BrokerConfig",
    "CoordinatorConfig",
    "DeadlinesConfig",
    "EnrolmentConfig",
    "RegistryConfig",
    "TrainingSection",
    "config_data_from",
    "load_coordinator_config",
]

DEFAULT_ENV_PREFIX = "URSA_"
DEFAULT_KEY_BITS = 2048
"""~112-bit security; tests use 512/1024 (breakable, for speed only)."""
DEFAULT_MAX_PARTIES = 10_000
"""Registry slot width bound: sums of up to this many devices never carry."""
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnrolmentConfig(_Frozen):
    """Who may enrol: a pinned list (the field-trial default) or trust on first use.

    `pins` maps device id to `DevicePublicIdentity.fingerprint()`. In `tofu`
    mode the first key a device id presents wins; a different key later is
    refused (and logged), as is every unlisted device in `pinned` mode.
    """

    mode: Literal["pinned", "tofu"] = "pinned"
    pins: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_pins(self) -> Self:
        for device_id, fingerprint in self.pins.items():
            if len(fingerprint) != 32 or any(
                c not in "0123456789abcdef" for c in fingerprint
            ):
                raise ValueError(f"pin for {device_id!r} must be 32 lower-case hex")
        return self


class DeadlinesConfig(_Frozen):
    """Per-phase deadlines in seconds (a phase closes early once all have answered)."""

    key_epoch_s: float = Field(default=60.0, gt=0)
    registration_s: float = Field(default=60.0, gt=0)
    volunteer_s: float = Field(default=10.0, gt=0)
    distributions_s: float = Field(default=10.0, gt=0)
    agent_s: float = Field(default=10.0, gt=0)
    training_s: float = Field(default=600.0, gt=0)


class RegistryConfig(_Frozen):
    """Dubhe registry parameters, sent to devices in the signed key-epoch notice."""

    num_classes: int = Field(default=10, ge=2, le=4096)
    groups: tuple[int, ...] = (1, 2, 10)
    sigma: tuple[float, ...] = (0.7, 0.1, 0.0)
    """One threshold per group, increasing group size; the last (sigma_C) is 0."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)

    @model_validator(mode="after")
    def _check(self) -> Self:
        try:
            codebook = Codebook(self.num_classes, self.groups)
        except CodebookError as exc:
            raise ValueError(str(exc)) from None
        if codebook.groups != self.groups:
            raise ValueError("groups must be strictly increasing")
        if len(self.sigma) != len(self.groups) or self.sigma[-1] != 0.0:
            raise ValueError("sigma needs one value per group, the last 0.0")
        if any(not 0.0 <= s <= 1.0 for s in self.sigma):
            raise ValueError("sigma values must lie in [0, 1]")
        return self


class TrainingSection(BaseModel):
    """The ``[training]`` section: `TrainingConfig` fields plus the initial weights.

    Fields other than ``initial_weights`` and ``weighting`` are passed to
    `TrainingConfig` unchanged (and checked by it when the section loads).
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    initial_weights: Path | None = None
    """A `ursa.models.weights` file adopted as version 0 if no checkpoint exists."""
    weighting: Literal["none", "fedavg", "equal", "climb", "feddisk"] = "fedavg"
    """``none`` is plain FedAvg (weights by example count), as in `ursa demo`."""
    made_initial_weights: Path | None = None
    """FedDisk: the global MADE's version 0 (`ursa model init --model made`)."""
    feddisk: dict[str, Any] = Field(default_factory=dict)
    """FedDisk: `ursa.coordinator.feddisk_plugin.FeddiskConfig` fields."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        self.training_config()  # a bad TrainingConfig field fails the load
        if self.weighting == "feddisk":
            self.made_training_config()
        elif self.feddisk or self.made_initial_weights is not None:
            raise ValueError("feddisk settings need weighting = 'feddisk'")
        return self

    def training_config(self) -> TrainingConfig:
        """The `TrainingConfig` this section describes (the classifier's)."""
        from ursa.coordinator.training_round import TrainingConfig

        weighting = self.weighting
        if weighting in ("none", "feddisk"):
            weighting = "fedavg"
        fields = dict(self.model_extra or {})
        return TrainingConfig.model_validate({**fields, "weighting": weighting})

    def feddisk_config(self) -> FeddiskConfig:
        """FedDisk's phase-1 settings."""
        from ursa.coordinator.feddisk_plugin import FeddiskConfig

        return FeddiskConfig.model_validate(self.feddisk)

    def made_training_config(self) -> TrainingConfig:
        """The MADE rounds' `TrainingConfig`: the classifier's, FedAvg, MADE's name."""
        made = self.feddisk_config().made_model
        classifier = self.training_config()
        if made == classifier.model:
            raise ValueError(f"the MADE and the classifier are both named {made!r}")
        return classifier.model_copy(update={"model": made})


class CoordinatorConfig(_Frozen):
    """Everything the coordinator service needs (frozen; see the module doc)."""

    federation: str = Field(pattern=ID_PATTERN)
    state_dir: Path
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    enrolment: EnrolmentConfig = Field(default_factory=EnrolmentConfig)
    deadlines: DeadlinesConfig = Field(default_factory=DeadlinesConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    min_devices: int = Field(default=20, ge=1)
    """Enrolled online devices needed before the first key epoch starts."""
    k: int = Field(default=10, ge=1)
    tries: int = Field(default=1, ge=1, le=256)
    rounds: int = Field(default=10, ge=0)
    """Rounds to run, then the service idles (0: none, only enrolment and epoch)."""
    rounds_per_epoch: int = Field(default=0, ge=0)
    """Start a new key epoch every this many rounds (0: only when the agent is lost)."""
    key_bits: int = Field(default=DEFAULT_KEY_BITS, ge=512, le=4096, multiple_of=8)
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    poll_interval_s: float = Field(default=0.05, gt=0)
    seed: int | None = None
    """Seeds the coordinator's generator (agent choice, trim/top-up); None: random."""
    training: TrainingSection | None = None
    """Training rounds (`TrainingPlugin`); None: rounds end at the selection."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.k > self.min_devices:
            raise ValueError(f"k={self.k} exceeds min_devices={self.min_devices}")
        if self.k > self.registry.max_parties:
            raise ValueError("k exceeds registry.max_parties")
        return self


def config_data_from(
    path: Path | None, environ: Mapping[str, str], prefix: str = DEFAULT_ENV_PREFIX
) -> dict[str, Any]:
    """Read a TOML or JSON file (if given) and apply ``URSA_*`` overrides.

    Raises:
        ValueError: the file is neither TOML nor JSON, or does not parse.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_bytes()
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        elif path.suffix.lower() == ".toml":
            data = tomllib.loads(text.decode())
        else:
            raise ValueError(f"config file must end in .toml or .json: {path}")
        if not isinstance(data, dict):
            raise ValueError(f"config file {path} must hold a table/object")
    for name, raw in environ.items():
        if not name.startswith(prefix) or len(name) == len(prefix):
            continue
        keys = name[len(prefix) :].lower().split("__")
        target = data
        for key in keys[:-1]:
            child = target.setdefault(key, {})
            if not isinstance(child, dict):
                raise ValueError(f"{name}: {key!r} is not a table")
            target = child
        target[keys[-1]] = _env_value(raw)
    return data


def _env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def load_coordinator_config(
    path: Path | None, environ: Mapping[str, str] | None = None
) -> CoordinatorConfig:
    """Load the coordinator config (entry points only; pass `os.environ`).

    Only variables naming a `CoordinatorConfig` field are applied, so other
    ``URSA_*`` variables (e.g. ``URSA_REQUIRE_MOSQUITTO``) do not get in the way.
    """
    env = os.environ if environ is None else environ
    fields = set(CoordinatorConfig.model_fields)
    wanted = {
        k: v
        for k, v in env.items()
        if k.startswith(DEFAULT_ENV_PREFIX)
        and k[len(DEFAULT_ENV_PREFIX) :].lower().split("__")[0] in fields
    }
    return CoordinatorConfig.model_validate(config_data_from(path, wanted))
