"""The agent's key: its public half relayed, its secret sealed to every recipient.

The agent's signed `AgentPublicKey` is verified and relayed (retained); the
agent gets the recipients' keys in `SealRequest` pages
(`ursa.coordinator.seal_pages`: a few pages at a time, the next as the boxes
of one come back); the boxes of each page come back in `SealedKeys` and each
is relayed to its recipient unopened, as a `SealedSecretKey` (the
coordinator cannot open it), once. An agent whose sealing stalls for
``agent_s`` is asked for its open pages again; each completed page is
persisted (a restart asks only for the open ones) and pushes the
registration deadline out to a full ``registration_s`` away.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.epoch_work import SEAL_PAGES_KEY, EpochWork
from ursa.coordinator.round_state import Stage
from ursa.coordinator.seal_pages import BoxVerdict
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.store_slot import StoreSlot
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import PaillierPublicKey
from ursa.protocol.envelope import encode, signing_bytes
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    ErrorCode,
    SealedKeys,
    SealedSecretKey,
    SealRequest,
)
from ursa.protocol.router import RejectedError, Router

__all__ = ["SEALING_STAGES", "KeySealing"]

logger = logging.getLogger("ursa.coordinator")

SEALING_STAGES = (Stage.KEY_EPOCH, Stage.REGISTRATION)
"""The stages in which the agent's boxes are relayed."""


class KeySealing:
    """The agent's key and its boxes (module docstring).

    Args:
        config: The federation, key size, page size and deadlines.
        stages: The run's `RoundState` (its registration deadline moves out).
        devices: The enrolled devices' identity keys and certificates.
        outgoing: The signing point and outbox.
        clock: Seconds (a stalled agent is asked again).
        epoch: The current key epoch's working copy, or None.
        current: The working copy of the key epoch a message names (raises
            `RejectedError` when it is not current).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        stages: StageMachine,
        devices: EnrolledDevices,
        outgoing: SigningPoint,
        clock: Clock,
        epoch: Callable[[], EpochWork | None],
        current: Callable[[int], EpochWork],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._stages = stages
        self._devices = devices
        self._outgoing = outgoing
        self._clock = clock
        self._epoch = epoch
        self._current = current
        self._store = store

    def register(self, router: Router) -> None:
        """Route the agent's key and boxes here."""
        own = "coordinator"
        router.register(AgentPublicKey, self._on_agent_public_key, owner=own)
        router.register(SealedSecretKey, self._on_sealed_secret_key, owner=own)
        router.register(SealedKeys, self._on_sealed_keys, owner=own)

    def request(self, *, again: bool = False) -> None:
        """Send the agent its next pages (and, `again`, the ones still open)."""
        work = self._epoch()
        if work is None or work.sealing is None:
            return
        paging = work.sealing
        work.sealed_at = self._clock()
        if paging.num_pages == 0:  # the agent is the only recipient: just its key
            self._send_seal_page(work, 0, 1, (work.agent,))
            return
        pages = list(paging.open_pages) if again else []
        pages += paging.open_next()
        for page in pages:
            self._send_seal_page(work, page, paging.num_pages, paging.pages[page])

    def _send_seal_page(
        self, work: EpochWork, page: int, pages: int, devices: tuple[str, ...]
    ) -> None:
        for device in devices:
            if device not in self._devices.identities:  # forgotten (revoked) meanwhile
                self._record_box(work, device)
        keys = tuple(
            device_keys_of(
                self._devices.identities[d], self._devices.certificates.get(d, b"")
            )
            for d in devices
            if d in self._devices.identities
        )
        if not keys:
            return
        request = SealRequest(
            federation=self._config.federation,
            round=self._stages.state.round,
            sender=COORDINATOR,
            epoch=work.epoch,
            page=page,
            pages=pages,
            recipients=keys,
        )
        self._outgoing.send(request, work.agent)

    def nudge(self, now: float) -> None:
        """Ask a stalled agent again for its open pages (lost, or it restarted)."""
        work = self._epoch()
        if work is None or work.public_key is None or work.sealing is None:
            return
        if work.sealing.is_complete or self._stages.state.stage not in SEALING_STAGES:
            return
        if now - work.sealed_at < self._config.deadlines.agent_s:
            return
        logger.warning(
            "key epoch %d: no boxes from agent %s for %.0f s; asking again for "
            "pages %s",
            work.epoch,
            work.agent,
            now - work.sealed_at,
            ", ".join(str(p) for p in work.sealing.open_pages) or "(next)",
        )
        self.request(again=True)

    def _on_agent_public_key(self, message: AgentPublicKey) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._current(message.epoch)
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
                self._devices.identities[device],
                signing_bytes(message),
                message.signature,
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
        payload = encode(message)
        work.public_key = public_key
        work.public_key_msg = payload
        self._store.store.set_public_key(work.epoch, payload)
        self._outgoing.send_raw(payload, "agent_public_key", None)

    def _sealing_agent(self, device: str, epoch: int) -> EpochWork:
        work = self._current(epoch)
        if device != work.agent:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the epoch's agent seals keys"
            )
        return work

    def _on_sealed_keys(self, message: SealedKeys) -> None:
        """A page's boxes: relay each recipient's first, then send the next pages."""
        work = self._sealing_agent(message.sender, message.epoch)
        strangers = [
            b.recipient for b in message.boxes if b.recipient not in work.members
        ]
        if strangers:
            raise RejectedError(
                ErrorCode.UNAUTHORISED,
                f"{strangers[0]} is not a recipient of epoch {work.epoch}",
            )
        completed = [
            page
            for box in message.boxes
            if (page := self._relay_box(work, box.recipient, box.box)) is not None
        ]
        if completed:
            self._sealing_progress(work, completed)

    def _on_sealed_secret_key(self, message: SealedSecretKey) -> None:
        """One box sent on its own (an agent of an earlier version): relay it."""
        work = self._sealing_agent(message.sender, message.epoch)
        if message.recipient not in work.members:
            raise RejectedError(
                ErrorCode.UNAUTHORISED,
                f"{message.recipient} is not a recipient of epoch {work.epoch}",
            )
        page = self._relay_box(work, message.recipient, message.box)
        if page is not None:
            self._sealing_progress(work, [page])

    def _relay_box(self, work: EpochWork, recipient: str, box: bytes) -> int | None:
        """Relay `recipient`'s box unless it had one; the page it completed."""
        verdict, page = self._record_box(work, recipient)
        if verdict is not BoxVerdict.NEW:  # a second box, or one for the agent
            logger.debug("box for %s in epoch %d dropped", recipient, work.epoch)
            return None
        relayed = SealedSecretKey(
            federation=self._config.federation,
            round=0,
            sender=work.agent,
            message_id=derived_id(work.agent, "box", work.epoch, recipient),
            epoch=work.epoch,
            recipient=recipient,
            box=box,
        )
        self._outgoing.send(relayed, recipient)
        return page

    def _record_box(
        self, work: EpochWork, recipient: str
    ) -> tuple[BoxVerdict, int | None]:
        if work.sealing is None:
            return BoxVerdict.NEW, None
        return work.sealing.record(recipient)

    def _sealing_progress(self, work: EpochWork, completed: list[int]) -> None:
        """Pages done: persist, log, push the deadline out, send the next pages."""
        paging = work.sealing
        if paging is None:
            return
        now = self._clock()
        work.sealed_at = now
        through = paging.done_through
        record = {
            "epoch": work.epoch,
            "page_size": self._config.seal_page_size,
            "done_through": through,
        }
        self._store.store.set_meta(SEAL_PAGES_KEY, json.dumps(record))
        total, done = paging.num_pages, paging.pages_done
        tenth = max(1, total // 10)
        for page in completed:
            milestone = done == total or (page + 1) % tenth == 0
            logger.log(
                logging.INFO if milestone else logging.DEBUG,
                "key epoch %d: sealed page %d of %d (%d of %d pages done)",
                work.epoch,
                page + 1,
                total,
                done,
                total,
            )
        state = self._stages.state
        if state.stage not in SEALING_STAGES:
            return  # registration closed: late pages would serve nobody
        if state.stage is Stage.REGISTRATION and state.deadline_at is not None:
            deadline = now + self._config.deadlines.registration_s
            if deadline > state.deadline_at:
                self._stages.set(dataclasses.replace(state, deadline_at=deadline))
        self.request()
