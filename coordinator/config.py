"""Coordinator configuration: frozen pydantic models, loaded from TOML/JSON + env.

Only the entry point (`ursa coordinator serve`) calls `load_coordinator_config`;
everything else receives a `CoordinatorConfig`. A file looks like::

    federation = "trial1"
    state_dir = "/var/lib/ursa/coordinator"
    identity_key = "/etc/ursa/identity.key"   # default: <state_dir>/identity.key
    min_devices = 30
    k = 10
    tries = 5
    rounds = 100
    key_bits = 2048

    [admission]                       # per-device limits, before decoding
    messages_per_s = 100.0            # sustained rate per device
    burst = 10000                     # messages at once (>= the fleet size)

    [broker]
    url = "mqtt://127.0.0.1:1883"     # mqtts:// for TLS (mqtt:// beyond loopback
    username = "coordinator"          # is refused unless allow_plaintext = true)
    # password: better from the environment, URSA_BROKER__PASSWORD,
    # or password_file = "/etc/ursa/coordinator.password" (mode 0600)

    [enrolment]
    mode = "pinned"                   # or "tofu"
    pins = { dev001 = "<32 hex digits from `ursa device identity`>" }
    # or: `ursa coordinator enrol` (<state_dir>/enrolment.json, merged)

    [trust]                           # `ursa.protocol.trust_config`
    operator_public_key = "<64 hex from `ursa operator init`>"
    certificate = "/etc/ursa/coordinator.cert"   # `ursa operator certify coordinator`
    # with an operator key, a Hello's valid certificate stands in for a pin

    [deadlines]
    key_epoch_s = 60.0
    registration_s = 60.0
    volunteer_s = 5.0                 # Dubhe: closes early once K per try, or
                                      # once every online device answered
    distributions_s = 10.0
    agent_s = 10.0
    training_s = 600.0

    [selection]                       # how devices answer a round's announce
    explicit_replies_below = 2000     # fewer online: every device answers (no
                                      # too); more: silence means no (0: never)

    [key_epochs]                      # re-keys one device's refusals may cause
    refusal_rekeys = 1                # per device per window; then it sits out
    refusal_window_s = 3600.0

    [registry]                        # Dubhe's registry (`RegistryConfig`)
    num_classes = 10                  # default: the model's output size
    groups = [1, 2, 10]               # default: [1, 2, num_classes]
    sigma = [0.7, 0.1, 0.0]           # default: one per group, the last 0.0

    [[methods]]                       # one selection method
    kind = "dubhe"

    [[methods]]                       # optional: one training method
    kind = "climb"                    # fedavg | fedprox | climb | feddisk
    dual_timeout_s = 60.0             # the method's own fields

    [training]                        # the training method's shared settings
    initial_weights = "weights.ursw"  # `ursa model init ... --out weights.ursw`
    architecture = "mlp"              # optional: mlp | cnn | "package.module:factory"
    model_options = { input_dim = 64, num_classes = 10 }   # its keyword arguments
    model = "classifier"              # the wire name devices train (their `model`)
    update_timeout_s = 300.0          # any other `TrainingConfig` field too

    [evaluation]                      # federated evaluation (off by default)
    every = 5                         # before rounds 6, 11, ...: the fleet's accuracy
    timeout_s = 30.0                  # on the devices' own held-out data, encrypted
    holdout_file = "test.npz"         # optional: the coordinator's own test set

    [store]                           # group commit of the SQLite store
    commit_interval_s = 0.05          # a batch commits this long after its first
    commit_max_records = 500          # write, or at this many writes (0 s: each)

    [http]                            # dashboard, /api/status, /metrics (off)
    listen = "127.0.0.1:9464"         # beyond loopback needs a token:
    # token: better from the environment, URSA_HTTP__TOKEN
    # allowed_hosts = ["dash.example.org"]   # Host names answered besides IPs
    # tls_cert = "dash.pem"           # HTTPS itself (with tls_key), or TLS
    # tls_key = "dash.key"            # at a reverse proxy

``[[methods]]`` is `ursa.coordinator.methods_config`'s discriminated union:
exactly one selection method, at most one training method (without one,
rounds end at the selection) and at most one balancing method (``kind =
"flicker"``: FLICKER between enrolment and the first key epoch). The ``[training]``
section holds
`TrainingConfig`'s fields plus ``initial_weights``, adopted as version 0 when
no checkpoint exists yet, and optionally the model's ``architecture`` and
``model_options`` as the devices name it (`ursa.models.spec`). With an
architecture the coordinator checks at start-up that the initial weights
(and its latest checkpoint) fit it, tensor by tensor, and builds version 0
from it when no ``initial_weights`` are given; a factory returning a torch
module (or a built-in) needs torch there, one returning NumPy arrays does
not. Without one the coordinator needs no model code at all: it averages
the arrays by name and shape. Under
``kind = "feddisk"`` the classifier rounds are FedAvg and a `FeddiskPlugin`
runs the MADE rounds first (the same deadlines and chunking; the MADE's
initial weights are the method's ``made_initial_weights``).

Environment overrides: ``URSA_<FIELD>`` for a top-level field and
``URSA_<SECTION>__<FIELD>`` for a nested one (``URSA_K=20``,
``URSA_ENROLMENT__MODE=tofu``, ``URSA_BROKER__PASSWORD=...``). Values are
parsed as JSON when they parse, else taken as strings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from ursa.coordinator.methods_config import (
    DEFAULT_METHODS,
    BalancingSpec,
    FeddiskSpec,
    MethodSpec,
    SelectionSpec,
    TrainingSpec,
    balancing_spec,
    check_methods,
    method_names,
    method_settings,
    selection_spec,
    training_spec,
)
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.store_batches import (
    DEFAULT_COMMIT_INTERVAL_S,
    DEFAULT_COMMIT_MAX_RECORDS,
    CommitPolicy,
)
from ursa.crypto.encoding import PackingLayout
from ursa.crypto.identity import IDENTITY_FILENAME
from ursa.models.spec import check_architecture
from ursa.protocol.admission_limits import AdmissionLimits
from ursa.protocol.broker_config import BrokerConfig
from ursa.protocol.codebook import Codebook, CodebookError
from ursa.protocol.config_file import DEFAULT_ENV_PREFIX, load_service_config
from ursa.protocol.messages import ID_PATTERN, SEAL_PAGE_SIZE, MethodSetting
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES
from ursa.protocol.transport import DEFAULT_MAX_PAYLOAD_BYTES
from ursa.protocol.trust_config import TrustConfig

if TYPE_CHECKING:  # imported lazily: training_round -> core -> this module
    from ursa.coordinator.training_round import TrainingConfig

__all__ = [
    "DEFAULT_ENV_PREFIX",
    "AdmissionLimits",
    "BrokerConfig",
    "CoordinatorConfig",
    "DeadlinesConfig",
    "EnrolmentConfig",
    "HttpConfig",
    "KeyEpochConfig",
    "RegistryConfig",
    "SelectionConfig",
    "StoreConfig",
    "TrainingSection",
    "load_coordinator_config",
]

DEFAULT_KEY_BITS = 2048
"""~112-bit security; tests use 512/1024 (breakable, for speed only)."""
REGISTRY_MARGIN_BYTES = 4096
"""Room left in one message for the envelope and header around a registry."""
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpConfig(_Frozen):
    """The operator's HTTP view: dashboard, ``/api/status``, ``/metrics``.

    Off unless ``listen`` (or ``serve --http``) names an address. Beyond
    loopback a ``token`` is required (better from URSA_HTTP__TOKEN), and
    without ``tls_cert``/``tls_key`` (or TLS at a reverse proxy) it travels in
    clear. Only IP literals, ``localhost``, the listen host and
    ``allowed_hosts`` are answered as ``Host`` (DNS-rebinding defence).
    """

    listen: str | None = None
    """``HOST:PORT``, e.g. ``127.0.0.1:9464``."""
    token: SecretStr | None = None
    """Bearer token the view asks for (required beyond loopback; better from
    ``URSA_HTTP__TOKEN``)."""
    allowed_hosts: tuple[str, ...] = ()
    """Names the view is reached by, e.g. ``["dash.example.org"]`` (no port)."""
    tls_cert: Path | None = None
    """PEM certificate (chain): serve HTTPS (with `tls_key`)."""
    tls_key: Path | None = None
    """Its unencrypted PEM private key."""

    @model_validator(mode="after")
    def _check_tls(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        return self


class EnrolmentConfig(_Frozen):
    """Who may enrol: a pinned list (the field-trial default) or trust on first use.

    `pins` maps device id to `DevicePublicIdentity.fingerprint()`. In `tofu`
    mode the first key a device id presents wins; a different key later is
    refused (and logged), as is every unlisted device in `pinned` mode.
    """

    mode: Literal["pinned", "tofu"] = "pinned"
    """``pinned``: only listed devices enrol; ``tofu``: a device id's first key wins."""
    pins: dict[str, str] = Field(default_factory=dict)
    """Device id to its identity fingerprint (32 hex; ``ursa coordinator enrol``
    writes them)."""

    @model_validator(mode="after")
    def _check_pins(self) -> Self:
        for device_id, fingerprint in self.pins.items():
            if len(fingerprint) != 32 or any(
                c not in "0123456789abcdef" for c in fingerprint
            ):
                raise ValueError(f"pin for {device_id!r} must be 32 lower-case hex")
        return self


class DeadlinesConfig(_Frozen):
    """Per-phase deadlines in seconds (a phase closes early once all have answered).

    ``volunteer_s`` is short: above ``[selection] explicit_replies_below``
    devices that drew no stay silent, so Dubhe's volunteering closes at it
    unless every try reached K volunteers first; below it every online device
    answers and the window closes once all have.
    """

    key_epoch_s: float = Field(default=60.0, gt=0)
    """The agent's key-epoch work: its fresh Paillier key, then sealing it."""
    registration_s: float = Field(default=60.0, gt=0)
    """Devices' encrypted registrations, then the agent's one-hot check; each
    sealed page pushes it out again."""
    volunteer_s: float = Field(default=5.0, gt=0)
    """Dubhe's volunteering window of a round."""
    distributions_s: float = Field(default=10.0, gt=0)
    """Try members' encrypted class distributions."""
    agent_s: float = Field(default=10.0, gt=0)
    """The agent's choice of the try closest to uniform; past it a round re-keys."""
    training_s: float = Field(default=600.0, gt=0)
    """A training round: the selected devices' local training and uploads."""
    outage_grace_s: float = Field(default=30.0, ge=0)
    """After a broker outage, how long departures are held while the fleet
    reconnects (`ursa.coordinator.presence`)."""


DEFAULT_EXPLICIT_REPLIES_BELOW = 2000
"""Measured (docs/explanation/scale.md, "Small fleets"): an explicit answer
costs the coordinator about 50 µs of CPU, so 2,000 of them add about 0.1 s
to a round (a tenth of its 1 s bound) and one small message per device,
while larger fleets keep silence's flat H·K messages a round."""


class SelectionConfig(_Frozen):
    """``[selection]``: how devices answer a round's announce (one rule per round).

    With fewer than ``explicit_replies_below`` devices online when a round
    opens, its signed `RoundAnnounce` says ``explicit_replies``: every online
    registered device answers with its draws, all no included, and Dubhe's
    volunteering closes as soon as every one has (or at ``volunteer_s``).
    With more, silence means no: the coordinator hears about H·K devices per
    round whatever the fleet's size, and waits the window out unless every
    try has K volunteers first. ``0``: silence means no at every size.
    """

    explicit_replies_below: int = Field(default=DEFAULT_EXPLICIT_REPLIES_BELOW, ge=0)
    """Online devices under which every device answers each announce."""

    def explicit_replies(self, online: int) -> bool:
        """Whether a round opened with ``online`` devices online asks every answer."""
        return online < self.explicit_replies_below


class KeyEpochConfig(_Frozen):
    """``[key_epochs]``: how many new key epochs one device's refusals may cause.

    A device that refuses this coordinator's identity (a signed
    `coordinator_identity_mismatch` naming the acceptance it refuses) while
    the current key epoch counts it makes the fleet key again, at most
    ``refusal_rekeys`` times per device in any ``refusal_window_s``; beyond
    that it sits the epoch out instead (`ursa.coordinator.identity_refusals`).
    The defaults let an honest refuser re-key once an hour: sitting out serves
    the fleet as well for every later refusal of the same identity.
    """

    refusal_rekeys: int = Field(default=1, ge=0, le=100)
    """New key epochs one device's refusals may start per window (0: never)."""
    refusal_window_s: float = Field(default=3600.0, gt=0)
    """The sliding window of ``refusal_rekeys``, in seconds."""


class StoreConfig(_Frozen):
    """``[store]``: group commit of the coordinator's SQLite store.

    A batch is committed ``commit_interval_s`` after its first write or once
    it holds ``commit_max_records`` writes, whichever comes first, and before
    anything that reveals it is published (`ursa.coordinator.store`). A
    ``kill -9`` loses at most that batch; the devices send it again.
    ``commit_interval_s = 0`` commits every message on its own.
    """

    commit_interval_s: float = Field(default=DEFAULT_COMMIT_INTERVAL_S, ge=0, le=60)
    """Longest a write waits for its batch's commit (0: every message alone)."""
    commit_max_records: int = Field(default=DEFAULT_COMMIT_MAX_RECORDS, ge=1)
    """A batch of this many writes commits at once."""

    def policy(self) -> CommitPolicy:
        """The store's `CommitPolicy`."""
        return CommitPolicy(self.commit_interval_s, self.commit_max_records)


class EvaluationConfig(_Frozen):
    """``[evaluation]``: federated evaluation (`ursa.coordinator.fleet_eval`)."""

    every: int = Field(default=0, ge=0)
    """Federated evaluation before every ``every``-th round (0: never); round
    ``1 + every`` evaluates the model after round ``every``, and so on."""
    timeout_s: float = Field(default=30.0, gt=0)
    """How long the round waits for the devices' evaluation reports."""
    holdout_file: str | None = Field(default=None, min_length=1)
    """The coordinator's own held-out set (``.npz`` with ``x``, ``y``, or a data
    set spec such as ``csv:PATH``): every new version is scored on it. Needs
    torch and ``[training] architecture``."""


def default_groups(num_classes: int) -> tuple[int, ...]:
    """Dubhe's reference set ``{1, 2, C}`` (``{1, C}`` for two classes)."""
    return (1, 2, num_classes) if num_classes > 2 else (1, num_classes)


def default_sigma(groups: tuple[int, ...]) -> tuple[float, ...]:
    """0.7 for single classes, 0.1 for the groups between, 0.0 for all C."""
    return tuple(0.0 if g == groups[-1] else 0.7 if g == 1 else 0.1 for g in groups)


class RegistryConfig(_Frozen):
    """Dubhe registry parameters, sent to devices in the signed key-epoch notice.

    A device registers the smallest group of classes that holds most of its
    data: ``groups`` are the group sizes (Dubhe's reference set ``G``, which
    must hold ``num_classes``), ``sigma`` one threshold per group (the share
    of a device's samples outside the group it may still register under; the
    last, all classes, is 0). Both follow ``num_classes`` unless given:
    ``groups = [1, 2, C]`` and ``sigma = [0.7, 0.1, 0.0]``. `ursa coordinator
    serve` takes ``num_classes`` from the model's output size when the
    section does not name it, and refuses a mismatch.
    """

    num_classes: int = Field(default=10, ge=2, le=4096)
    """C: classes of the federation's task (the model's output size)."""
    groups: tuple[int, ...] = (1, 2, 10)
    """Group sizes a device may register under, increasing, the last C."""
    sigma: tuple[float, ...] = (0.7, 0.1, 0.0)
    """One threshold per group, increasing group size; the last (sigma_C) is 0."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Most devices in a key epoch (no ceiling: the slot width grows with it)."""

    def ciphertext_bytes(self, key_bits: int) -> int:
        """Bytes of one encrypted registry (a `Registration`, the `RegistrySum`)."""
        layout = PackingLayout(1, self.max_parties, key_bits)
        plaintexts = layout.num_plaintexts(
            Codebook(self.num_classes, self.groups).length
        )
        return plaintexts * 2 * ((key_bits + 7) // 8)  # the margin covers the header

    @model_validator(mode="before")
    @classmethod
    def _follow_num_classes(cls, data: Any) -> Any:
        """``groups`` and ``sigma`` left out follow ``num_classes``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        classes = data.get("num_classes", 10)
        if "groups" not in data and isinstance(classes, int):
            data["groups"] = default_groups(classes)
        groups = data.get("groups")
        ints = isinstance(groups, list | tuple) and all(
            isinstance(g, int) for g in groups
        )
        if "sigma" not in data and ints and groups:
            data["sigma"] = default_sigma(tuple(groups))
        return data

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


_MOVED_TO_METHODS = {
    "weighting": "a [[methods]] table: kind = 'fedavg' | 'climb' | 'feddisk'",
    "feddisk": "[[methods]] kind = 'feddisk' (its fields go in that table)",
    "made_initial_weights": "[[methods]] kind = 'feddisk'",
    "dual_timeout_s": "[[methods]] kind = 'climb'",
    "dual_period": "[[methods]] kind = 'climb'",
    "climb_max_parties": "[[methods]] kind = 'climb' (max_parties)",
}
"""Keys the ``[training]`` section had before ``[[methods]]``: where they went."""


class TrainingSection(BaseModel):
    """The ``[training]`` section: `TrainingConfig` fields plus the initial weights.

    Fields other than ``initial_weights`` are passed to `TrainingConfig`
    unchanged (and checked by it when the section loads); how updates are
    weighted is the training method's (``[[methods]]``).
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    initial_weights: Path | None = None
    """A `ursa.models.weights` file adopted as version 0 if no checkpoint exists."""
    architecture: str | None = None
    """The model as the devices name it (``mlp``, ``cnn``, ``pkg.mod:factory``)."""
    model_options: dict[str, Any] = Field(default_factory=dict)
    """The architecture's keyword arguments."""

    @field_validator("architecture")
    @classmethod
    def _architecture(cls, value: str | None) -> str | None:
        return None if value is None else check_architecture(value)

    @model_validator(mode="after")
    def _check(self) -> Self:
        for key in self.model_extra or {}:
            if key in _MOVED_TO_METHODS:
                raise ValueError(f"[training] {key} moved to {_MOVED_TO_METHODS[key]}")
        self.training_config()  # a bad TrainingConfig field fails the load
        return self

    def training_config(self, weighting: str = "fedavg") -> TrainingConfig:
        """The classifier's `TrainingConfig`, its updates weighted by ``weighting``.

        The method table's builder says how (FedAvg's ``weights = "equal"``;
        CLIMB's dual step sets its own; FedDisk's classifier is FedAvg).
        """
        from ursa.coordinator.training_round import TrainingConfig

        fields: dict[str, Any] = dict(self.model_extra or {})
        fields["weighting"] = weighting
        return TrainingConfig.model_validate(fields)

    def made_training_config(self, method: FeddiskSpec) -> TrainingConfig:
        """The MADE rounds' `TrainingConfig`: the classifier's, FedAvg, MADE's name."""
        classifier = self.training_config()
        _check_models(method, classifier.model)
        return classifier.model_copy(update={"model": method.made_model})


def _check_models(method: TrainingSpec, classifier: str) -> None:
    """Refuse a classifier named like a model its training method adds (a MADE)."""
    if classifier in method.extra_models():
        raise ValueError(
            f"the classifier and a model {method.kind} adds are both named "
            f"{classifier!r}"
        )


class CoordinatorConfig(_Frozen):
    """Everything the coordinator service needs (frozen; see the module doc)."""

    federation: str = Field(pattern=ID_PATTERN)
    """The federation's name: every topic is under ``ursa/v1/<federation>/``."""
    state_dir: Path
    """The coordinator's store, identity and final model (relative paths
    resolve against the config file's folder)."""
    identity_key: Path | None = None
    """The coordinator's identity key file (None: ``<state_dir>/identity.key``).
    Devices pin this identity: keep the file backed up, apart from the store.
    A coordinator started on an empty store with it starts a new run that the
    devices join by themselves; without it every device must be re-pinned."""
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    """Where the broker is and how the coordinator logs in."""
    enrolment: EnrolmentConfig = Field(default_factory=EnrolmentConfig)
    """Which devices may enrol (`EnrolmentConfig`)."""
    trust: TrustConfig = Field(default_factory=TrustConfig)
    """The operator's public key and the coordinator's certificate
    (`ursa.protocol.trust_config`): devices then enrol by certificate and
    check every identity the coordinator relays."""
    deadlines: DeadlinesConfig = Field(default_factory=DeadlinesConfig)
    """How long each phase waits for the devices (`DeadlinesConfig`)."""
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    """Dubhe's registry: classes, groups and thresholds (`RegistryConfig`)."""
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    """How devices answer a round's announce (`SelectionConfig`)."""
    key_epochs: KeyEpochConfig = Field(default_factory=KeyEpochConfig)
    """How many key epochs one device's refusals may start (`KeyEpochConfig`)."""
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    """How training rounds sum model updates: securely (default) or plain."""
    min_devices: int = Field(default=20, ge=1)
    """Enrolled online devices needed before the first key epoch starts."""
    quorum: int | None = Field(default=None, ge=1)
    """Online devices needed before any later key epoch (None: ``min_devices``).
    Short of it the coordinator waits for the fleet: a broker restart's first
    returning device must not start an epoch alone. Lower it to go on after
    devices leave for good."""
    rekey_on_churn: float = Field(default=0.5, ge=0.0, le=1.0)
    """A new key epoch before a round when the online fleet differs from the
    one online when the epoch started (devices left, or joined) by more than
    this fraction of it, and a quorum is online (0: never; late joiners then
    wait for the next epoch)."""
    sit_out_after_failures: int = Field(default=3, ge=0)
    """A selected device that failed this many training rounds in a row sits
    the key epoch out (0: never); two in a row already show it as failing in
    ``status``, the dashboard and ``/metrics``."""
    k: int = Field(default=10, ge=1)
    """K: devices selected per round."""
    tries: int = Field(default=1, ge=1, le=256)
    """H: Dubhe's tries per round (each an independent draw of about K
    volunteers; the try closest to a uniform class mix is kept)."""
    rounds: int = Field(default=10, ge=0)
    """Rounds to run, then the service idles (0: none, only enrolment and epoch)."""
    target_accuracy: float | None = Field(default=None, gt=0.0, le=1.0)
    """End the federation early once a round's evaluation (the training
    plugin's ``evaluate`` hook) reports ``accuracy`` at least this high."""
    rounds_per_epoch: int = Field(default=0, ge=0)
    """Start a new key epoch every this many rounds (0: only when the agent is lost)."""
    key_bits: int = Field(default=DEFAULT_KEY_BITS, ge=512, le=4096, multiple_of=8)
    """Paillier modulus of each key epoch. ``coordinator serve`` refuses fewer
    than 2048 bits unless ``insecure_test_keys`` (devices refuse them too)."""
    insecure_test_keys: bool = False
    """Let ``coordinator serve`` run with ``key_bits`` under 2048 (tests and
    demos only: such a modulus can be factored)."""
    seal_page_size: int = Field(default=SEAL_PAGE_SIZE, ge=1, le=SEAL_PAGE_SIZE)
    """Recipients per `SealRequest` page: the agent seals one page at a time
    and the coordinator keeps two in flight (smaller: shorter bursts)."""
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=1024)
    """Larger messages are dropped at admission, before decoding (and answered
    `oversize`, once per device per `LOG_INTERVAL_S`)."""
    admission: AdmissionLimits = Field(default_factory=AdmissionLimits)
    """Per-device message rate (`ursa.protocol.admission_limits`), checked
    before decoding; messages over it are dropped and counted."""
    poll_interval_s: float = Field(default=0.05, gt=0)
    """How often the service loop checks its deadlines and queued messages."""
    seed: int | None = None
    """Seeds the coordinator's generator (agent choice, trim/top-up); None: random."""
    methods: tuple[MethodSpec, ...] = DEFAULT_METHODS
    """The ``[[methods]]`` list (`ursa.coordinator.methods_config`)."""
    training: TrainingSection | None = None
    """The training method's shared settings (model, initial weights, timeouts)."""
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    """Federated evaluation of the global model on the devices' own data."""
    store: StoreConfig = Field(default_factory=StoreConfig)
    """When the store commits its batches of writes (group commit)."""
    http: HttpConfig = Field(default_factory=HttpConfig)
    """The operator's HTTP view: dashboard, ``/api/status``, ``/metrics``."""
    final_model_dir: Path | None = None
    """Where the final model is written when the rounds are done
    (``model.ursw``, ``model_card.json``, ``model.onnx``); None: the state
    directory's ``final``."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.k > self.min_devices:
            raise ValueError(f"k={self.k} exceeds min_devices={self.min_devices}")
        if self.quorum is not None and not self.k <= self.quorum <= self.min_devices:
            raise ValueError(
                f"quorum={self.quorum} must lie between k={self.k} and "
                f"min_devices={self.min_devices}"
            )
        if self.k > self.registry.max_parties:
            raise ValueError("k exceeds registry.max_parties")
        registry_bytes = self.registry.ciphertext_bytes(self.key_bits)
        limit = DEFAULT_MAX_PAYLOAD_BYTES - REGISTRY_MARGIN_BYTES
        if registry_bytes > limit:
            raise ValueError(
                f"the encrypted registry takes {registry_bytes} bytes with "
                f"{self.key_bits}-bit keys and max_parties="
                f"{self.registry.max_parties}, more than one message carries "
                f"({limit}): choose smaller registry.groups"
            )
        check_methods(self.methods)
        if self.training is not None and self.training_method() is None:
            raise ValueError(
                "[training] needs a training method: add [[methods]] with "
                "kind = 'fedavg', 'fedprox', 'climb' or 'feddisk'"
            )
        method = self.training_method()
        if method is not None:
            _check_models(method, self.training_section().training_config().model)
        return self

    def identity_key_path(self) -> Path:
        """Where the coordinator's identity key lives."""
        if self.identity_key is not None:
            return self.identity_key
        return self.state_dir / IDENTITY_FILENAME

    def epoch_quorum(self) -> int:
        """Online devices a key epoch after the first needs."""
        return self.min_devices if self.quorum is None else self.quorum

    def method_names(self) -> tuple[str, ...]:
        """The methods signed into each key epoch, in config order."""
        return method_names(self.methods)

    def summary(self, run: str) -> str:
        """The start-up log line: what this coordinator runs, with whom, where.

        No secret: the broker's address without any user info in its URL.
        """
        return (
            f"coordinator: federation {self.federation}, run {run}, methods "
            f"{', '.join(self.method_names())}, broker {self.broker.address()}, "
            f"K={self.k} of {self.min_devices} devices, {self.tries} tries, "
            f"{self.rounds} rounds, state {self.state_dir}"
        )

    def method_settings(self) -> tuple[MethodSetting, ...]:
        """The methods' settings signed beside their names (FedProx's ``mu``)."""
        return method_settings(self.methods)

    def selection_method(self) -> SelectionSpec:
        """The selection method (exactly one, checked at load)."""
        return selection_spec(self.methods)

    def stratified_draw(self) -> bool:
        """Whether Dubhe runs the stratified draw (ranks, private selections)."""
        return self.selection_method().registers_rank_key()

    def training_method(self) -> TrainingSpec | None:
        """The training method; None for a selection-only federation."""
        return training_spec(self.methods)

    def balancing_method(self) -> BalancingSpec | None:
        """The balancing method's settings (FLICKER's) when the federation runs one."""
        return balancing_spec(self.methods)

    def training_section(self) -> TrainingSection:
        """``[training]``, or its defaults when only the method is given."""
        return self.training if self.training is not None else TrainingSection()


def load_coordinator_config(
    path: Path | None, environ: Mapping[str, str] | None = None
) -> CoordinatorConfig:
    """Load the coordinator config (entry points only; pass `os.environ`).

    Only variables naming a `CoordinatorConfig` field are applied, so other
    ``URSA_*`` variables (e.g. ``URSA_REQUIRE_MOSQUITTO``) do not get in the way;
    relative paths in the file resolve against its folder.

    Raises:
        ConfigError: one line per problem, naming the file or variable and
            the key, with no secret value (`ursa.protocol.config_file`).
    """
    env = os.environ if environ is None else environ
    return load_service_config(CoordinatorConfig, path, env)
