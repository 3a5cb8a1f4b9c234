"""Every ursa wire message: frozen pydantic models in one discriminated union.

Each message carries `kind` (the union tag), `protocol_version`, `federation`,
`round` (the sender's view of the current round, 0 before the first), `sender`
(a device id or `"coordinator"`), a `message_id` (handlers are idempotent by
it) and `sent_at` (unix seconds). Ciphertexts, keys, sealed boxes and tensors
are raw `bytes`; `ursa.protocol.envelope` puts them on the wire as msgpack.

Messages that carry authority (key epoch, agent answers, selection result)
have a `signature` field: Ed25519 over `envelope.signing_bytes(message)`,
empty until signed. Validation here is structural and cheap (ids, lengths,
ranges); cryptographic checks belong to the receiver.

Groups, in protocol order: enrolment and liveness; Dubhe key epoch and
registration (Fig. 4), parameter search, rounds and multi-time selection
(Fig. 3, 5); chunked transfers and models; CLIMB dual steps; FLICKER ring,
localisation, resampling and the global redundancy test.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Annotated, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa._compat import StrEnum

PROTOCOL_VERSION = 1
COORDINATOR = "coordinator"
"""The `sender` of coordinator messages; reserved, never a device id."""

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,31}$"
DEFAULT_CHUNK_SIZE = 256 * 1024
MAX_CHUNK_SIZE = 1024 * 1024
"""Largest chunk and largest inline ciphertext or weights blob."""
MAX_TRANSFER_BYTES = 1 << 30
MAX_CHUNK_COUNT = 1 << 16
MAX_DEVICES = 10_000
"""Longest device list in one message (selection, ring order, seal request)."""
MAX_TRIES = 256
MAX_SIGNATURE_BYTES = 64

_T = TypeVar("_T")


class ErrorCode(StrEnum):
    """Values of `ErrorReply.code` (the field accepts any name, for newer peers)."""

    MALFORMED = "malformed"
    UNSUPPORTED_VERSION = "unsupported_version"
    OVERSIZE = "oversize"
    UNKNOWN_DEVICE = "unknown_device"
    UNAUTHORISED = "unauthorised"
    WRONG_ROUND = "wrong_round"
    WRONG_EPOCH = "wrong_epoch"
    BAD_CIPHERTEXT = "bad_ciphertext"
    BAD_SIGNATURE = "bad_signature"
    TRANSFER_FAILED = "transfer_failed"
    LATE = "late"
    INTERNAL = "internal"


def _not_reserved(value: str) -> str:
    if value == COORDINATOR:
        raise ValueError(f"{COORDINATOR!r} is reserved and cannot be a device id")
    return value


def _signature_length(value: bytes) -> bytes:
    if len(value) not in (0, MAX_SIGNATURE_BYTES):
        raise ValueError("signature must be empty (unsigned) or 64 bytes (Ed25519)")
    return value


def _unique(items: tuple[_T, ...]) -> tuple[_T, ...]:
    if len(set(items)) != len(items):
        raise ValueError("entries must be unique")
    return items


Id = Annotated[str, Field(pattern=ID_PATTERN)]
DeviceId = Annotated[str, Field(pattern=ID_PATTERN), AfterValidator(_not_reserved)]
DeviceList = Annotated[
    tuple[DeviceId, ...],
    Field(min_length=1, max_length=MAX_DEVICES),
    AfterValidator(_unique),
]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Text = Annotated[str, Field(max_length=256)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Key32 = Annotated[bytes, Field(min_length=32, max_length=32)]
Blob = Annotated[bytes, Field(min_length=1, max_length=MAX_CHUNK_SIZE)]
"""A ciphertext, sealed box or inline tensor: non-empty, at most one chunk."""
Signature = Annotated[
    bytes, Field(max_length=MAX_SIGNATURE_BYTES), AfterValidator(_signature_length)
]
TryIndices = Annotated[
    tuple[Count, ...],
    Field(min_length=1, max_length=MAX_TRIES),
    AfterValidator(_unique),
]


def _new_message_id() -> str:
    return uuid.uuid4().hex


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class BaseMessage(_Frozen):
    """Fields common to every wire message."""

    protocol_version: Positive = PROTOCOL_VERSION
    federation: Id
    round: Count
    sender: Id
    message_id: Id = Field(default_factory=_new_message_id)
    sent_at: Annotated[float, Field(ge=0.0)] = Field(default_factory=time.time)


# --- enrolment and liveness -------------------------------------------------


class Hello(BaseMessage):
    """Device to coordinator: enrol with identity public keys (pinned or TOFU)."""

    kind: Literal["hello"] = "hello"
    device_id: DeviceId
    x25519_public: Key32
    ed25519_public: Key32
    capabilities: Annotated[tuple[Name, ...], Field(max_length=16)] = ()

    @_model_validator(mode="after")
    def _sender_is_device(self) -> Self:
        if self.sender != self.device_id:
            raise ValueError("sender must equal device_id")
        return self


class IdentityKeys(_Frozen):
    """An identity's public keys: X25519 (sealing) and Ed25519 (signing).

    Not a message: part of `EnrolResult` (the coordinator's, whose id is
    `COORDINATOR`) and, as `DeviceKeys`, of `KeyEpochStart` and `SealRequest`.
    """

    device_id: Id
    x25519_public: Key32
    ed25519_public: Key32


class DeviceKeys(IdentityKeys):
    """A device's identity public keys (never the reserved coordinator id)."""

    device_id: DeviceId


class EnrolResult(BaseMessage):
    """Coordinator to device: enrolment accepted or refused, and why.

    An acceptance carries the coordinator's public identity, which the device
    pins (or checks against its configured fingerprint) and then verifies the
    coordinator's signatures with.
    """

    kind: Literal["enrol_result"] = "enrol_result"
    device_id: DeviceId
    accepted: bool
    reason: Text = ""
    epoch: Count | None = None
    coordinator_keys: IdentityKeys | None = None

    @_model_validator(mode="after")
    def _coordinator_keys(self) -> Self:
        keys = self.coordinator_keys
        if keys is not None and keys.device_id != COORDINATOR:
            raise ValueError(f"coordinator_keys must have device_id {COORDINATOR!r}")
        if keys is not None and not self.accepted:
            raise ValueError("a refusal carries no coordinator_keys")
        return self


class ErrorReply(BaseMessage):
    """Either way: a rejected message, as data (`code` is usually an ErrorCode)."""

    kind: Literal["error"] = "error"
    code: Name
    reason: Text
    in_reply_to: Id | None = None


class Status(BaseMessage):
    """Retained liveness on `.../status` (`online`; the last will says offline)."""

    kind: Literal["status"] = "status"
    online: bool
    state: Name = "idle"


class Heartbeat(BaseMessage):
    """Device to coordinator, QoS 0: still alive."""

    kind: Literal["heartbeat"] = "heartbeat"
    seq: Count


# --- Dubhe: key epoch and registration --------------------------------------


class KeyEpochStart(BaseMessage):
    """Coordinator to all: a new key epoch, its agent and registry parameters.

    `agent_keys` are the agent's enrolled identity keys: devices verify the
    agent's signed `AgentPublicKey` and open its `SealedSecretKey` with them.
    """

    kind: Literal["key_epoch_start"] = "key_epoch_start"
    epoch: Count
    agent: DeviceId
    agent_keys: DeviceKeys
    num_classes: Annotated[int, Field(ge=2, le=4096)]
    groups: Annotated[tuple[Positive, ...], Field(min_length=1, max_length=16)]
    sigma: Annotated[tuple[Fraction, ...], Field(min_length=1, max_length=16)]
    max_parties: Positive
    key_bits: Annotated[int, Field(ge=512, le=8192)] = 2048
    signature: Signature = b""

    @_model_validator(mode="after")
    def _registry_params(self) -> Self:
        if any(a >= b for a, b in zip(self.groups, self.groups[1:], strict=False)):
            raise ValueError("groups must be strictly increasing")
        if self.groups[-1] != self.num_classes:
            raise ValueError("groups must end with num_classes")
        if len(self.sigma) != len(self.groups) or self.sigma[-1] != 0.0:
            raise ValueError("sigma needs one threshold per group, the last 0")
        if self.agent_keys.device_id != self.agent:
            raise ValueError("agent_keys must be the keys of the agent")
        return self


class SealRequest(BaseMessage):
    """Coordinator to agent: the devices to seal the epoch's secret key to."""

    kind: Literal["seal_request"] = "seal_request"
    epoch: Count
    recipients: Annotated[
        tuple[DeviceKeys, ...], Field(min_length=1, max_length=MAX_DEVICES)
    ]

    @_model_validator(mode="after")
    def _unique_recipients(self) -> Self:
        _unique(tuple(r.device_id for r in self.recipients))
        return self


class AgentPublicKey(BaseMessage):
    """Agent to all (relayed): the epoch's Paillier public key, signed."""

    kind: Literal["agent_public_key"] = "agent_public_key"
    epoch: Count
    public_key: Annotated[bytes, Field(min_length=1, max_length=4096)]
    signature: Signature = b""


class SealedSecretKey(BaseMessage):
    """Agent to one device (relayed, unopenable by the coordinator)."""

    kind: Literal["sealed_secret_key"] = "sealed_secret_key"
    epoch: Count
    recipient: DeviceId
    box: Annotated[bytes, Field(min_length=1, max_length=16 * 1024)]


class Registration(BaseMessage):
    """Device to coordinator: its encrypted one-hot registry."""

    kind: Literal["registration"] = "registration"
    epoch: Count
    candidate: Count = 0
    registry: Blob


class RegistrySum(BaseMessage):
    """Coordinator to all: the encrypted overall registry and its party count."""

    kind: Literal["registry_sum"] = "registry_sum"
    epoch: Count
    candidate: Count = 0
    registry_sum: Blob
    num_parties: Positive


# --- Dubhe: parameter search ------------------------------------------------


class SigmaSearchStart(BaseMessage):
    """Coordinator to all: register once per candidate sigma set (by index)."""

    kind: Literal["sigma_search_start"] = "sigma_search_start"
    epoch: Count
    candidates: Annotated[
        tuple[Annotated[tuple[Fraction, ...], Field(min_length=1)], ...],
        Field(min_length=1, max_length=64),
    ]


class CandidateSums(_Frozen):
    """Encrypted try sums of one candidate (part of `SearchSums`)."""

    candidate: Count
    sums: Annotated[tuple[Blob, ...], Field(min_length=1, max_length=MAX_TRIES)]
    member_counts: tuple[Positive, ...]

    @_model_validator(mode="after")
    def _same_length(self) -> Self:
        if len(self.member_counts) != len(self.sums):
            raise ValueError("member_counts needs one entry per sum")
        return self


class SearchSums(BaseMessage):
    """Coordinator to agent: per candidate, the sums of its H tries."""

    kind: Literal["search_sums"] = "search_sums"
    epoch: Count
    candidates: Annotated[tuple[CandidateSums, ...], Field(min_length=1, max_length=64)]


class SearchAnswer(BaseMessage):
    """Agent to coordinator (then to all): the best candidate, signed."""

    kind: Literal["search_answer"] = "search_answer"
    epoch: Count
    best_candidate: Count
    signature: Signature = b""


# --- Dubhe: rounds and multi-time selection ---------------------------------


class RoundAnnounce(BaseMessage):
    """Coordinator to all (retained): a round opens; `candidate` marks a search."""

    kind: Literal["round_announce"] = "round_announce"
    epoch: Count
    k: Positive
    tries: Annotated[int, Field(ge=1, le=MAX_TRIES)] = 1
    deadline_s: Annotated[float, Field(gt=0.0)]
    model: Name = "classifier"
    model_version: Count | None = None
    model_transfer_id: Id | None = None
    candidate: Count | None = None


class Volunteer(BaseMessage):
    """Device to coordinator: one Bernoulli(P) draw per try (length = tries)."""

    kind: Literal["volunteer"] = "volunteer"
    draws: Annotated[tuple[bool, ...], Field(min_length=1, max_length=MAX_TRIES)]


class TryAssignment(BaseMessage):
    """Coordinator to a tentative member: the tries it is in; send its distribution."""

    kind: Literal["try_assignment"] = "try_assignment"
    try_indices: TryIndices


class EncryptedDistribution(BaseMessage):
    """Device to coordinator: its packed fixed-point label distribution.

    Sent once per round; the coordinator adds it into every try it is in.
    """

    kind: Literal["encrypted_distribution"] = "encrypted_distribution"
    distribution: Blob


class TrySums(BaseMessage):
    """Coordinator to agent: the encrypted distribution sum of each try."""

    kind: Literal["try_sums"] = "try_sums"
    sums: Annotated[tuple[Blob, ...], Field(min_length=1, max_length=MAX_TRIES)]
    member_counts: tuple[Positive, ...]

    @_model_validator(mode="after")
    def _same_length(self) -> Self:
        if len(self.member_counts) != len(self.sums):
            raise ValueError("member_counts needs one entry per sum")
        return self


class AgentAnswer(BaseMessage):
    """Agent to coordinator: only the index of the best try, signed."""

    kind: Literal["agent_answer"] = "agent_answer"
    best_try: Count
    signature: Signature = b""


class SelectionResult(BaseMessage):
    """Coordinator to all: the round's exactly-K participants, signed."""

    kind: Literal["selection_result"] = "selection_result"
    selected: DeviceList
    try_index: Count | None = None
    signature: Signature = b""


# --- chunked transfers and models -------------------------------------------


class TransferManifest(BaseMessage):
    """Announces a payload sent as chunks: size, chunk layout and sha256."""

    kind: Literal["transfer_manifest"] = "transfer_manifest"
    transfer_id: Id
    purpose: Name
    total_size: Annotated[int, Field(ge=0, le=MAX_TRANSFER_BYTES)]
    chunk_size: Annotated[int, Field(ge=1, le=MAX_CHUNK_SIZE)]
    chunk_count: Annotated[int, Field(ge=0, le=MAX_CHUNK_COUNT)]
    sha256: Sha256Hex

    @_model_validator(mode="after")
    def _layout(self) -> Self:
        if self.chunk_count != math.ceil(self.total_size / self.chunk_size):
            raise ValueError("chunk_count must be ceil(total_size / chunk_size)")
        return self

    def chunk_length(self, index: int) -> int:
        """Exact byte length of chunk `index` (the last one may be shorter)."""
        if not 0 <= index < self.chunk_count:
            raise IndexError(f"chunk index {index} not in [0, {self.chunk_count})")
        return min(self.chunk_size, self.total_size - index * self.chunk_size)


class Chunk(BaseMessage):
    """One slice of a transfer; idempotent by (transfer_id, index)."""

    kind: Literal["chunk"] = "chunk"
    transfer_id: Id
    index: Annotated[int, Field(ge=0, lt=MAX_CHUNK_COUNT)]
    data: Blob


class ChunkRequest(BaseMessage):
    """Receiver to sender: re-send these chunks of a transfer."""

    kind: Literal["chunk_request"] = "chunk_request"
    transfer_id: Id
    indices: Annotated[
        tuple[Annotated[int, Field(ge=0, lt=MAX_CHUNK_COUNT)], ...],
        Field(min_length=1, max_length=MAX_CHUNK_COUNT),
        AfterValidator(_unique),
    ]


class ModelAvailable(BaseMessage):
    """Coordinator to all: a global model version, fetched by its transfer."""

    kind: Literal["model_available"] = "model_available"
    model: Name
    model_version: Count
    transfer_id: Id
    format: Literal["state_dict", "onnx"] = "state_dict"


class ModelUpdate(BaseMessage):
    """Device to coordinator: a trained delta, inline or as a transfer."""

    kind: Literal["model_update"] = "model_update"
    model: Name = "classifier"
    base_version: Count
    num_examples: Count
    delta_scaled: bool = False
    transfer_id: Id | None = None
    weights: Blob | None = None

    @_model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.transfer_id is None) == (self.weights is None):
            raise ValueError("give exactly one of transfer_id and weights")
        return self


# --- CLIMB dual steps -------------------------------------------------------


class DualStepRequest(BaseMessage):
    """Coordinator to all: evaluate the loss at this model and send stats."""

    kind: Literal["dual_step_request"] = "dual_step_request"
    epoch: Count
    model_version: Count


class ClimbStats(BaseMessage):
    """Device to coordinator: Enc(loss) and Enc(lambda), packed fixed-point."""

    kind: Literal["climb_stats"] = "climb_stats"
    epoch: Count
    stats: Blob


class ClimbSum(BaseMessage):
    """Coordinator to all: the encrypted sum of every device's stats."""

    kind: Literal["climb_sum"] = "climb_sum"
    epoch: Count
    stats_sum: Blob
    num_parties: Positive


# --- FedDisk phase 1 -------------------------------------------------------


class MadeLossRequest(BaseMessage):
    """Coordinator to all: the global MADE's validation NLL at this version, please."""

    kind: Literal["made_loss_request"] = "made_loss_request"
    epoch: Count
    model: Name
    model_version: Count


class MadeLoss(BaseMessage):
    """Device to coordinator: Enc([NLL summed over its validation split, its size])."""

    kind: Literal["made_loss"] = "made_loss"
    epoch: Count
    model_version: Count
    loss: Blob


class MadeLossSum(BaseMessage):
    """Coordinator to all: the encrypted sum of every device's `MadeLoss`."""

    kind: Literal["made_loss_sum"] = "made_loss_sum"
    epoch: Count
    model_version: Count
    loss_sum: Blob
    num_parties: Positive


class MadeVerdict(BaseMessage):
    """Agent to coordinator: whether the MADE phase stops, and its best version."""

    kind: Literal["made_verdict"] = "made_verdict"
    epoch: Count
    model_version: Count
    stop: bool
    best_version: Count
    signature: Signature = b""


class FeddiskSwitch(BaseMessage):
    """Coordinator to all (retained): phase 2 trains ``model`` from now on.

    Devices weight their samples with the global MADE ``made_version``.
    """

    kind: Literal["feddisk_switch"] = "feddisk_switch"
    made_model: Name
    made_version: Count
    model: Name


# --- FLICKER ----------------------------------------------------------------


class CkksContextAnnounce(BaseMessage):
    """Coordinator to all: the CKKS public context (no Galois keys) to fetch."""

    kind: Literal["ckks_context"] = "ckks_context"
    transfer_id: Id


class RingStart(BaseMessage):
    """Coordinator to ring members: the ring order (at least 3 devices)."""

    kind: Literal["ring_start"] = "ring_start"
    ring_id: Id
    order: Annotated[DeviceList, Field(min_length=3)]
    hop_deadline_s: Annotated[float, Field(gt=0.0)]


class RingHop(BaseMessage):
    """Device to next device via the coordinator: running Enc(counts), sealed."""

    kind: Literal["ring_hop"] = "ring_hop"
    ring_id: Id
    hop_index: Count
    recipient: DeviceId
    contributors: DeviceList
    box: Blob


class RingResult(BaseMessage):
    """Last ring device to coordinator: Enc(global counts)."""

    kind: Literal["ring_result"] = "ring_result"
    ring_id: Id
    contributors: DeviceList
    total: Blob


class _FlickerStep(BaseMessage):
    """Fields of a correction step: the run (its ring id) and the step number.

    A reply repeats both from its request, so one late from an earlier step
    or an earlier run is recognised (`round` stays the federation's round).
    """

    run_id: Id
    step: Positive


class CosineRequest(_FlickerStep):
    """Coordinator to devices: Enc(global distribution) for masked cosine."""

    kind: Literal["cosine_request"] = "cosine_request"
    ciphertext: Blob


class CosineReply(_FlickerStep):
    """Device to coordinator: Enc(GD) * unit vector + zero-sum mask."""

    kind: Literal["cosine_reply"] = "cosine_reply"
    masked_product: Blob


class ResampleRequest(_FlickerStep):
    """Coordinator to the dominant device: resample until LI >= nabla_client."""

    kind: Literal["resample_request"] = "resample_request"
    nabla_client: Annotated[float, Field(gt=0.0, le=1.0)]


class CountUpdate(_FlickerStep):
    """Dominant device to coordinator: Enc(count change); saturated if done."""

    kind: Literal["count_update"] = "count_update"
    delta: Blob
    saturated: bool


MAX_REDUNDANCY_CIPHERTEXTS = 2
"""Candidate ciphertexts in one redundancy offer (two fresh CKKS ciphertexts,
~660 KB sealed, fit one `Blob`)."""
REDUNDANCY_SCALE_BITS = 20
"""Block sums of a `RedundancyReply` are ``s * sign * (cosine - eta)`` with a
secret ``1 <= s < 2^REDUNDANCY_SCALE_BITS``: magnitudes stay below
``2^(REDUNDANCY_SCALE_BITS + 1)`` (the coordinator refuses larger ones)."""


def _power_of_two(value: int) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f"must be a power of two, got {value}")
    return value


PowerOfTwo = Annotated[int, Field(ge=1, le=1 << 24), AfterValidator(_power_of_two)]
Peers = Annotated[
    tuple[DeviceId, ...], Field(max_length=MAX_DEVICES), AfterValidator(_unique)
]


class _RedundancyLayout(_FlickerStep):
    """How candidate feature vectors are packed (see `ursa.edge_sdk.global_redundancy`).

    Each of ``ciphertexts`` candidate ciphertexts holds ``per_ciphertext``
    candidates, each repeated over ``slots / (block_slots * per_ciphertext)``
    blocks of ``block_slots`` slots.
    """

    block_slots: PowerOfTwo
    per_ciphertext: PowerOfTwo
    ciphertexts: Annotated[int, Field(ge=1, le=MAX_REDUNDANCY_CIPHERTEXTS)]


class RedundancyOffer(_RedundancyLayout):
    """Dominant device to coordinator: its encrypted candidates, sealed to one peer.

    ``recipients`` names every peer of this global redundancy test (one offer
    each), so the coordinator knows when all have answered.
    """

    kind: Literal["redundancy_offer"] = "redundancy_offer"
    recipient: DeviceId
    recipients: DeviceList
    box: Blob

    @_model_validator(mode="after")
    def _addressed(self) -> Self:
        if self.recipient not in self.recipients:
            raise ValueError("recipient must be one of recipients")
        if self.sender in self.recipients:
            raise ValueError("the dominant device cannot be its own peer")
        return self


class RedundancyAsk(_RedundancyLayout):
    """Coordinator to a peer: ``origin``'s sealed candidates; reply with products.

    ``vector_slots`` (chosen by the coordinator from the global counts, never
    from the peer's) is how many feature vectors every peer's reply covers.
    """

    kind: Literal["redundancy_ask"] = "redundancy_ask"
    origin: DeviceId
    vector_slots: PowerOfTwo
    box: Blob


class RedundancyReply(_FlickerStep):
    """Peer to coordinator: one ciphertext of signed, masked products.

    Part 0 also carries ``box``, sealed to the dominant device (the coordinator
    relays it unopened).
    """

    kind: Literal["redundancy_reply"] = "redundancy_reply"
    part: Count
    parts: Annotated[int, Field(ge=1, le=MAX_CHUNK_COUNT)]
    products: Blob
    box: Blob | None = None

    @_model_validator(mode="after")
    def _box_in_part_zero(self) -> Self:
        if self.part >= self.parts:
            raise ValueError("part must be < parts")
        if (self.part == 0) != (self.box is not None):
            raise ValueError("part 0, and only part 0, carries the box")
        return self


class RedundancyResult(_FlickerStep):
    """Coordinator to the dominant device: one peer's decrypted sign bits.

    ``peers`` lists every peer that answered in time (one message each, in
    that order); with none, a single message without ``peer``.
    """

    kind: Literal["redundancy_result"] = "redundancy_result"
    peers: Peers
    vector_slots: PowerOfTwo
    peer: DeviceId | None = None
    box: Blob | None = None
    signs: Blob | None = None

    @_model_validator(mode="after")
    def _one_peer(self) -> Self:
        present = [v is not None for v in (self.peer, self.box, self.signs)]
        if any(present) != all(present):
            raise ValueError("give peer, box and signs together")
        if (self.peer is None) != (not self.peers):
            raise ValueError("name a peer of peers, or none when peers is empty")
        if self.peer is not None and self.peer not in self.peers:
            raise ValueError("peer must be one of peers")
        return self


Message = Annotated[
    Hello
    | EnrolResult
    | ErrorReply
    | Status
    | Heartbeat
    | KeyEpochStart
    | SealRequest
    | AgentPublicKey
    | SealedSecretKey
    | Registration
    | RegistrySum
    | SigmaSearchStart
    | SearchSums
    | SearchAnswer
    | RoundAnnounce
    | Volunteer
    | TryAssignment
    | EncryptedDistribution
    | TrySums
    | AgentAnswer
    | SelectionResult
    | TransferManifest
    | Chunk
    | ChunkRequest
    | ModelAvailable
    | ModelUpdate
    | DualStepRequest
    | ClimbStats
    | ClimbSum
    | MadeLossRequest
    | MadeLoss
    | MadeLossSum
    | MadeVerdict
    | FeddiskSwitch
    | CkksContextAnnounce
    | RingStart
    | RingHop
    | RingResult
    | CosineRequest
    | CosineReply
    | ResampleRequest
    | CountUpdate
    | RedundancyOffer
    | RedundancyAsk
    | RedundancyReply
    | RedundancyResult,
    Field(discriminator="kind"),
]
"""Any ursa wire message, discriminated by `kind`."""

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)

MESSAGE_TYPES: dict[str, type[BaseMessage]] = {
    get_args(cls.model_fields["kind"].annotation)[0]: cls
    for cls in get_args(get_args(Message)[0])
}
"""Kind tag -> message class."""
