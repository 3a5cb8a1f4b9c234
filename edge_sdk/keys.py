"""Enrolment and the Paillier key epoch, the device's infrastructure.

Every method that sums under encryption (Dubhe, CLIMB, FedDisk) uses the
epoch's keys through `DeviceContext.keys`; none owns them. The steps follow
Dubhe Fig. 4 (left half):

Pin the coordinator identity from `EnrolResult.coordinator_keys` (checked
against its operator certificate under ``[trust]``, and against the
configured fingerprint if set); adopt a signed `KeyEpochStart`, taking the
agent's identity from its `agent_keys` (covered by the coordinator's
signature, and certified by the operator under ``[trust]``), and compute
the registry slot from the local label histogram (Algorithm 1, never sent).
The agent generates the Paillier key, stores its secret key (0600) before
publishing the signed public key, and seals the secret key to every
recipient the operator certified, bound to federation and epoch, page by
page as the coordinator's `SealRequest` pages arrive (each page's boxes go
back in one `SealedKeys`). The others verify the public key's signature and
open their box, checking the secret key matches the public key.
"""

from __future__ import annotations

import logging
import time

from ursa.crypto.certificate import Role
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.paillier import (
    MIN_SECURE_KEY_BITS,
    PaillierPublicKey,
    PaillierSecretKey,
    generate_keypair,
)
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.device_core import DeviceCore, seal_context
from ursa.edge_sdk.registration import registry_indices
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import encode
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    EnrolResult,
    ErrorCode,
    ErrorReply,
    IdentityKeys,
    KeyEpochStart,
    SealedBox,
    SealedKeys,
    SealedSecretKey,
    SealRequest,
    split_boxes,
)
from ursa.protocol.router import NotReadyError
from ursa.protocol.untrusted_text import escape

__all__ = ["EpochSteps"]

logger = logging.getLogger("ursa.edge_sdk")


def _coordinator_keys(message: EnrolResult) -> IdentityKeys:
    """The coordinator keys an acceptance carries."""
    if message.coordinator_keys is None:
        raise ValueError("enrolment accepted without the coordinator's keys")
    return message.coordinator_keys


HELLO_RETRY_S = 10.0
"""A Hello unanswered this long is sent again (then 2x, 4x, ... the wait)."""
HELLO_RETRY_MAX_S = 300.0
"""The longest wait between two Hellos."""


class EpochSteps(DeviceCore):
    """Handlers of enrolment and key-epoch messages."""

    def _retry_hello(self, now: float) -> None:
        """Say hello again, with backoff, while no EnrolResult answered the last.

        A coordinator killed after it enrolled us but before its reply left
        has our Hello marked seen and counts us as enrolled; without a new
        Hello we would wait for its answer forever, and it would wait for us
        in every key epoch (issue 14). A coordinator that enrolled us already
        simply answers again.
        """
        if not self._hello_unanswered:
            self._hello_retry_at = self._hello_backoff_s = None
            return
        if self._hello_retry_at is None:
            self._hello_retry_at = now + (self._hello_backoff_s or HELLO_RETRY_S)
            return
        if now < self._hello_retry_at:
            return
        backoff = min(2 * (self._hello_backoff_s or HELLO_RETRY_S), HELLO_RETRY_MAX_S)
        self._hello_backoff_s, self._hello_retry_at = backoff, None
        logger.warning(
            "%s: no answer to hello from the coordinator; saying hello again",
            self.device_id,
        )
        self._send_hello()

    def _on_enrol_result(self, message: EnrolResult) -> None:
        if message.device_id != self.device_id:
            return
        self._hello_unanswered = False
        if not message.accepted:
            reason = escape(message.reason)
            logger.error("%s: enrolment refused: %s", self.device_id, reason)
            return
        identity = self._trusted(_coordinator_keys(message), Role.COORDINATOR)
        pin = self._config.coordinator_fingerprint
        if identity.device_id != COORDINATOR:
            raise ValueError("coordinator identity has the wrong id")
        if pin is not None and identity.fingerprint() != pin:
            self._refuse_coordinator(message, identity, pin, "configured pin")
            return
        known = self._coordinator
        if known is not None and known != identity:
            self._refuse_coordinator(message, identity, known.fingerprint(), "pinned")
            return
        self._verify(identity, message)  # the anchor of the run: signed by the pin
        if self._coordinator is None:
            self._store.save_coordinator(identity)
            self._coordinator = identity
        self._membership.enter(message.run, self._store, self._forget_run_state)
        self.enrolled.set()
        logger.info("%s: enrolled (run %s)", self.device_id, message.run)

    def _refuse_coordinator(
        self,
        message: EnrolResult,
        identity: DevicePublicIdentity,
        pinned: str,
        where: str,
    ) -> None:
        """Refuse a coordinator with another identity, loudly, on both sides.

        A replaced coordinator (a new state dir, a lost identity key) must not
        be trusted silently, and must not be left guessing either: the device
        logs one ERROR with the remedy and tells the coordinator why.
        """
        fingerprint = identity.fingerprint()
        reason = f"coordinator identity {fingerprint} is not the {where} {pinned}"
        if fingerprint not in self._refused_coordinators:  # one ERROR, every reply
            self._refused_coordinators.add(fingerprint)
            self._log_refusal(reason)
        self._tell_coordinator(
            ErrorCode.COORDINATOR_IDENTITY_MISMATCH,
            reason,
            round_index=message.round,
            message_id=derived_id(self.device_id, "identity", message.message_id),
            in_reply_to=message.message_id,
            run=message.run,
            named=message,  # signed, with its digest: it can start a key epoch
        )

    def _log_refusal(self, reason: str) -> None:
        logger.error(
            "%s: refusing the coordinator: %s. If it was replaced on purpose, run "
            "`ursa device repin --config <device config>` (and update "
            "coordinator_fingerprint if set); else restore the coordinator's "
            "identity.key from its backup",
            self.device_id,
            reason,
        )

    def _on_error(self, message: ErrorReply) -> None:
        logger.warning(
            "%s: coordinator refused a message: %s: %s",
            self.device_id,
            message.code,
            escape(message.reason),
        )
        if message.code in (ErrorCode.UNKNOWN_DEVICE, ErrorCode.WRONG_RUN):
            # our hello preceded the coordinator, or it was reset (a new run):
            # a hello gets the signed EnrolResult that names its run
            self.enrolled.clear()
            self._send_hello()

    def _on_key_epoch_start(self, message: KeyEpochStart) -> None:
        if self._coordinator is None:
            raise NotReadyError
        self._verify(self._coordinator, message)
        if self._epoch is not None and message.epoch <= self._epoch.epoch:
            return
        if set(message.methods) != set(self.methods()):
            self._refuse_methods(message)
            return
        if (
            message.key_bits < MIN_SECURE_KEY_BITS
            and not self._config.insecure_test_keys
        ):
            self._refuse_weak_keys(message)
            return
        agent = self._trusted(message.agent_keys)  # the sealed key's sender
        if message.agent == self.device_id and agent != self._identity.public():
            raise ValueError("the epoch names this device with other identity keys")
        self._adopt_epoch(message, encode(message), persist=True)

    def _refuse_methods(self, notice: KeyEpochStart) -> None:
        """Tell the coordinator (and the log) why this device sits the epoch out."""
        reason = (
            f"federation runs {', '.join(notice.methods)}; "
            f"device is configured for {', '.join(self.methods())}"
        )
        logger.error(
            "%s: refusing key epoch %d: %s", self.device_id, notice.epoch, reason
        )
        self._refuse_epoch(notice, ErrorCode.METHOD_MISMATCH, reason)

    def _refuse_weak_keys(self, notice: KeyEpochStart) -> None:
        """Sit out an epoch whose Paillier modulus could be factored."""
        reason = (
            f"key epoch {notice.epoch} uses {notice.key_bits}-bit Paillier keys; "
            f"this device accepts {MIN_SECURE_KEY_BITS} or more (insecure_test_keys "
            "= true in its config for tests only)"
        )
        logger.error("%s: sitting out: %s", self.device_id, reason)
        self._refuse_epoch(notice, ErrorCode.INSECURE_PARAMETERS, reason)

    def _refuse_epoch(
        self, notice: KeyEpochStart, code: ErrorCode, reason: str
    ) -> None:
        """Answer ``code`` to the epoch's notice: the coordinator leaves us out."""
        self._tell_coordinator(
            code,
            reason,
            round_index=notice.round,
            message_id=derived_id(self.device_id, str(code), notice.epoch),
            in_reply_to=notice.message_id,
        )

    def _adopt_epoch(
        self, notice: KeyEpochStart, payload: bytes, *, persist: bool
    ) -> None:
        agent = notice.agent_keys.public_identity()  # checked on arrival
        if self._pool is not None:
            self._pool.close()
        self._epoch, self._epoch_payload, self._agent = notice, payload, agent
        self._public_key = self._secret_key = self._pool = None
        self._registry = None
        codebook = Codebook(notice.num_classes, notice.groups)
        distribution = self._distribution(notice.num_classes)
        problems = self._fit_problems(notice.num_classes)
        if problems or distribution is None:
            self._sit_out(notice.epoch, notice.round, problems, notice.message_id)
        else:
            thresholds = dict(zip(notice.groups, notice.sigma, strict=True))
            indices = registry_indices(distribution[None, :], codebook, thresholds)
            self._index = int(indices[0])
        if persist:
            self._save_epoch()
        logger.info(
            "%s: key epoch %d (agent %s)", self.device_id, notice.epoch, notice.agent
        )

    def _on_seal_request(self, message: SealRequest) -> None:
        """Seal the key to one page of recipients; their boxes go back together.

        The first page makes the key pair (stored before the public key goes
        out). Every page re-sends the signed public key (the same message id:
        the coordinator drops the copies) so a coordinator that lost it gets it
        back. Pages come a few at a time, so memory holds one page's boxes
        whatever the fleet's size; a page asked for again is sealed again.
        """
        epoch = self._require_epoch(message.epoch)
        if epoch.agent != self.device_id:
            raise ValueError("seal request, but this device is not the agent")
        started = time.perf_counter()
        if self._secret_key is None:
            public_key, secret_key = generate_keypair(epoch.key_bits)
            self._store.save_secret_key(epoch.epoch, secret_key)
            self._secret_key = secret_key
            self._set_public_key(public_key)
            self._save_epoch()
        secret_key = self._secret_key
        announce = AgentPublicKey(
            federation=self._config.federation,
            round=0,
            sender=self.device_id,
            message_id=derived_id(self.device_id, "public-key", epoch.epoch),
            epoch=epoch.epoch,
            public_key=secret_key.public_key.to_bytes(),
        )
        self._send(self._signed(announce))
        context = seal_context(self._config.federation, epoch.epoch)
        boxes = self._seal_page(message, context, secret_key.secret_to_bytes())
        for part, chunk in enumerate(split_boxes(boxes)):
            self._send(
                SealedKeys(
                    federation=self._config.federation,
                    round=0,
                    sender=self.device_id,
                    # a copy of this request (QoS 1) repeats the id, a new one not
                    message_id=derived_id(
                        self.device_id, "boxes", epoch.epoch, message.message_id, part
                    ),
                    epoch=epoch.epoch,
                    page=message.page,
                    boxes=chunk,
                )
            )
        self.stats.crypto_s += time.perf_counter() - started
        last = message.page + 1 == message.pages
        logger.log(
            logging.INFO if last or message.page % 10 == 0 else logging.DEBUG,
            "%s: agent of epoch %d; key sealed to %d devices (page %d of %d)",
            self.device_id,
            epoch.epoch,
            len(boxes),
            message.page + 1,
            message.pages,
        )
        self._maybe_register(resend=False)

    def _seal_page(
        self, message: SealRequest, context: bytes, plaintext: bytes
    ) -> list[SealedBox]:
        """A box per recipient but this device; one with bad keys is skipped.

        A recipient the operator did not certify is refused (it could be the
        coordinator's own key, and the box the epoch's secret key).
        """
        boxes: list[SealedBox] = []
        for keys in message.recipients:
            if keys.device_id == self.device_id:
                continue
            try:
                box = seal(self._identity, self._trusted(keys), context, plaintext)
            except UntrustedIdentityError as exc:
                self._refuse_untrusted(message, exc)
                continue
            except CryptoError as exc:
                logger.warning(
                    "%s: cannot seal the key to %s: %s",
                    self.device_id,
                    keys.device_id,
                    exc,
                )
                continue
            boxes.append(SealedBox(recipient=keys.device_id, box=box))
        return boxes

    def _on_agent_public_key(self, message: AgentPublicKey) -> None:
        epoch = self._require_epoch(message.epoch)
        if self._agent is None:
            raise NotReadyError
        if message.sender != epoch.agent:
            raise ValueError(f"public key from {message.sender}, not the agent")
        self._verify(self._agent, message)
        public_key = PaillierPublicKey.from_bytes(message.public_key)
        if public_key.key_bits != epoch.key_bits:
            raise ValueError(
                f"public key of {public_key.key_bits} bits, not {epoch.key_bits}"
            )
        if self._public_key is not None:
            if self._public_key != public_key:
                raise ValueError("a different public key for the same epoch")
            self._maybe_register(resend=self._registry is None)
            return
        self._set_public_key(public_key)
        self._save_epoch()
        self._maybe_register(resend=False)

    def _on_sealed_secret_key(self, message: SealedSecretKey) -> None:
        epoch = self._require_epoch(message.epoch)
        if message.recipient != self.device_id:
            return
        if self._secret_key is not None:
            return
        if self._agent is None or self._public_key is None:
            raise NotReadyError
        started = time.perf_counter()
        context = seal_context(self._config.federation, epoch.epoch)
        plaintext = open_sealed(self._identity, self._agent, context, message.box)
        secret_key = PaillierSecretKey.secret_from_bytes(plaintext)
        self.stats.crypto_s += time.perf_counter() - started
        if secret_key.public_key != self._public_key:
            raise ValueError("the sealed secret key does not match the public key")
        self._store.save_secret_key(epoch.epoch, secret_key)
        self._secret_key = secret_key
        self._maybe_register(resend=False)
