"""The agent's check that every registration is one-hot (bounded influence: selection).

When registration closes, the agent is handed the registrations on an
anonymous shuffled list (`ursa.coordinator.registry_check`, page by page)
and answers a signed verdict per page; registrations it refuses leave the
key epoch and its registry sum before the sum is published. A stalled agent
is asked again after ``agent_s``; one gone offline ends the epoch (a new
agent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.epoch_work import EpochWork
from ursa.coordinator.presence import Presence
from ursa.coordinator.registry_check import (
    RegistryCheckError,
    RegistryChecking,
    shuffle_generator,
)
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.store_slot import StoreSlot
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import encrypted_vector_from, sum_encrypted
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import ErrorCode, RegistryVerdict
from ursa.protocol.router import RejectedError, Router

__all__ = ["RegistryVerdicts"]

logger = logging.getLogger("ursa.coordinator")


class RegistryVerdicts:
    """The agent's one-hot check of a key epoch's registrations (module docstring).

    Args:
        config: The federation, the seed (the shuffle) and ``agent_s``.
        stages: The run's `RoundState` (requests carry the round).
        presence: Who is online (an agent gone ends the epoch).
        devices: The enrolled devices (the agent's identity keys).
        outgoing: The signing point and outbox.
        clock: Seconds.
        current: The working copy of the key epoch a message names (raises
            `RejectedError` when it is not current).
        new_epoch: Starts a new key epoch without the given devices.
        changed: A device left the epoch's registered set.
        store: The runtime's store (the registrations).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        stages: StageMachine,
        presence: Presence,
        devices: EnrolledDevices,
        outgoing: SigningPoint,
        clock: Clock,
        current: Callable[[int], EpochWork],
        new_epoch: Callable[[float, frozenset[str]], None],
        changed: Callable[[str], None],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._stages = stages
        self._presence = presence
        self._devices = devices
        self._outgoing = outgoing
        self._clock = clock
        self._current = current
        self._new_epoch = new_epoch
        self._changed = changed
        self._store = store

    def register(self, router: Router) -> None:
        """Route the agent's verdicts here."""
        router.register(RegistryVerdict, self._on_registry_verdict, owner="coordinator")

    def checked(self, work: EpochWork, now: float) -> bool:
        """Whether the agent checked every registration; starts the check.

        `ursa.coordinator.registry_check`. A stalled agent is asked again
        after ``agent_s``; one gone offline ends the epoch (a new agent).
        """
        check = work.check
        if check is None:
            blobs = self._store.store.registry_blobs(work.epoch)
            rng = shuffle_generator(self._config.seed, work.epoch)
            check = work.check = RegistryChecking.start(work.epoch, blobs, rng)
            logger.info(
                "key epoch %d: agent %s checks %d registrations in %d pages",
                work.epoch,
                work.agent,
                len(blobs),
                check.paging.num_pages,
            )
            self._send_registry_check(work, check, now, again=False)
            return False
        if check.is_complete:
            return True
        if work.agent not in self._presence.online:
            logger.warning(
                "key epoch %d: agent %s offline before checking the "
                "registrations; new epoch",
                work.epoch,
                work.agent,
            )
            self._new_epoch(now, frozenset({work.agent}))
        elif now - check.sent_at >= self._config.deadlines.agent_s:
            logger.warning(
                "key epoch %d: no registry verdict from agent %s for %.0f s; "
                "asking again",
                work.epoch,
                work.agent,
                now - check.sent_at,
            )
            self._send_registry_check(work, check, now, again=True)
        return False

    def _send_registry_check(
        self, work: EpochWork, check: RegistryChecking, now: float, *, again: bool
    ) -> None:
        check.sent_at = now
        federation, round_index = self._config.federation, self._stages.state.round
        for request in check.requests(federation, round_index, again=again):
            self._outgoing.send(request, work.agent)

    def _on_registry_verdict(self, message: RegistryVerdict) -> None:
        """The agent's signed verdict on one page: leave its bad entries out."""
        work = self._current(message.epoch)
        check = work.check
        if message.sender != work.agent or check is None:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the agent answers a registry check"
            )
        try:
            verify_signature(
                self._devices.identities[work.agent],
                signing_bytes(message),
                message.signature,
            )
            fresh = check.record(message.page, message.entries, message.bad)
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
        except RegistryCheckError as exc:
            raise RejectedError(ErrorCode.MALFORMED, str(exc)) from None
        if not fresh:
            return
        check.sent_at = self._clock()
        if not check.is_complete:
            self._send_registry_check(work, check, check.sent_at, again=False)
            return
        if check.excluded:
            self._exclude_registrations(work, check)

    def _exclude_registrations(self, work: EpochWork, check: RegistryChecking) -> None:
        """Take the registrations the agent refused out of the epoch and its sum."""
        public_key = work.public_key
        assert public_key is not None
        good = check.good()
        for device in check.excluded:
            work.registered.discard(device)
            self._changed(device)
        work.running_sum = (
            sum_encrypted(
                public_key,
                (
                    encrypted_vector_from(check.blobs[d], public_key, num_parties=1)
                    for d in good
                ),
            )
            if good
            else None
        )
        total = (
            None if work.running_sum is None else work.running_sum.to_bytes(public_key)
        )
        self._store.store.drop_registrations(work.epoch, sorted(check.excluded), total)
        logger.warning(
            "key epoch %d: %d registrations are not one-hot (%s); left out of the "
            "epoch and its registry sum",
            work.epoch,
            len(check.excluded),
            ", ".join(sorted(check.excluded)),
        )
