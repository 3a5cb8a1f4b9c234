"""Every ursa wire message: frozen pydantic models in one discriminated union.

One module per concern, each the wire contract both sides import: `base`
(common fields, id rules, topic names, `ErrorReply`), `session` (enrolment and
liveness), `keys` (the Paillier key epoch), `transfer` (chunked transfers),
`training` (announce, selection result, models and updates), `lifecycle`
(the end of the federation), `secure_mean`
(the encrypted mean methods share), and one module per method (`dubhe`,
`climb`, `feddisk`, `flicker`). A kind's topic is declared on its class.
Ciphertexts, keys, sealed boxes and tensors are raw `bytes`;
`ursa.protocol.envelope` puts them on the wire as msgpack.

Every message has a `signature` field: Ed25519 over
`envelope.signing_bytes(message)`, empty until signed. The coordinator signs
everything it sends but a `Chunk` (`envelope.signed_by_coordinator`), and a
device acts on nothing of the coordinator's that the pinned coordinator key
did not sign; a kind a device or the agent signs says so in its docstring.
"""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field, TypeAdapter

from ursa.protocol.messages.base import (
    CKKS_CONTEXT,
    CONTROL,
    COORDINATOR,
    DEFAULT_CHUNK_SIZE,
    EPOCH,
    ID_PATTERN,
    MAX_CERTIFICATE_BYTES,
    MAX_CHUNK_COUNT,
    MAX_CHUNK_SIZE,
    MAX_DEVICES,
    MAX_SIGNATURE_BYTES,
    MAX_TRANSFER_BYTES,
    MAX_TRIES,
    METRICS,
    MODEL,
    NAME_PATTERN,
    PHASE,
    PROTOCOL_VERSION,
    PUBLIC_KEY,
    REGISTRY,
    ROUND,
    RUN_PATTERN,
    STATUS,
    TRANSFER,
    BaseMessage,
    Blob,
    CertificateBytes,
    Count,
    DeviceId,
    DeviceList,
    ErrorCode,
    ErrorReply,
    Fraction,
    Id,
    Key32,
    Name,
    Positive,
    RelayedFrom,
    RunId,
    Sha256Hex,
    Signature,
    Text,
    TryIndices,
)
from ursa.protocol.messages.climb import CLIMB_DUAL, CLIMB_DUAL_LENGTH
from ursa.protocol.messages.dubhe import (
    RANK_PAGE_BUDGET,
    RANK_PAGE_SIZE,
    AgentAnswer,
    EncryptedDistribution,
    RankBox,
    RankEntry,
    RankRequest,
    Registration,
    RegistryCheck,
    RegistrySum,
    RegistryVerdict,
    SealedRank,
    SealedRanks,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.messages.evaluation import (
    FLEET_EVAL,
    MAX_EVAL_COUNT,
    MeanResult,
    fleet_eval_length,
)
from ursa.protocol.messages.feddisk import (
    MADE_LOSS,
    MADE_LOSS_LENGTH,
    FeddiskSwitch,
    MadeVerdict,
)
from ursa.protocol.messages.flicker import (
    MAX_REDUNDANCY_CIPHERTEXTS,
    REDUNDANCY_SCALE_BITS,
    CkksContextAnnounce,
    CosineReply,
    CosineRequest,
    CountUpdate,
    RedundancyAsk,
    RedundancyOffer,
    RedundancyReply,
    RedundancyResult,
    ResampleRequest,
    RingHop,
    RingResult,
    RingStart,
)
from ursa.protocol.messages.keys import (
    MAX_BOX_BYTES,
    MAX_SPEC_TENSORS,
    SEAL_PAGE_SIZE,
    SEALED_KEYS_BUDGET,
    AgentPublicKey,
    KeyEpochStart,
    MethodSetting,
    ModelSpec,
    ModelTensor,
    SealedBox,
    SealedKeys,
    SealedSecretKey,
    SealRequest,
    split_boxes,
)
from ursa.protocol.messages.lifecycle import END, MAX_END_METRICS, FederationEnd
from ursa.protocol.messages.secure_aggregation import (
    MAX_SHARE_INDEX,
    SHARE_BYTES,
    MaskedUpdate,
    PeerKeys,
    RevealedShare,
    SecAggKeys,
    SecAggRoster,
    SecAggSetup,
    SecAggShareBundle,
    SecAggShares,
    SecAggUnmask,
    SecAggUnmaskShares,
    ShareBox,
)
from ursa.protocol.messages.secure_mean import MeanReport, MeanRequest, MeanSum
from ursa.protocol.messages.session import (
    DeviceKeys,
    EnrolResult,
    Heartbeat,
    Hello,
    IdentityKeys,
    Status,
)
from ursa.protocol.messages.training import (
    MAX_UPDATE_METRICS,
    ModelAvailable,
    ModelUpdate,
    RoundAnnounce,
    SelectionResult,
)
from ursa.protocol.messages.transfer import (
    Chunk,
    ChunkRequest,
    TransferManifest,
)

__all__ = [
    "CKKS_CONTEXT",
    "CLIMB_DUAL",
    "CLIMB_DUAL_LENGTH",
    "CONTROL",
    "COORDINATOR",
    "DEFAULT_CHUNK_SIZE",
    "END",
    "EPOCH",
    "FLEET_EVAL",
    "ID_PATTERN",
    "MADE_LOSS",
    "MADE_LOSS_LENGTH",
    "MAX_BOX_BYTES",
    "MAX_CERTIFICATE_BYTES",
    "MAX_CHUNK_COUNT",
    "MAX_CHUNK_SIZE",
    "MAX_DEVICES",
    "MAX_END_METRICS",
    "MAX_EVAL_COUNT",
    "MAX_REDUNDANCY_CIPHERTEXTS",
    "MAX_SHARE_INDEX",
    "MAX_SIGNATURE_BYTES",
    "MAX_SPEC_TENSORS",
    "MAX_TRANSFER_BYTES",
    "MAX_TRIES",
    "MAX_UPDATE_METRICS",
    "MESSAGE_ADAPTER",
    "MESSAGE_TYPES",
    "METRICS",
    "MODEL",
    "NAME_PATTERN",
    "PHASE",
    "PROTOCOL_VERSION",
    "PUBLIC_KEY",
    "RANK_PAGE_BUDGET",
    "RANK_PAGE_SIZE",
    "REDUNDANCY_SCALE_BITS",
    "REGISTRY",
    "ROUND",
    "RUN_PATTERN",
    "SEALED_KEYS_BUDGET",
    "SEAL_PAGE_SIZE",
    "SHARE_BYTES",
    "STATUS",
    "TRANSFER",
    "AgentAnswer",
    "AgentPublicKey",
    "BaseMessage",
    "Blob",
    "CertificateBytes",
    "Chunk",
    "ChunkRequest",
    "CkksContextAnnounce",
    "CosineReply",
    "CosineRequest",
    "Count",
    "CountUpdate",
    "DeviceId",
    "DeviceKeys",
    "DeviceList",
    "EncryptedDistribution",
    "EnrolResult",
    "ErrorCode",
    "ErrorReply",
    "FeddiskSwitch",
    "FederationEnd",
    "Fraction",
    "Heartbeat",
    "Hello",
    "Id",
    "IdentityKeys",
    "Key32",
    "KeyEpochStart",
    "MadeVerdict",
    "MaskedUpdate",
    "MeanReport",
    "MeanRequest",
    "MeanResult",
    "MeanSum",
    "Message",
    "MethodSetting",
    "ModelAvailable",
    "ModelSpec",
    "ModelTensor",
    "ModelUpdate",
    "Name",
    "PeerKeys",
    "Positive",
    "RankBox",
    "RankEntry",
    "RankRequest",
    "RedundancyAsk",
    "RedundancyOffer",
    "RedundancyReply",
    "RedundancyResult",
    "Registration",
    "RegistryCheck",
    "RegistrySum",
    "RegistryVerdict",
    "RelayedFrom",
    "ResampleRequest",
    "RevealedShare",
    "RingHop",
    "RingResult",
    "RingStart",
    "RoundAnnounce",
    "RunId",
    "SealRequest",
    "SealedBox",
    "SealedKeys",
    "SealedRank",
    "SealedRanks",
    "SealedSecretKey",
    "SecAggKeys",
    "SecAggRoster",
    "SecAggSetup",
    "SecAggShareBundle",
    "SecAggShares",
    "SecAggUnmask",
    "SecAggUnmaskShares",
    "SelectionResult",
    "Sha256Hex",
    "ShareBox",
    "Signature",
    "Status",
    "Text",
    "TransferManifest",
    "TryAssignment",
    "TryIndices",
    "TrySums",
    "Volunteer",
    "fleet_eval_length",
    "split_boxes",
]

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
    | SealedKeys
    | Registration
    | RegistrySum
    | RegistryCheck
    | RegistryVerdict
    | RankRequest
    | SealedRanks
    | SealedRank
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
    | SecAggSetup
    | SecAggKeys
    | SecAggRoster
    | SecAggShares
    | SecAggShareBundle
    | MaskedUpdate
    | SecAggUnmask
    | SecAggUnmaskShares
    | MeanRequest
    | MeanReport
    | MeanSum
    | MeanResult
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
    | RedundancyResult
    | FederationEnd,
    Field(discriminator="kind"),
]
"""Any ursa wire message, discriminated by `kind`."""

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)

MESSAGE_TYPES: dict[str, type[BaseMessage]] = {
    get_args(cls.model_fields["kind"].annotation)[0]: cls
    for cls in get_args(get_args(Message)[0])
}
"""Kind tag -> message class."""
