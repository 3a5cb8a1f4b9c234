"""Device steps of registration and of being selected (the key epoch's roster).

Register: encrypt the one-hot registry with the epoch key (pooled
obfuscators). Decrypt the overall registry and check that it sums to its
party count (else refuse it: someone registered a malformed vector). The
registry is the epoch's roster; Dubhe's round steps (`ursa.edge_sdk.methods.
dubhe`) draw from it. Being selected is the training rounds' (``model_steps.py``).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import (
    PaillierSecretKey,
    decrypt_vector,
    encrypt_vector,
    encrypted_vector_from,
)
from ursa.edge_sdk.device_core import DeviceCore
from ursa.edge_sdk.registration import (
    is_one_hot,
    registry_vector,
)
from ursa.protocol.codebook import Codebook
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    Registration,
    RegistryCheck,
    RegistrySum,
    RegistryVerdict,
)
from ursa.protocol.router import NotReadyError

__all__ = ["RoundSteps"]

logger = logging.getLogger("ursa.edge_sdk")


class RoundSteps(DeviceCore):
    """Handlers of registration and round messages."""

    def _maybe_register(self, *, resend: bool) -> None:
        """Send the encrypted registry once the key is known (again if `resend`)."""
        epoch, public_key = self._epoch, self._public_key
        if epoch is None or public_key is None or self._secret_key is None:
            return
        if self._index is None or (
            self._registered_epoch == epoch.epoch and not resend
        ):
            return
        started = time.perf_counter()
        codebook = Codebook(epoch.num_classes, epoch.groups)
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        vector = encrypt_vector(
            public_key,
            layout,
            registry_vector(self._index, codebook).tolist(),
            obfuscators=self._pool,
        )
        self.stats.crypto_s += time.perf_counter() - started
        rank_key = self._registration_key(epoch.epoch)
        self._send(
            Registration(
                federation=self._config.federation,
                round=0,
                sender=self.device_id,
                message_id=derived_id(self.device_id, "registration", epoch.epoch),
                epoch=epoch.epoch,
                registry=vector.to_bytes(public_key),
                rank_key=rank_key,
            )
        )
        self._registered_epoch = epoch.epoch

    def _on_registry_check(self, message: RegistryCheck) -> None:
        """As agent: name the page's registrations that are not one-hot, signed.

        The entries come shuffled and without device ids; a registration of,
        say, +5 on one slot and -1 on four others adds up like an honest one,
        so only a look at each one finds it.
        """
        epoch = self._require_epoch(message.epoch)
        secret_key = self._secret_key
        if epoch.agent != self.device_id or secret_key is None:
            raise ValueError("registry check, but this device is not the agent")
        started = time.perf_counter()
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        length = Codebook(epoch.num_classes, epoch.groups).length
        bad = tuple(
            j
            for j, blob in enumerate(message.registries)
            if not _one_hot(secret_key, layout, length, blob)
        )
        self.stats.crypto_s += time.perf_counter() - started
        if bad:
            logger.warning(
                "%s: %d of %d registrations on page %d are not one-hot",
                self.device_id,
                len(bad),
                len(message.registries),
                message.page,
            )
        verdict = RegistryVerdict(
            federation=self._config.federation,
            round=0,
            sender=self.device_id,
            message_id=derived_id(
                self.device_id, "registry_verdict", epoch.epoch, message.message_id
            ),
            epoch=epoch.epoch,
            page=message.page,
            entries=len(message.registries),
            bad=bad,
        )
        self._send(self._signed(verdict))

    def _on_registry_sum(self, message: RegistrySum) -> None:
        epoch = self._require_epoch(message.epoch)
        if self._registry is not None:
            return
        if self._secret_key is None or self._public_key is None:
            raise NotReadyError
        started = time.perf_counter()
        vector = encrypted_vector_from(message.registry_sum, self._public_key)
        if vector.num_parties != message.num_parties:
            raise ValueError("registry sum: party count differs from its header")
        layout = PackingLayout(1, epoch.max_parties, epoch.key_bits)
        registry = np.asarray(
            decrypt_vector(self._secret_key, layout, vector), dtype=np.int64
        )
        self.stats.crypto_s += time.perf_counter() - started
        if int(registry.sum()) != message.num_parties:
            logger.error(
                "%s: registry sum of epoch %d does not add up to its %d parties; "
                "refusing it (a device registered a malformed registry)",
                self.device_id,
                epoch.epoch,
                message.num_parties,
            )
            return
        self._registry = registry
        logger.info(
            "%s: registry of %d devices decrypted", self.device_id, message.num_parties
        )


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
