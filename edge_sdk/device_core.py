"""Shared state and helpers of the edge client (its protocol steps build on it).

`DeviceCore` holds the device's view of the federation: the pinned
coordinator identity, the adopted key epoch, the agent's identity, the
epoch's keys and obfuscator pool, its registry slot, the decrypted overall
registry and the current round. Handlers that need something not known yet
raise `NotReadyError`; the client parks that message and retries it after the
next change. Sending goes through an outbox that the client flushes outside
its lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.certificate import Role
from ursa.crypto.encoding import FixedPoint
from ursa.crypto.errors import UntrustedIdentityError
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity, verify_signature
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.crypto.trust_anchor import TrustAnchor
from ursa.edge_sdk.callbacks import (
    DeviceCallbacks,
    DeviceError,
    ModelReceived,
    RoundTrained,
    Selected,
    notify,
)
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.data_check import (
    DataFacts,
    DataProblem,
    FederationFacts,
    data_problems,
    reason_of,
)
from ursa.edge_sdk.membership import RunMembership
from ursa.edge_sdk.state import DeviceStateDir, StoredEpoch
from ursa.edge_sdk.trainer import Trainer
from ursa.protocol.envelope import encode, message_digest, message_kind, signing_bytes
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    BaseMessage,
    ErrorCode,
    ErrorReply,
    IdentityKeys,
    KeyEpochStart,
)
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import NotReadyError
from ursa.protocol.topics import name_for, qos_for, up_topic
from ursa.protocol.untrusted_text import escape

__all__ = [
    "DISTRIBUTION_CODEC",
    "DeviceCore",
    "DeviceStats",
    "TrainingStats",
    "seal_context",
]

logger = logging.getLogger("ursa.edge_sdk")

_M = TypeVar("_M", bound=BaseMessage)

DISTRIBUTION_CODEC = FixedPoint(bound=1.0)
"""Label distributions in [0, 1], 24 fraction bits (the protocol-wide scale)."""


class DeviceStats:
    """Counters for demos and benchmarks (crypto seconds, rounds)."""

    def __init__(self) -> None:
        self.crypto_s = 0.0
        self.selected_rounds: list[int] = []
        self.answered_rounds: list[int] = []


@dataclass
class TrainingStats:
    """Counters of the training side (for demos and benchmarks)."""

    train_s: float = 0.0
    rounds_trained: int = 0
    update_bytes: int = 0
    models_downloaded: int = 0
    dual_steps: int = 0


def seal_context(federation: str, epoch: int) -> bytes:
    """What a sealed epoch key is bound to (federation and key epoch)."""
    return f"ursa-epoch-key|{federation}|{epoch}".encode()


class DeviceCore:
    """State and helpers shared by the device's protocol steps."""

    _config: DeviceConfig
    _labels: NDArray[np.int64]
    _trainer: Trainer
    _rng: np.random.Generator
    _store: DeviceStateDir
    _identity: DeviceIdentity
    _outbox: Outbox
    stats: DeviceStats
    enrolled: threading.Event
    _trust: TrustAnchor
    """Whom relayed identities must be certified by (`ursa.protocol.trust_config`)."""
    _certificate: bytes
    """This device's operator certificate, sent in its Hello (b"": tofu)."""
    _coordinator: DevicePublicIdentity | None
    _refused_coordinators: set[str]
    """Fingerprints of coordinators this device refused (and said so, once)."""
    _epoch: KeyEpochStart | None
    _epoch_payload: bytes
    _agent: DevicePublicIdentity | None
    _public_key: PaillierPublicKey | None
    _secret_key: PaillierSecretKey | None
    _pool: ObfuscatorPool | None
    _index: int | None
    _registry: NDArray[np.int64] | None
    _trained: set[int]
    _registered_epoch: int | None
    _sat_out_epoch: int | None = None
    """The key epoch this device sits out because it does not fit (data_mismatch)."""
    _model_problems: tuple[DataProblem, ...] = ()
    """How the latest global model did not fit (kept until one fits)."""
    _membership: RunMembership
    """The coordinator's run this device joined (from a signed `EnrolResult`)."""
    _callbacks: DeviceCallbacks | None = None
    """The app's hooks (`ursa.edge_sdk.callbacks`)."""
    _hello_unanswered: bool = False
    """A Hello went out and no EnrolResult has answered it yet."""
    _hello_retry_at: float | None = None
    """When to say hello again if still unanswered (monotonic seconds)."""
    _hello_backoff_s: float | None = None
    """The wait before the next retry (None: the first one's)."""

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._config.device_id

    def _in_run(self, message: _M) -> _M:
        """`message` stamped with the joined run (unless it names one already)."""
        if message.run:
            return message
        return message.model_copy(update={"run": self._membership.run})

    def _send(self, message: BaseMessage) -> None:
        name = name_for(message_kind(message))
        topic = up_topic(self._config.federation, self.device_id, name)
        self._outbox.put(topic, encode(self._in_run(message)), qos_for(name))

    def _signed(self, message: _M) -> _M:
        """Stamp the run, then sign: the signature covers the run."""
        stamped = self._in_run(message)
        signature = self._identity.sign(signing_bytes(stamped))
        return stamped.model_copy(update={"signature": signature})

    def _verify(self, signer: DevicePublicIdentity, message: BaseMessage) -> None:
        signature: bytes = getattr(message, "signature", b"")
        verify_signature(signer, signing_bytes(message), signature)

    def _require_epoch(self, epoch: int) -> KeyEpochStart:
        """The adopted epoch if it is `epoch`; blocks on a newer one, refuses older."""
        current = self._epoch
        if current is None or epoch > current.epoch:
            raise NotReadyError
        if epoch < current.epoch:
            raise ValueError(f"key epoch {epoch} is over (current {current.epoch})")
        return current

    @property
    def sits_out(self) -> bool:
        """Whether the device sits the current key epoch out (its data does not fit)."""
        epoch = self._epoch
        return epoch is not None and self._sat_out_epoch == epoch.epoch

    def _sit_out(
        self,
        epoch: int,
        round_index: int,
        problems: tuple[DataProblem, ...],
        in_reply_to: str | None,
    ) -> None:
        """Sit key epoch `epoch` out: one ERROR, one `data_mismatch` answer.

        ``model_mismatch`` instead when every problem is the device's model.

        The device neither registers nor volunteers nor trains in the epoch
        (`_index` is cleared); the coordinator excludes it from selection.
        """
        self._index = None
        if self._sat_out_epoch == epoch:
            return
        self._sat_out_epoch = epoch
        model = bool(problems) and all(p.model for p in problems)
        code = ErrorCode.MODEL_MISMATCH if model else ErrorCode.DATA_MISMATCH
        logger.error(
            "%s: sitting out key epoch %d: %s: %s",
            self.device_id,
            epoch,
            code,
            "; ".join(str(p) for p in problems),
        )
        self._tell_coordinator(
            code,
            reason_of(problems),
            round_index=round_index,
            message_id=derived_id(self.device_id, "data_mismatch", epoch),
            in_reply_to=in_reply_to,
        )

    def _trusted(
        self, keys: IdentityKeys, role: Role = Role.DEVICE
    ) -> DevicePublicIdentity:
        """The identity behind relayed keys, if the operator certified them.

        The one place a device takes a peer's keys from the coordinator: under
        an operator key a made-up agent, ring member or peer stops here.

        Raises:
            UntrustedIdentityError: no valid certificate for these keys (the
                client then refuses the message with ``untrusted_identity``).
        """
        return self._trust.check(keys.public_identity(), keys.certificate, role)

    def _refuse_untrusted(
        self, message: BaseMessage, exc: UntrustedIdentityError
    ) -> None:
        """One ERROR and an ``untrusted_identity`` reply for keys nobody vouched for."""
        kind, why = message_kind(message), escape(str(exc))
        logger.error(
            "%s: refusing %s: untrusted identity: %s", self.device_id, kind, why
        )
        self._tell_coordinator(
            ErrorCode.UNTRUSTED_IDENTITY,
            f"{kind}: {why}",
            round_index=message.round,
            message_id=derived_id(self.device_id, "untrusted", message.message_id),
            in_reply_to=message.message_id,
            run=message.run,
        )

    def _tell_coordinator(
        self,
        code: ErrorCode,
        reason: str,
        *,
        round_index: int,
        message_id: str,
        in_reply_to: str | None,
        run: str = "",
        named: BaseMessage | None = None,
    ) -> None:
        """Why this device refuses what the coordinator sent (an `ErrorReply`).

        ``message_id`` is derived from what is refused, so a repeated answer
        is recognised by the coordinator's dedup. ``run``: the refused
        message's run, when the device has not joined it (else the joined one).
        ``named``: the refused message, for a refusal that can start a key
        epoch: the answer then carries its digest and is signed, so the
        coordinator can tell it from a forged or unsolicited one.
        """
        reply = ErrorReply(
            federation=self._config.federation,
            run=run,
            round=round_index,
            sender=self.device_id,
            message_id=message_id,
            code=code,
            reason=reason[:256],
            in_reply_to=in_reply_to if named is None else named.message_id,
            in_reply_to_digest=None if named is None else message_digest(named),
        )
        self._send(reply if named is None else self._signed(reply))

    def _notify_selected(self, round_index: int) -> None:
        notify(
            self._callbacks, "on_selected", Selected(round_index), device=self.device_id
        )

    def _notify_trained(self, event: RoundTrained) -> None:
        notify(self._callbacks, "on_round_trained", event, device=self.device_id)

    def _notify_model(self, version: int) -> None:
        event = ModelReceived(version)
        notify(self._callbacks, "on_model", event, device=self.device_id)

    def _notify_error(self, event: DeviceError) -> None:
        notify(self._callbacks, "on_error", event, device=self.device_id)

    def _report_failure(
        self,
        code: ErrorCode,
        round_index: int,
        exc: Exception,
        in_reply_to: str | None,
    ) -> ErrorReply:
        """The app's trainer raised: log it here, tell the coordinator why in a word.

        The reply names the exception type only: its message and traceback
        may hold the device's data, so they stay in the device's own log.
        Returns the reply (to answer a re-published notice the same way).
        """
        logger.error(
            "%s: %s in round %d: %s: %s",
            self.device_id,
            code.value,
            round_index,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        reason = f"{type(exc).__name__} raised by the device's trainer"
        reply = ErrorReply(
            federation=self._config.federation,
            round=round_index,
            sender=self.device_id,
            message_id=derived_id(self.device_id, code.value, round_index),
            code=code,
            reason=reason[:256],
            in_reply_to=in_reply_to,
        )
        self._send(reply)
        self._notify_error(DeviceError(round_index, code.value, reason, "device"))
        return reply

    def _fit_problems(self, num_classes: int) -> tuple[DataProblem, ...]:
        """How the labels (and the last global model) do not fit the federation."""
        federation = FederationFacts(num_classes=num_classes)
        found = data_problems(DataFacts.of(self._labels), federation)
        return (*found, *self._model_problems)

    def _distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """The label distribution over `num_classes`, or None if labels do not fit."""
        if self._labels.size == 0 or int(self._labels.max()) >= num_classes:
            return None
        counts = np.bincount(self._labels, minlength=num_classes).astype(np.float64)
        distribution: NDArray[np.float64] = counts / counts.sum()
        return distribution

    def _set_public_key(self, public_key: PaillierPublicKey) -> None:
        self._public_key = public_key
        size = self._config.obfuscator_pool_size
        if size > 0 and self._pool is None:
            self._pool = ObfuscatorPool(public_key, size)

    def _save_epoch(self) -> None:
        self._store.save_epoch(
            StoredEpoch(
                notice=self._epoch_payload,
                agent=None if self._agent is None else self._agent.to_bytes(),
                public_key=None
                if self._public_key is None
                else self._public_key.to_bytes(),
            )
        )

    def _maybe_register(self, *, resend: bool) -> None:
        raise NotImplementedError

    def _registration_key(self, epoch: int) -> bytes | None:
        """The first method's key for this epoch's registration (None: none)."""
        raise NotImplementedError

    def _forget_run_state(self) -> None:
        """Drop the in-memory state of the old run (the client's, every method's)."""
        raise NotImplementedError

    def methods(self) -> tuple[str, ...]:
        """The methods this device runs (must equal the key epoch's signed list)."""
        raise NotImplementedError

    def _send_hello(self) -> None:
        raise NotImplementedError
