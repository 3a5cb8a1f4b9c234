"""Enrolment and liveness: hello, the enrolment answer, status and heartbeats."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.messages.base import (
    COORDINATOR,
    METRICS,
    STATUS,
    BaseMessage,
    CertificateBytes,
    Count,
    DeviceId,
    Id,
    Key32,
    Name,
    Text,
    _Frozen,
)


class Hello(BaseMessage):
    """Device to coordinator: enrol with identity public keys (pinned or TOFU).

    `certificate`: the device's operator certificate for these keys, which the
    coordinator checks and relays with the keys (b"": none, a tofu device).
    """

    kind: Literal["hello"] = "hello"
    device_id: DeviceId
    x25519_public: Key32
    ed25519_public: Key32
    certificate: CertificateBytes = b""
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
    `certificate` is the operator's certificate for these keys, relayed so the
    receiver can check them against the operator key it was provisioned with
    (b"": none, a tofu federation).
    """

    device_id: Id
    x25519_public: Key32
    ed25519_public: Key32
    certificate: CertificateBytes = b""

    def public_identity(self) -> DevicePublicIdentity:
        """The keys as a `DevicePublicIdentity` (not checked against `certificate`).

        Raises:
            IdentityFormatError: an invalid Ed25519 point.
        """
        return DevicePublicIdentity(
            self.device_id, self.x25519_public, self.ed25519_public
        )


class DeviceKeys(IdentityKeys):
    """A device's identity public keys (never the reserved coordinator id)."""

    device_id: DeviceId


class EnrolResult(BaseMessage):
    """Coordinator to device: enrolment accepted or refused, and why.

    An acceptance carries the coordinator's public identity, which the device
    pins (or checks against its configured fingerprint) and then verifies the
    coordinator's signatures with. An acceptance is signed by that identity:
    it is how a device learns the coordinator's `run` (version 4).
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


class Status(BaseMessage):
    """Retained liveness on `.../status` (`online`; the last will says offline)."""

    kind: Literal["status"] = "status"
    topic: ClassVar[str] = STATUS
    retained: ClassVar[bool] = True
    online: bool
    state: Name = "idle"


class Heartbeat(BaseMessage):
    """Device to coordinator, QoS 0: still alive."""

    kind: Literal["heartbeat"] = "heartbeat"
    topic: ClassVar[str] = METRICS
    seq: Count
