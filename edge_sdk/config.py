"""Device configuration: a frozen pydantic model, loaded from TOML/JSON + env.

Only the entry point (`ursa device run`, or the app embedding the SDK) reads
files and the environment; `EdgeClient` receives a `DeviceConfig`::

    device_id = "dev001"
    federation = "trial1"
    state_dir = "/var/lib/ursa/device"   # identity, epoch key (0600), draws
    labels_file = "labels.npy"            # `ursa device run` only (.npy/.txt/.csv)
    coordinator_fingerprint = "<32 hex>"  # optional pin; else trust on first use
    obfuscator_pool_size = 4

    [trust]                               # `ursa.protocol.trust_config`
    operator_public_key = "<64 hex>"      # from `ursa operator init`
    certificate = "/etc/ursa/dev001.cert" # from `ursa operator certify device`

    [broker]
    url = "mqtts://broker.example:8883"
    username = "dev001"                   # = device id (Mosquitto ACL %u)
    tls_ca_file = "/etc/ursa/ca.crt"
    # password from the environment: URSA_BROKER__PASSWORD,
    # or password_file = "/etc/ursa/dev001.password" (mode 0600)

    [training]                            # optional: a device that trains (torch)
    data_file = "data.npz"                # x and y arrays; or a data-set spec
    architecture = "mlp"                  # mlp | cnn | "package.module:factory"
    model_options = { input_dim = 64, num_classes = 10, hidden_sizes = [32] }
    wire_dtype = "float16"                # upload precision (float32 default)
    train = { epochs = 1, batch_size = 16, lr = 0.05 }   # `TrainConfig` fields
    eval_fraction = 0.2                   # held out for federated evaluation

    [[methods]]                           # the federation's methods (see below)
    kind = "dubhe"
    [[methods]]
    kind = "climb"                        # fedavg | climb | feddisk, as the coordinator
    eta_d = 0.1                           # the method's own settings

``[[methods]]`` (`ursa.edge_sdk.methods_config`) must name the same methods
as the coordinator's; without it a device runs Dubhe, plus FedAvg when it has
a ``[training]`` section. A training device takes its labels from its data
(no ``labels_file``). The SDK never reads ``data_file``: `ursa device run`
(`ursa.tools.compose.build_device`) loads it (``.npz`` with arrays ``x`` and
``y``, or a spec of `ursa.tools.data.loaders.load_dataset` such as
``digits`` or ``csv:PATH``) and builds the `TorchTrainer` (wrapped in a
`FeddiskTrainer` under ``kind = "feddisk"``); ``train`` is checked then
too, since `TrainConfig` lives with torch.

Environment overrides: ``URSA_<FIELD>`` and ``URSA_<SECTION>__<FIELD>``, JSON
values where they parse (``URSA_OBFUSCATOR_POOL_SIZE=8``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from ursa.edge_sdk.methods_config import (
    DeviceMethodSpec,
    check_device_methods,
    default_methods,
)
from ursa.models.spec import check_architecture
from ursa.protocol.admission_limits import AdmissionLimits
from ursa.protocol.broker_config import BrokerConfig
from ursa.protocol.config_file import load_service_config
from ursa.protocol.envelope import DEFAULT_MAX_MESSAGE_BYTES
from ursa.protocol.messages import COORDINATOR, ID_PATTERN, NAME_PATTERN
from ursa.protocol.trust_config import TrustConfig

__all__ = [
    "AdmissionLimits",
    "BrokerConfig",
    "DeviceConfig",
    "DeviceTrainingConfig",
    "TrustConfig",
    "load_device_config",
]

DEFAULT_POOL_SIZE = 4
"""Obfuscators precomputed per key epoch: a registry plus a few distributions."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DeviceTrainingConfig(_Frozen):
    """The device's ``[training]`` section: its data, model and local training."""

    data_file: str = Field(min_length=1)
    """A ``.npz`` (arrays ``x``, ``y``) or a `load_dataset` spec (``csv:PATH``)."""
    architecture: str = "mlp"
    """A built-in (``mlp``, ``cnn``) or an import path ``package.module:factory``
    whose factory returns a ``torch.nn.Module`` (`ursa.models.spec`)."""
    model_options: dict[str, Any] = Field(default_factory=dict)
    """The architecture's config (a factory's keyword arguments); must match
    the coordinator's model."""
    model: str = Field(default="classifier", pattern=NAME_PATTERN, max_length=24)
    """The wire name of the model (the coordinator's ``[training] model``)."""
    train: dict[str, Any] = Field(default_factory=dict)
    """`ursa.edge_sdk.training.TrainConfig` fields (checked when training starts)."""
    wire_dtype: Literal["float32", "float16"] = "float32"
    """Upload precision of the model update (``float16`` halves the bytes)."""
    seed: int | None = Field(default=None, ge=0)
    """The device's training seed; None derives one from the device id."""
    eval_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Samples held out for federated evaluation (0: none; the device then
    reports zeros when the coordinator evaluates)."""

    @field_validator("architecture")
    @classmethod
    def _architecture(cls, value: str) -> str:
        return check_architecture(value)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        for key in ("climb", "feddisk"):
            if isinstance(data, Mapping) and key in data:
                raise ValueError(
                    f"[training] {key} moved to a [[methods]] table: "
                    f"kind = '{key}' with its settings"
                )
        return data


class DeviceConfig(_Frozen):
    """Everything an `EdgeClient` needs (frozen; see the module doc)."""

    device_id: str = Field(pattern=ID_PATTERN)
    """This device's id: its broker login and its topics ``dev/<device_id>/``."""
    federation: str = Field(pattern=ID_PATTERN)
    """The federation to join (the coordinator's ``federation``)."""
    state_dir: Path
    """The device's identity, keys, run state and final model (relative paths
    resolve against the config file's folder)."""
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    """Where the broker is and how this device logs in."""
    coordinator_fingerprint: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    """Pin of the coordinator's identity; None trusts the first one seen (or,
    under ``[trust]``, the first one the operator certified)."""
    trust: TrustConfig = Field(default_factory=TrustConfig)
    """The operator's public key and this device's certificate; without them
    (tofu) the device takes its peers' keys from the coordinator."""
    obfuscator_pool_size: int = Field(default=DEFAULT_POOL_SIZE, ge=0, le=4096)
    """Precomputed obfuscators (0: compute each at encryption time)."""
    labels_file: Path | None = None
    """Where `ursa device run` reads the device's labels; unused by the SDK."""
    training: DeviceTrainingConfig | None = None
    """Local training (`ursa device run` only); None: a selection-only device."""
    methods: tuple[DeviceMethodSpec, ...] | None = None
    """The ``[[methods]]`` list; None: `method_list`'s default."""
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    """Larger incoming messages are dropped before decoding."""
    admission: AdmissionLimits = Field(default_factory=AdmissionLimits)
    """Rate limit on incoming messages per topic scope (global, own),
    checked before decoding (`ursa.protocol.admission_limits`)."""
    allow_plain_aggregation: bool = False
    """Send a plain model update when the signed key epoch says the coordinator
    sums in the clear (``[aggregation] mode = "plain"``, for debugging). False:
    the device reports ``plain_refused`` instead, and its update never leaves it
    unmasked."""
    insecure_test_keys: bool = False
    """Accept key epochs with Paillier keys under 2048 bits (`MIN_SECURE_KEY_BITS`)
    — tests and demos only: a smaller modulus can be factored. False: the
    device refuses such an epoch (``insecure_parameters``) and sits it out."""
    eval_min_parties: int = Field(default=2, ge=1)
    """As the key epoch's agent, disclose a federated evaluation sum to the
    coordinator only if it has at least this many reports."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.training is not None and self.labels_file is not None:
            raise ValueError("a training device takes its labels from data_file")
        if self.device_id == COORDINATOR:
            raise ValueError(f"{COORDINATOR!r} is reserved")
        if self.broker.username not in (None, self.device_id):
            raise ValueError("broker username must equal device_id (Mosquitto ACL)")
        check_device_methods(self.method_list(), trains=self.training is not None)
        return self

    def method_list(self) -> tuple[DeviceMethodSpec, ...]:
        """``[[methods]]``, or Dubhe (plus FedAvg with ``[training]``)."""
        if self.methods is not None:
            return self.methods
        return default_methods(trains=self.training is not None)


def load_device_config(
    path: Path | None, environ: Mapping[str, str] | None = None
) -> DeviceConfig:
    """Load a `DeviceConfig` from TOML/JSON with ``URSA_*`` overrides (entry points).

    Relative paths in the file resolve against its folder.

    Raises:
        ConfigError: one line per problem, naming the file or variable and
            the key, with no secret value (`ursa.protocol.config_file`); a
            `ValueError`, so older ``except ValueError`` code still holds.
    """
    env = os.environ if environ is None else environ
    return load_service_config(DeviceConfig, path, env)
