"""Device steps of registration and rounds (Dubhe Fig. 3-5, device side).

Register: encrypt the one-hot registry with the epoch key (pooled
obfuscators). Decrypt the overall registry and check that it sums to its
party count (else refuse it: someone registered a malformed vector). On a
`RoundAnnounce`: H coins with eq. (6)'s probability, persisted per round so a
re-announce gets the same answer. On a `TryAssignment`: the encrypted label
distribution (packed fixed point). The agent decrypts `TrySums` and answers
the best try, signed. A signed `SelectionResult` naming the device runs the
`Trainer` once for that round.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.paillier import (
    decrypt_real_sum,
    decrypt_vector,
    encrypt_reals,
    encrypt_vector,
    encrypted_vector_from,
)
from ursa.edge_sdk.device_core import (
    DISTRIBUTION_CODEC,
    DeviceCore,
    derived_id,
)
from ursa.edge_sdk.registration import (
    best_try,
    participation_probability,
    registry_vector,
    volunteer,
)
from ursa.edge_sdk.trainer import TrainingReport
from ursa.protocol.codebook import Codebook
from ursa.protocol.messages import (
    AgentAnswer,
    EncryptedDistribution,
    Registration,
    RegistrySum,
    RoundAnnounce,
    SelectionResult,
    TryAssignment,
    TrySums,
    Volunteer,
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
        self._send(
            Registration(
                federation=self._config.federation,
                round=0,
                sender=self.device_id,
                message_id=derived_id(self.device_id, "registration", epoch.epoch),
                epoch=epoch.epoch,
                registry=vector.to_bytes(public_key),
            )
        )
        self._registered_epoch = epoch.epoch

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

    def _on_round_announce(self, message: RoundAnnounce) -> None:
        self._require_epoch(message.epoch)
        if self._registry is None:
            raise NotReadyError
        index = self._index
        if index is None or self._registry[index] == 0:
            logger.info(
                "%s: not in epoch %d's registry; not volunteering",
                self.device_id,
                message.epoch,
            )
            return
        self._announce = message
        draws = self._store.load_draws(message.epoch, message.round)
        if draws is None or len(draws) != message.tries:
            probability = participation_probability(self._registry, index, message.k)
            draws = tuple(
                volunteer(probability, self._rng) for _ in range(message.tries)
            )
            self._store.save_draws(message.epoch, message.round, draws)
        self._send(
            Volunteer(
                federation=self._config.federation,
                round=message.round,
                sender=self.device_id,
                message_id=derived_id(
                    self.device_id, "volunteer", message.epoch, message.round
                ),
                draws=draws,
            )
        )
        self.stats.answered_rounds.append(message.round)

    def _current_round(self, round_index: int) -> RoundAnnounce:
        announce = self._announce
        if announce is None or round_index > announce.round:
            raise NotReadyError
        if round_index < announce.round:
            raise ValueError(f"round {round_index} is over")
        return announce

    def _on_try_assignment(self, message: TryAssignment) -> None:
        announce = self._current_round(message.round)
        public_key, epoch = self._public_key, self._epoch
        distribution = None if epoch is None else self._distribution(epoch.num_classes)
        if public_key is None or distribution is None:
            raise ValueError("no key, or labels that do not fit the classes")
        started = time.perf_counter()
        vector = encrypt_reals(
            public_key,
            DISTRIBUTION_CODEC,
            announce.k,
            distribution,
            obfuscators=self._pool,
        )
        self.stats.crypto_s += time.perf_counter() - started
        self._send(
            EncryptedDistribution(
                federation=self._config.federation,
                round=message.round,
                sender=self.device_id,
                message_id=derived_id(
                    self.device_id, "distribution", announce.epoch, message.round
                ),
                distribution=vector.to_bytes(public_key),
            )
        )

    def _on_try_sums(self, message: TrySums) -> None:
        announce = self._current_round(message.round)
        epoch, secret_key = self._epoch, self._secret_key
        if epoch is None or epoch.agent != self.device_id or secret_key is None:
            raise ValueError("try sums, but this device is not the agent")
        started = time.perf_counter()
        sums = []
        for blob, count in zip(message.sums, message.member_counts, strict=True):
            vector = encrypted_vector_from(blob, secret_key.public_key)
            if vector.num_parties != count:
                raise ValueError(
                    "a try sum's party count differs from its member count"
                )
            sums.append(
                decrypt_real_sum(secret_key, DISTRIBUTION_CODEC, announce.k, vector)
            )
        best = best_try(np.stack(sums), np.asarray(message.member_counts))
        self.stats.crypto_s += time.perf_counter() - started
        answer = AgentAnswer(
            federation=self._config.federation,
            round=message.round,
            sender=self.device_id,
            message_id=derived_id(
                self.device_id, "answer", announce.epoch, message.round
            ),
            best_try=best,
        )
        self._send(self._signed(answer))

    def _on_selection_result(self, message: SelectionResult) -> None:
        if self._coordinator is None:
            raise NotReadyError
        self._verify(self._coordinator, message)
        if self.device_id not in message.selected or message.round in self._trained:
            return
        self._trained.add(message.round)
        self.stats.selected_rounds.append(message.round)
        self._on_selected(message.round)

    def _on_selected(self, round_index: int) -> None:
        """Train for a round this device is selected in (model_steps overrides)."""
        report: TrainingReport = self._trainer.train(round_index)
        logger.info(
            "%s: selected in round %d; trained on %d examples",
            self.device_id,
            round_index,
            report.num_examples,
        )
