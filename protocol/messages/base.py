"""What every wire message shares: fields, id and size rules, topic names, errors.

Each message carries `kind` (the union tag), `protocol_version`, `federation`,
`run` (the coordinator's run it belongs to, "" while the sender knows none),
`round` (the sender's view of the current round, 0 before the first), `sender`
(a device id or `"coordinator"`), a `message_id` (handlers are idempotent by
it) and `sent_at` (unix seconds). A message class declares the last level of
the topic it travels on (`topic`, CONTROL unless it says otherwise) and
whether it is published retained when global, so a kind's route is read off
its class and no table elsewhere can disagree with it. Validation here is
structural and cheap (ids, lengths, ranges); cryptographic checks belong to
the receiver.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa._compat import StrEnum

PROTOCOL_VERSION = 10
"""2: `KeyEpochStart` carries the federation's signed method list. 3: one
`secure_mean` family. 4: every message carries `run`; `EnrolResult` is signed.
6: model updates are summed under masks (`secure_aggregation`); `KeyEpochStart`
signs the aggregation mode. 7: bounded influence and safe defaults (the agent's
registry check, signed named refusals, operator certificates on every relayed
identity; docs/protocol.md "Version 7"). 8: every coordinator message but a
chunk is signed, and `ModelAvailable` names the model's SHA-256
(docs/protocol.md "Version 8"). 10: `KeyEpochStart` signs the global model's
tensor spec (`ModelSpec`), so a device whose model does not fit sits the epoch
out before any selection (docs/protocol.md "Version 10")."""

COORDINATOR = "coordinator"
"""The `sender` of coordinator messages; reserved, never a device id."""

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"

RUN_PATTERN = r"^[A-Za-z0-9_-]{0,64}$"
"""A run id, or "" (a sender that has joined no run yet)."""

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

MAX_CERTIFICATE_BYTES = 512
"""Longest operator certificate on the wire (`ursa.crypto.certificate`'s are
at most 285 bytes; the room is for a later version)."""


# Topic names (the last topic level). Commands, replies and ciphertexts use CONTROL.
CONTROL = "control"
TRANSFER = "transfer"
"""Manifests, chunks and chunk requests (one topic keeps them in order)."""
METRICS = "metrics"
"""Heartbeats and metrics, QoS 0."""
STATUS = "status"
ROUND = "round"
EPOCH = "epoch"
PUBLIC_KEY = "public_key"
REGISTRY = "registry"
MODEL = "model"
CKKS_CONTEXT = "ckks_context"
PHASE = "phase"
"""FedDisk's switch to phase 2 (retained: a device that reconnects catches up)."""

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
    METHOD_MISMATCH = "method_mismatch"
    COORDINATOR_IDENTITY_MISMATCH = "coordinator_identity_mismatch"
    """The device pinned another coordinator identity (a replaced coordinator)."""
    DATA_MISMATCH = "data_mismatch"
    MODEL_MISMATCH = "model_mismatch"
    """The federation's model differs from the device's (a tensor's name,
    shape or dtype): the device sits the key epoch out, as for data_mismatch."""
    INSECURE_PARAMETERS = "insecure_parameters"
    """The key epoch's keys are below the device's floor (Paillier under 2048
    bits without its own ``insecure_test_keys``): the device sits it out."""
    WRONG_RUN = "wrong_run"
    """The message belongs to another run of the federation (a reset coordinator)."""
    TRAINING_FAILED = "training_failed"
    """The device's trainer raised in this round: the coordinator stops waiting."""
    PLAIN_REFUSED = "plain_refused"
    """The device does not send a plain update (the epoch sums in the clear and
    its config does not allow it): not waited for in the round."""
    SECURE_AGGREGATION_FAILED = "secure_aggregation_failed"
    """The device refused a secure-aggregation step (a bad roster, survivor list
    or box): it says why, and sits the round out."""
    EVALUATION_FAILED = "evaluation_failed"
    """The device's evaluation raised in this round (same handling)."""
    UNTRUSTED_IDENTITY = "untrusted_identity"
    """The device refused keys no valid operator certificate vouches for (an
    agent, ring member, secure-aggregation peer, seal recipient or coordinator
    the coordinator presented): it takes no part with them."""
    INTERNAL = "internal"


TIMING_CODES = frozenset(
    {ErrorCode.LATE, ErrorCode.WRONG_ROUND, ErrorCode.WRONG_EPOCH, ErrorCode.WRONG_RUN}
)
"""Refusals that say when a message came, not what it says: a reply after its
window, a rejoining device's message of a round, key epoch or run gone by.
Expected races in a live fleet, so both sides log them at INFO, not WARNING."""


def _not_reserved(value: str) -> str:
    if value == COORDINATOR:
        raise ValueError(f"{COORDINATOR!r} is reserved and cannot be a device id")
    return value


def _signature_length(value: bytes) -> bytes:
    if len(value) not in (0, MAX_SIGNATURE_BYTES):
        raise ValueError("signature must be empty (unsigned) or 64 bytes (Ed25519)")
    return value


def unique_entries(items: tuple[_T, ...]) -> tuple[_T, ...]:
    """Validator: a tuple without repeats (device lists, indices)."""
    if len(set(items)) != len(items):
        raise ValueError("entries must be unique")
    return items


Id = Annotated[str, Field(pattern=ID_PATTERN)]


RunId = Annotated[str, Field(pattern=RUN_PATTERN)]


DeviceId = Annotated[str, Field(pattern=ID_PATTERN), AfterValidator(_not_reserved)]


DeviceList = Annotated[
    tuple[DeviceId, ...],
    Field(min_length=1, max_length=MAX_DEVICES),
    AfterValidator(unique_entries),
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


CertificateBytes = Annotated[bytes, Field(max_length=MAX_CERTIFICATE_BYTES)]
"""An operator certificate (`ursa.crypto.certificate`), or b"" (none, tofu)."""


Signature = Annotated[
    bytes, Field(max_length=MAX_SIGNATURE_BYTES), AfterValidator(_signature_length)
]


TryIndices = Annotated[
    tuple[Count, ...],
    Field(min_length=1, max_length=MAX_TRIES),
    AfterValidator(unique_entries),
]


def _new_message_id() -> str:
    return uuid.uuid4().hex


class RelayedFrom(StrEnum):
    """Who may send a kind to a device besides the coordinator (`BaseMessage.relay`).

    The device's admission reads it off the class, so a method cannot widen
    who may send a kind.
    """

    NONE = "none"
    """The coordinator only."""
    AGENT = "agent"
    """Also the key epoch's agent, relayed by the coordinator (and signed)."""
    PEER = "peer"
    """Also another device, relayed to the recipient's own down topic only."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class BaseMessage(_Frozen):
    """Fields common to every wire message."""

    protocol_version: Positive = PROTOCOL_VERSION
    federation: Id
    run: RunId = ""
    round: Count
    sender: Id
    message_id: Id = Field(default_factory=_new_message_id)
    sent_at: Annotated[float, Field(ge=0.0)] = Field(default_factory=time.time)
    signature: Signature = b""
    """Ed25519 over `envelope.signing_bytes`, empty until signed. Every
    coordinator message but a `Chunk` (bound by its signed manifest's SHA-256)
    carries the coordinator's; a kind a device or the agent signs says so."""

    topic: ClassVar[str] = CONTROL
    """The last topic level this kind travels on."""
    retained: ClassVar[bool] = False
    """Published retained when global, so a device that (re)connects catches up."""
    relay: ClassVar[RelayedFrom] = RelayedFrom.NONE
    """Who besides the coordinator may send this kind to a device."""


class ErrorReply(BaseMessage):
    """Either way: a rejected message, as data (`code` is usually an ErrorCode).

    A device's refusal that can start a new key epoch
    (``coordinator_identity_mismatch``) names the refused message by id and
    `in_reply_to_digest` (SHA-256 of its signing bytes) and is signed by the
    device's identity key: the coordinator acts on it only if it matches a
    message it sent that device (`ursa.coordinator.identity_refusals`).
    """

    kind: Literal["error"] = "error"
    code: Name
    reason: Text
    in_reply_to: Id | None = None
    in_reply_to_digest: Sha256Hex | None = None

    @_model_validator(mode="after")
    def _digest_names_a_message(self) -> Self:
        if self.in_reply_to_digest is not None and self.in_reply_to is None:
            raise ValueError("in_reply_to_digest without in_reply_to")
        return self
