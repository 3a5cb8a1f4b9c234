"""The Paillier key epoch and its roster, the coordinator's infrastructure.

Every method that sums under encryption (Dubhe's registry and tries, CLIMB's
dual step, FedDisk's MADE loss) uses the epoch's key; none owns it. The
stages follow Dubhe Fig. 4.

Key epoch: a random online enrolled device becomes the agent; the signed
`KeyEpochStart` (retained) names it, carries its enrolled identity keys (so
every recipient can verify the agent and open its box) and the registry
parameters; the agent gets a `SealRequest`. The agent's signed
`AgentPublicKey` is verified and relayed (retained); each `SealedSecretKey` is
relayed to its recipient unopened (the coordinator cannot open it). An agent
silent past the deadline is replaced by another (a new epoch number).

Registration: each recipient's encrypted one-hot registry (one party, the
epoch key, the codebook's length) joins a running sum, once per device; when
every online recipient has registered, or at the deadline, the encrypted
`RegistrySum` is published (retained) and the first round opens.
"""

from __future__ import annotations

import logging

from ursa.coordinator.core import EpochWork, ServiceCore
from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.rounds import Stage, advance
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import (
    PaillierPublicKey,
    add_encrypted,
    encrypted_vector_from,
)
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import encode, signing_bytes
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    ErrorCode,
    KeyEpochStart,
    Registration,
    RegistrySum,
    SealedSecretKey,
    SealRequest,
)
from ursa.protocol.router import RejectedError

__all__ = ["EpochStages"]

logger = logging.getLogger("ursa.coordinator")


class EpochStages(ServiceCore):
    """KEY_EPOCH and REGISTRATION: stage functions and message handlers."""

    def _start_key_epoch(self, now: float, exclude: frozenset[str]) -> None:
        """Open a new key epoch with a random online agent not in `exclude`."""
        cfg = self._config
        online = sorted(self._online_enrolled())
        quorum = cfg.min_devices if self._state.epoch == 0 else cfg.epoch_quorum()
        if len(online) < quorum:  # whatever asked for the epoch
            if self._state.stage is not Stage.ENROLMENT:
                logger.warning(
                    "a new key epoch needs %d devices online (quorum), %d are; "
                    "waiting for the fleet",
                    quorum,
                    len(online),
                )
                self._advance(Stage.ENROLMENT, now, None)
            return
        candidates = [d for d in online if d not in exclude] or online
        if not candidates:
            logger.warning("no online enrolled device can be the agent; waiting")
            if self._state.stage is Stage.KEY_EPOCH:
                self._advance(Stage.KEY_EPOCH, now, cfg.deadlines.key_epoch_s)
            return
        recipients = tuple(online[: cfg.registry.max_parties])
        agent = candidates[int(self._rng.integers(len(candidates)))]
        epoch = self._state.epoch + 1
        registry = cfg.registry
        notice = self._sign(
            KeyEpochStart(
                federation=cfg.federation,
                round=self._state.round,
                sender=COORDINATOR,
                epoch=epoch,
                agent=agent,
                agent_keys=device_keys_of(self._enrolled[agent]),
                num_classes=registry.num_classes,
                groups=registry.groups,
                sigma=registry.sigma,
                max_parties=registry.max_parties,
                key_bits=cfg.key_bits,
                methods=cfg.method_names(),
            )
        )
        payload = self._encode(notice)
        self._store.add_epoch(epoch, agent, recipients, payload)
        self._epoch = EpochWork(epoch, agent, recipients, payload)
        self._round = None
        self._set_state(
            advance(
                self._state,
                Stage.KEY_EPOCH,
                epoch=epoch,
                rekey=False,
                deadline_at=now + cfg.deadlines.key_epoch_s,
            )
        )
        logger.info(
            "key epoch %d: agent %s, %d recipients", epoch, agent, len(recipients)
        )
        self._send_raw(payload, "key_epoch_start", None)
        self._send_seal_request()

    def _send_seal_request(self) -> None:
        """Ask the agent to seal the epoch's secret key to every recipient."""
        work = self._epoch
        if work is None:
            return
        request = SealRequest(
            federation=self._config.federation,
            round=self._state.round,
            sender=COORDINATOR,
            epoch=work.epoch,
            recipients=tuple(
                device_keys_of(self._enrolled[d]) for d in work.recipients
            ),
        )
        self._send(request, work.agent)

    def _stage_key_epoch(self, now: float) -> None:
        work = self._epoch
        if work is None:
            self._start_key_epoch(now, frozenset())
            return
        if work.public_key is not None:
            self._advance(
                Stage.REGISTRATION, now, self._config.deadlines.registration_s
            )
            self._stage_registration(now)
        elif self._deadline_passed(now):
            logger.warning(
                "agent %s silent for key epoch %d; choosing another agent",
                work.agent,
                work.epoch,
            )
            self._start_key_epoch(now, frozenset({work.agent}))

    def _stage_registration(self, now: float) -> None:
        work = self._epoch
        if work is None or work.public_key is None:
            return
        expected = (set(work.recipients) & self._online) - self._sitting_out()
        all_in = bool(work.registered) and expected <= work.registered
        if not (all_in or self._deadline_passed(now)):
            return
        if work.running_sum is None:
            logger.warning("key epoch %d: nobody registered; new epoch", work.epoch)
            self._start_key_epoch(now, frozenset({work.agent}))
            return
        message = RegistrySum(
            federation=self._config.federation,
            round=self._state.round,
            sender=COORDINATOR,
            epoch=work.epoch,
            registry_sum=work.running_sum.to_bytes(work.public_key),
            num_parties=len(work.registered),
        )
        payload = self._encode(message)
        work.registry_sum_msg = payload
        self._store.set_registry_sum(work.epoch, payload)
        missing = sorted(set(work.recipients) - work.registered)
        logger.info(
            "key epoch %d: registry sum of %d devices published (%d missing)",
            work.epoch,
            len(work.registered),
            len(missing),
        )
        self._send_raw(payload, "registry_sum", None)
        self._start_round(now)

    # --- handlers -------------------------------------------------------------

    def _current_epoch(self, epoch: int) -> EpochWork:
        work = self._epoch
        if work is None or epoch != work.epoch:
            current = None if work is None else work.epoch
            raise RejectedError(
                ErrorCode.WRONG_EPOCH, f"key epoch {epoch} is not current ({current})"
            )
        return work

    def _on_agent_public_key(self, message: AgentPublicKey) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._current_epoch(message.epoch)
        if device != work.agent:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the epoch's agent sends keys"
            )
        if work.public_key is not None:
            if work.public_key.to_bytes() != message.public_key:
                raise RejectedError(
                    ErrorCode.UNAUTHORISED, "the epoch key is already set"
                )
            logger.info("duplicate public key of epoch %d ignored", work.epoch)
            return
        try:
            public_key = PaillierPublicKey.from_bytes(message.public_key)
        except CryptoError as exc:
            raise RejectedError(
                ErrorCode.BAD_CIPHERTEXT, f"bad public key: {exc}"
            ) from None
        if public_key.key_bits != self._config.key_bits:
            raise RejectedError(
                ErrorCode.BAD_CIPHERTEXT,
                f"public key has {public_key.key_bits} bits, "
                f"not {self._config.key_bits}",
            )
        try:
            verify_signature(
                self._enrolled[device], signing_bytes(message), message.signature
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
        payload = encode(message)
        work.public_key = public_key
        work.public_key_msg = payload
        self._store.set_public_key(work.epoch, payload)
        self._send_raw(payload, "agent_public_key", None)

    def _on_sealed_secret_key(self, message: SealedSecretKey) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._current_epoch(message.epoch)
        if device != work.agent:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the epoch's agent seals keys"
            )
        if message.recipient not in work.recipients:
            raise RejectedError(
                ErrorCode.UNAUTHORISED,
                f"{message.recipient} is not a recipient of epoch {work.epoch}",
            )
        self._send_raw(encode(message), "sealed_secret_key", message.recipient)

    def _on_registration(self, message: Registration) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._current_epoch(message.epoch)
        if device not in work.recipients:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not a member of key epoch {work.epoch}"
            )
        if device in work.registered:
            logger.info("duplicate registration of %s ignored", device)
            return
        if self._state.stage is not Stage.REGISTRATION or work.public_key is None:
            raise RejectedError(ErrorCode.LATE, "registration is closed")
        registry = self._config.registry
        length = Codebook(registry.num_classes, registry.groups).length
        try:
            vector = encrypted_vector_from(
                message.registry, work.public_key, num_parties=1
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        if vector.length != length:
            raise RejectedError(
                ErrorCode.BAD_CIPHERTEXT,
                f"registry has {vector.length} slots, the codebook {length}",
            )
        if work.running_sum is None:
            total = vector
        else:
            total = add_encrypted(work.public_key, work.running_sum, vector)
        self._store.add_registration(
            work.epoch, device, total.to_bytes(work.public_key)
        )
        work.running_sum = total
        work.registered.add(device)
