"""`DeviceKeyEpochs`: the device's part in a Paillier key epoch, and its registration.

Every method that sums under encryption (Dubhe, CLIMB, FedDisk) uses the
epoch's keys through `DeviceContext.keys`; none owns them. The steps follow
Dubhe Fig. 4 (left half):

Adopt a signed `KeyEpochStart`, taking the agent's identity from its
`agent_keys` (covered by the coordinator's signature, and certified by the
operator under ``[trust]``), check the labels against its ``num_classes``
and the trainer's model against its ``model_spec`` (`ursa.edge_sdk.model_fit`:
a device that does not fit sits the epoch out, `sit_out`), and compute the
registry slot from the local label histogram (Algorithm 1, never sent).
The agent generates the Paillier key, stores its secret key (0600) before
publishing the signed public key, and seals the secret key to every
recipient the operator certified, bound to federation and epoch, page by
page as the coordinator's `SealRequest` pages arrive (each page's boxes go
back in one `SealedKeys`). The others verify the public key's signature and
open their box, checking the secret key matches the public key.

Register: encrypt the one-hot registry with the epoch key (pooled
obfuscators). Decrypt the overall registry and check that it sums to its
party count (else refuse it: someone registered a malformed vector); as the
agent, name the registrations of a `RegistryCheck` page that are not
one-hot. The registry is the epoch's roster; Dubhe's round steps draw from
it. Everything is kept in the `KeyEpochView` this part owns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import (
    MIN_SECURE_KEY_BITS,
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_vector,
    encrypt_vector,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.data_check import DataProblem, reason_of
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.epoch_view import CurrentEpoch, KeyEpochView
from ursa.edge_sdk.local_dataset import LocalDataset
from ursa.edge_sdk.model_fit import spec_problems
from ursa.edge_sdk.registration import is_one_hot, registry_indices, registry_vector
from ursa.edge_sdk.state_dir import StoredEpoch
from ursa.edge_sdk.stats import DeviceStats
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import decode, encode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    AgentPublicKey,
    ErrorCode,
    KeyEpochStart,
    Registration,
    RegistryCheck,
    RegistrySum,
    RegistryVerdict,
    SealedBox,
    SealedKeys,
    SealedSecretKey,
    SealRequest,
    split_boxes,
)
from ursa.protocol.router import NotReadyError, Router

__all__ = ["DeviceKeyEpochs", "seal_context"]

logger = logging.getLogger("ursa.edge_sdk")


def seal_context(federation: str, epoch: int) -> bytes:
    """What a sealed epoch key is bound to (federation and key epoch)."""
    return f"ursa-epoch-key|{federation}|{epoch}".encode()


class DeviceKeyEpochs:
    """The key epochs this device takes part in (see the module docstring).

    Args:
        link: The device on the wire (identity, store, pinned coordinator).
        data: The labels the registry slot is computed from.
        stats: Where crypto seconds are counted.
        method_names: The methods this device runs (the epoch must sign them).
        registration_key: The methods' key for an epoch's registration.
        model_problems: How the last global model did not fit (a device
            that cannot train it sits the next epoch out too).
        settle_data: Called once, at the first signed epoch, before the
            device registers: a balancing method's run is over, its data
            becomes the device's.
    """

    def __init__(
        self,
        *,
        link: DeviceLink,
        data: LocalDataset,
        stats: DeviceStats,
        method_names: Callable[[], tuple[str, ...]],
        registration_key: Callable[[int], bytes | None],
        model_problems: Callable[[], tuple[DataProblem, ...]],
        settle_data: Callable[[], None],
    ) -> None:
        self._link = link
        self._data = data
        self._stats = stats
        self._method_names = method_names
        self._registration_key = registration_key
        self._model_problems = model_problems
        self._settle_data: Callable[[], None] | None = settle_data
        self._view = KeyEpochView()

    @property
    def view(self) -> CurrentEpoch:
        """The current epoch, read-only."""
        return self._view

    def register(self, router: Router) -> None:
        """The key epoch's kinds (its keys, its registry) on the device's router."""
        router.register(KeyEpochStart, self.on_key_epoch_start, owner="key_epoch")
        router.register(SealRequest, self.on_seal_request, owner="key_epoch")
        router.register(AgentPublicKey, self.on_agent_public_key, owner="key_epoch")
        router.register(SealedSecretKey, self.on_sealed_secret_key, owner="key_epoch")
        router.register(RegistrySum, self.on_registry_sum, owner="key_epoch")
        router.register(RegistryCheck, self.on_registry_check, owner="key_epoch")

    def new_run(self) -> None:
        """The old run's epoch, keys and registry go."""
        self._view.clear()

    def close(self) -> None:
        """Forget unused obfuscators (the device stops)."""
        if self._view.pool is not None:
            self._view.pool.close()

    def restore(self) -> None:
        """Reload the last key epoch (and its keys) from the state dir."""
        store = self._link.store
        stored = store.load_epoch()
        if stored is None:
            return
        try:
            notice = decode(stored.notice)
        except ProtocolError as exc:
            # e.g. an epoch saved by an older version (no agent_keys): wait for
            # the coordinator's next notice instead of failing to start
            logger.warning("ignoring the stored key epoch: %s", exc)
            return
        if not isinstance(notice, KeyEpochStart):
            return
        self._adopt(notice, stored.notice, persist=False)
        if stored.agent is not None:
            self._view.agent = DevicePublicIdentity.from_bytes(stored.agent)
        if stored.public_key is not None:
            self._set_public_key(PaillierPublicKey.from_bytes(stored.public_key))
        self._view.secret_key = store.load_secret_key(notice.epoch)

    # --- the epoch ------------------------------------------------------------

    def on_key_epoch_start(self, message: KeyEpochStart) -> None:
        """Adopt a newer signed epoch, unless it runs other methods or weak keys."""
        self._link.verify_coordinator(message)
        settle, self._settle_data = self._settle_data, None
        if settle is not None:
            settle()
        current = self._view.notice
        if current is not None and message.epoch <= current.epoch:
            return
        if set(message.methods) != set(self._method_names()):
            self._refuse_methods(message)
            return
        if (
            message.key_bits < MIN_SECURE_KEY_BITS
            and not self._link.config.insecure_test_keys
        ):
            self._refuse_weak_keys(message)
            return
        agent = self._link.trusted(message.agent_keys)  # the sealed key's sender
        me = self._link.device_id
        if message.agent == me and agent != self._link.identity.public():
            raise ValueError("the epoch names this device with other identity keys")
        self._adopt(message, encode(message), persist=True)

    def _refuse_methods(self, notice: KeyEpochStart) -> None:
        """Tell the coordinator (and the log) why this device sits the epoch out."""
        reason = (
            f"federation runs {', '.join(notice.methods)}; "
            f"device is configured for {', '.join(self._method_names())}"
        )
        logger.error(
            "%s: refusing key epoch %d: %s", self._link.device_id, notice.epoch, reason
        )
        self._refuse_epoch(notice, ErrorCode.METHOD_MISMATCH, reason)

    def _refuse_weak_keys(self, notice: KeyEpochStart) -> None:
        """Sit out an epoch whose Paillier modulus could be factored."""
        reason = (
            f"key epoch {notice.epoch} uses {notice.key_bits}-bit Paillier keys; "
            f"this device accepts {MIN_SECURE_KEY_BITS} or more (insecure_test_keys "
            "= true in its config for tests only)"
        )
        logger.error("%s: sitting out: %s", self._link.device_id, reason)
        self._refuse_epoch(notice, ErrorCode.INSECURE_PARAMETERS, reason)

    def _refuse_epoch(
        self, notice: KeyEpochStart, code: ErrorCode, reason: str
    ) -> None:
        """Answer ``code`` to the epoch's notice: the coordinator leaves us out."""
        self._link.tell_coordinator(
            code,
            reason,
            round_index=notice.round,
            message_id=derived_id(self._link.device_id, str(code), notice.epoch),
            in_reply_to=notice.message_id,
        )

    def _adopt(self, notice: KeyEpochStart, payload: bytes, *, persist: bool) -> None:
        agent = notice.agent_keys.public_identity()  # checked on arrival
        self._view.adopt(notice, payload, agent)
        codebook = Codebook(notice.num_classes, notice.groups)
        distribution = self._data.distribution(notice.num_classes)
        data = self._data
        fit = spec_problems(data.model_trainer, notice.model_spec, data.labels)
        if fit is None:  # no signed spec of our model: the last download's verdict
            fit = self._model_problems()
        problems = (*data.problems(notice.num_classes), *fit)
        if problems or distribution is None:
            self.sit_out(notice.round, problems, notice.message_id)
        else:
            thresholds = dict(zip(notice.groups, notice.sigma, strict=True))
            indices = registry_indices(distribution[None, :], codebook, thresholds)
            self._view.index = int(indices[0])
        if persist:
            self._save()
        logger.info(
            "%s: key epoch %d (agent %s)",
            self._link.device_id,
            notice.epoch,
            notice.agent,
        )

    def sit_out(
        self,
        round_index: int,
        problems: tuple[DataProblem, ...],
        in_reply_to: str | None,
    ) -> None:
        """Sit the current epoch out: one ERROR, one `data_mismatch` answer.

        ``model_mismatch`` instead when every problem is the device's model.

        The device neither registers nor volunteers nor trains in the epoch
        (its slot is cleared); the coordinator excludes it from selection.
        """
        view = self._view
        if view.notice is None:
            return
        epoch = view.notice.epoch
        view.index = None
        if view.sat_out_epoch == epoch:
            return
        view.sat_out_epoch = epoch
        model = bool(problems) and all(p.model for p in problems)
        code = ErrorCode.MODEL_MISMATCH if model else ErrorCode.DATA_MISMATCH
        device = self._link.device_id
        logger.error(
            "%s: sitting out key epoch %d: %s: %s",
            device,
            epoch,
            code,
            "; ".join(str(p) for p in problems),
        )
        self._link.tell_coordinator(
            code,
            reason_of(problems),
            round_index=round_index,
            message_id=derived_id(device, "data_mismatch", epoch),
            in_reply_to=in_reply_to,
        )

    def _set_public_key(self, public_key: PaillierPublicKey) -> None:
        view = self._view
        view.public_key = public_key
        size = self._link.config.obfuscator_pool_size
        if size > 0 and view.pool is None:
            view.pool = ObfuscatorPool(public_key, size)

    def _save(self) -> None:
        view = self._view
        self._link.store.save_epoch(
            StoredEpoch(
                notice=view.payload,
                agent=None if view.agent is None else view.agent.to_bytes(),
                public_key=None
                if view.public_key is None
                else view.public_key.to_bytes(),
            )
        )

    # --- the keys -------------------------------------------------------------

    def on_seal_request(self, message: SealRequest) -> None:
        """Seal the key to one page of recipients; their boxes go back together.

        The first page makes the key pair (stored before the public key goes
        out). Every page re-sends the signed public key (the same message id:
        the coordinator drops the copies) so a coordinator that lost it gets it
        back. Pages come a few at a time, so memory holds one page's boxes
        whatever the fleet's size; a page asked for again is sealed again.
        """
        link, view = self._link, self._view
        epoch = view.require(message.epoch)
        me = link.device_id
        if epoch.agent != me:
            raise ValueError("seal request, but this device is not the agent")
        started = time.perf_counter()
        if view.secret_key is None:
            public_key, secret_key = generate_keypair(epoch.key_bits)
            link.store.save_secret_key(epoch.epoch, secret_key)
            view.secret_key = secret_key
            self._set_public_key(public_key)
            self._save()
        secret_key = view.secret_key
        announce = AgentPublicKey(
            federation=link.federation,
            round=0,
            sender=me,
            message_id=derived_id(me, "public-key", epoch.epoch),
            epoch=epoch.epoch,
            public_key=secret_key.public_key.to_bytes(),
        )
        link.send(link.signed(announce))
        context = seal_context(link.federation, epoch.epoch)
        boxes = self._seal_page(message, context, secret_key.secret_to_bytes())
        for part, chunk in enumerate(split_boxes(boxes)):
            link.send(
                SealedKeys(
                    federation=link.federation,
                    round=0,
                    sender=me,
                    # a copy of this request (QoS 1) repeats the id, a new one not
                    message_id=derived_id(
                        me, "boxes", epoch.epoch, message.message_id, part
                    ),
                    epoch=epoch.epoch,
                    page=message.page,
                    boxes=chunk,
                )
            )
        self._stats.crypto_s += time.perf_counter() - started
        last = message.page + 1 == message.pages
        logger.log(
            logging.INFO if last or message.page % 10 == 0 else logging.DEBUG,
            "%s: agent of epoch %d; key sealed to %d devices (page %d of %d)",
            me,
            epoch.epoch,
            len(boxes),
            message.page + 1,
            message.pages,
        )
        self.maybe_register(resend=False)

    def _seal_page(
        self, message: SealRequest, context: bytes, plaintext: bytes
    ) -> list[SealedBox]:
        """A box per recipient but this device; one with bad keys is skipped.

        A recipient the operator did not certify is refused (it could be the
        coordinator's own key, and the box the epoch's secret key).
        """
        link = self._link
        boxes: list[SealedBox] = []
        for keys in message.recipients:
            if keys.device_id == link.device_id:
                continue
            try:
                box = seal(link.identity, link.trusted(keys), context, plaintext)
            except UntrustedIdentityError as exc:
                link.refuse_untrusted(message, exc)
                continue
            except CryptoError as exc:
                logger.warning(
                    "%s: cannot seal the key to %s: %s",
                    link.device_id,
                    keys.device_id,
                    exc,
                )
                continue
            boxes.append(SealedBox(recipient=keys.device_id, box=box))
        return boxes

    def on_agent_public_key(self, message: AgentPublicKey) -> None:
        """The agent's signed public key: kept, then this device registers."""
        view = self._view
        epoch = view.require(message.epoch)
        if view.agent is None:
            raise NotReadyError
        if message.sender != epoch.agent:
            raise ValueError(f"public key from {message.sender}, not the agent")
        self._link.verify(view.agent, message)
        public_key = PaillierPublicKey.from_bytes(message.public_key)
        if public_key.key_bits != epoch.key_bits:
            raise ValueError(
                f"public key of {public_key.key_bits} bits, not {epoch.key_bits}"
            )
        if view.public_key is not None:
            if view.public_key != public_key:
                raise ValueError("a different public key for the same epoch")
            self.maybe_register(resend=view.registry is None)
            return
        self._set_public_key(public_key)
        self._save()
        self.maybe_register(resend=False)

    def on_sealed_secret_key(self, message: SealedSecretKey) -> None:
        """This device's box of the epoch's secret key, opened and checked."""
        link, view = self._link, self._view
        epoch = view.require(message.epoch)
        if message.recipient != link.device_id or view.secret_key is not None:
            return
        if view.agent is None or view.public_key is None:
            raise NotReadyError
        started = time.perf_counter()
        context = seal_context(link.federation, epoch.epoch)
        plaintext = open_sealed(link.identity, view.agent, context, message.box)
        secret_key = PaillierSecretKey.secret_from_bytes(plaintext)
        self._stats.crypto_s += time.perf_counter() - started
        if secret_key.public_key != view.public_key:
            raise ValueError("the sealed secret key does not match the public key")
        link.store.save_secret_key(epoch.epoch, secret_key)
        view.secret_key = secret_key
        self.maybe_register(resend=False)

    # --- the registry ---------------------------------------------------------

    def maybe_register(self, *, resend: bool) -> None:
        """Send the encrypted registry once the key is known (again if `resend`)."""
        view, link = self._view, self._link
        epoch, public_key = view.notice, view.public_key
        if epoch is None or public_key is None or view.secret_key is None:
            return
        if view.index is None or (view.registered_epoch == epoch.epoch and not resend):
            return
        started = time.perf_counter()
        codebook = Codebook(epoch.num_classes, epoch.groups)
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        vector = encrypt_vector(
            public_key,
            layout,
            registry_vector(view.index, codebook).tolist(),
            obfuscators=view.pool,
        )
        self._stats.crypto_s += time.perf_counter() - started
        me = link.device_id
        link.send(
            Registration(
                federation=link.federation,
                round=0,
                sender=me,
                message_id=derived_id(me, "registration", epoch.epoch),
                epoch=epoch.epoch,
                registry=vector.to_bytes(public_key),
                rank_key=self._registration_key(epoch.epoch),
            )
        )
        view.registered_epoch = epoch.epoch

    def on_registry_check(self, message: RegistryCheck) -> None:
        """As agent: name the page's registrations that are not one-hot, signed.

        The entries come shuffled and without device ids; a registration of,
        say, +5 on one slot and -1 on four others adds up like an honest one,
        so only a look at each one finds it.
        """
        link = self._link
        epoch = self._view.require(message.epoch)
        secret_key = self._view.secret_key
        if epoch.agent != link.device_id or secret_key is None:
            raise ValueError("registry check, but this device is not the agent")
        started = time.perf_counter()
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        length = Codebook(epoch.num_classes, epoch.groups).length
        bad = tuple(
            j
            for j, blob in enumerate(message.registries)
            if not _one_hot(secret_key, layout, length, blob)
        )
        self._stats.crypto_s += time.perf_counter() - started
        if bad:
            logger.warning(
                "%s: %d of %d registrations on page %d are not one-hot",
                link.device_id,
                len(bad),
                len(message.registries),
                message.page,
            )
        verdict = RegistryVerdict(
            federation=link.federation,
            round=0,
            sender=link.device_id,
            message_id=derived_id(
                link.device_id, "registry_verdict", epoch.epoch, message.message_id
            ),
            epoch=epoch.epoch,
            page=message.page,
            entries=len(message.registries),
            bad=bad,
        )
        link.send(link.signed(verdict))

    def on_registry_sum(self, message: RegistrySum) -> None:
        """Decrypt the overall registry; refuse one that does not add up."""
        view = self._view
        epoch = view.require(message.epoch)
        if view.registry is not None:
            return
        if view.secret_key is None or view.public_key is None:
            raise NotReadyError
        started = time.perf_counter()
        vector = encrypted_vector_from(message.registry_sum, view.public_key)
        if vector.num_parties != message.num_parties:
            raise ValueError("registry sum: party count differs from its header")
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        registry = np.asarray(
            decrypt_vector(view.secret_key, layout, vector), dtype=np.int64
        )
        self._stats.crypto_s += time.perf_counter() - started
        device = self._link.device_id
        if int(registry.sum()) != message.num_parties:
            logger.error(
                "%s: registry sum of epoch %d does not add up to its %d parties; "
                "refusing it (a device registered a malformed registry)",
                device,
                epoch.epoch,
                message.num_parties,
            )
            return
        view.registry = registry
        logger.info("%s: registry of %d devices decrypted", device, message.num_parties)


def _one_hot(
    secret_key: PaillierSecretKey, layout: PackingLayout, length: int, blob: bytes
) -> bool:
    """Whether one registration decrypts to a one-hot registry of `length` slots."""
    try:
        vector = encrypted_vector_from(blob, secret_key.public_key, num_parties=1)
        if vector.length != length:
            return False
        return is_one_hot(decrypt_vector(secret_key, layout, vector))
    except CryptoError:
        return False
