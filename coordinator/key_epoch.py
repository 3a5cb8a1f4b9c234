"""The key epoch: the Paillier key every encrypted sum uses, and who holds it.

`KeyEpoch` owns the key epoch's stages (ENROLMENT, BALANCING, KEY_EPOCH,
REGISTRATION), its working copy (`EpochWork`, `EpochSets`), the one
read-only `EpochView` methods and the status see, and the devices it can
count (`ReadyDevices`); the agent's key and boxes are `KeySealing`'s
(`key_sealing`), the agent's check of the registrations `RegistryVerdicts`'
(`registry_verdicts`). It is handed its collaborators; the round cycle opens
the first round of a keyed epoch (``open_round``).

Enrolment and balancing: once ``min_devices`` (later the quorum) are online,
FLICKER's balancing runs first if the federation has it, then the first key
epoch starts.

Every method that sums under encryption (Dubhe's registry and tries, CLIMB's
dual step, FedDisk's MADE loss) uses the epoch's key; none owns it. The
stages follow Dubhe Fig. 4.

Key epoch: a random online enrolled device becomes the agent; the signed
`KeyEpochStart` (retained) names it, carries its enrolled identity keys (so
every recipient can verify the agent and open its box), the registry
parameters and the global model's tensor spec (the plugin's `model_spec`:
every device checks its own model against it before it registers); the agent
gets the recipients' keys in `SealRequest` pages
(`ursa.coordinator.seal_pages`: a few pages at a time, the next as the boxes
of one come back). The agent's signed `AgentPublicKey` is verified and
relayed (retained); the boxes of each page come back in `SealedKeys` and each
is relayed to its recipient unopened, as a `SealedSecretKey` (the coordinator
cannot open it), once. An agent silent past the deadline is replaced by
another (a new epoch number); one whose sealing stalls is asked for its open
pages again. A device that refuses this coordinator's identity while the
epoch counts it (a signed refusal naming our acceptance,
`ursa.coordinator.identity_refusals`) makes it key again without it, at
most ``[key_epochs] refusal_rekeys`` times per device per window; beyond
that the device sits the epoch out.

Registration: each recipient's encrypted one-hot registry (one party, the
epoch key, the codebook's length) joins a running sum, once per device; when
every online recipient has registered, or at the deadline, the agent checks
each registration is one-hot on an anonymous shuffled list
(`ursa.coordinator.registry_verdicts`: refused registrants leave the epoch and
the sum), then the encrypted `RegistrySum` of the others is published
(retained) and the first round opens. Under
Dubhe's stratified draw a registration carries a one-time public key for
the rank hand-out: the key epoch keeps the registry ciphertext and hands the
registration to the selection method in the same transaction
(`SelectionMethod.registered`), which keeps the key in its own records; a
registration whose draw differs is refused (``method_mismatch``). Whom it
still waits for is a pending set built once when registration opens and
shrunk by each registration, departure and sit-out, so a message costs the
same at any fleet size. Each completed page pushes the deadline out to a full
`registration_s` away: a large fleet's sealing takes as long as it takes
while the agent makes progress.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set

import numpy as np

from ursa.coordinator.balancing import Balancing
from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.epoch_work import (
    SEAL_PAGES_KEY,
    EpochSets,
    EpochWork,
    sealed_through,
)
from ursa.coordinator.identity_refusals import REFUSAL_REKEYS_KEY, IdentityRefusals
from ursa.coordinator.key_sealing import SEALING_STAGES, KeySealing
from ursa.coordinator.plugin import EpochView, RoundPlugin
from ursa.coordinator.presence import Presence
from ursa.coordinator.ready_devices import ReadyDevices
from ursa.coordinator.registry_verdicts import RegistryVerdicts
from ursa.coordinator.round_state import RoundState, Stage, advance
from ursa.coordinator.seal_pages import SealPaging
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.store_slot import StoreSlot
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import (
    PaillierPublicKey,
    add_encrypted,
    encrypted_vector_from,
)
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import decode
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    ErrorCode,
    KeyEpochStart,
    Registration,
    RegistrySum,
)
from ursa.protocol.router import RejectedError, Router

__all__ = ["KeyEpoch"]

logger = logging.getLogger("ursa.coordinator")


class KeyEpoch:
    """The key epoch's stages, handlers and working copy (module docstring).

    Args:
        config: Registry, quorum, key size, page size and deadlines.
        stages: The run's `RoundState`.
        devices: The enrolled devices (identity keys and certificates).
        presence: Who is online.
        outgoing: The signing point and outbox.
        identity_refusals: Which refusals of our identity count.
        plugin: The training plugin (its aggregation mode and model spec are
            signed), looked up when an epoch starts: it is built after the
            key epoch, with the methods' context.
        flicker: FLICKER's coordinator half, if the federation runs it.
        ready: The online enrolled devices not refusing us (built before the
            key epoch: the methods' context, which FLICKER is built with,
            reads its view).
        rng: Chooses the agent.
        clock: Seconds (the sealing's and the check's nudges).
        open_round: Opens the first round of a keyed epoch.
        forget_round: Drops the open round (a new key epoch starts).
        registered: Hands an accepted registration to the selection method
            (`SelectionMethod.registered`) in the registration's transaction,
            so what the method keeps of it (Dubhe's rank key) is written with
            the registration or not at all.
        store: The runtime's store (epochs, registrations), handed on to the
            sealing, the registry check and the ready set.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        stages: StageMachine,
        devices: EnrolledDevices,
        presence: Presence,
        outgoing: SigningPoint,
        identity_refusals: IdentityRefusals,
        plugin: Callable[[], RoundPlugin],
        flicker: Balancing | None,
        ready: ReadyDevices,
        rng: np.random.Generator,
        clock: Clock,
        open_round: Callable[[float], None],
        forget_round: Callable[[], None],
        registered: Callable[[int, Registration], None],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._stages = stages
        self._devices = devices
        self._presence = presence
        self._outgoing = outgoing
        self._identity_refusals = identity_refusals
        self._plugin = plugin
        self._flicker = flicker
        self._rng = rng
        self._clock = clock
        self._open_round = open_round
        self._forget_round = forget_round
        self._registered = registered
        self._ready = ready
        self._store = store
        self._work: EpochWork | None = None
        self._sealing = KeySealing(
            config,
            stages=stages,
            devices=devices,
            outgoing=outgoing,
            clock=clock,
            epoch=lambda: self._work,
            current=self._current_epoch,
            store=store,
        )
        self._verdicts = RegistryVerdicts(
            config,
            stages=stages,
            presence=presence,
            devices=devices,
            outgoing=outgoing,
            clock=clock,
            current=self._current_epoch,
            new_epoch=self.start,
            changed=self._sets_changed,
            store=store,
        )
        self._view: EpochView | None = None
        self._sets: EpochSets | None = None
        """`sets`' current value (None: build it at the next call)."""

    # --- what others read -----------------------------------------------------

    @property
    def work(self) -> EpochWork | None:
        """The current key epoch's working copy (None before the first)."""
        return self._work

    @property
    def ready(self) -> Set[str]:
        """Online enrolled devices not refusing us (maintained: O(1) to get)."""
        return self._ready.ready

    def sitting_out(self) -> Set[str]:
        """Devices sitting the current key epoch out."""
        return self._ready.sitting_out()

    @property
    def online(self) -> Set[str]:
        """`ready` without the devices sitting the epoch out (a live view)."""
        return self._ready.view

    def view(self) -> EpochView | None:
        """The current key epoch's public data: one object per epoch and key.

        Its ``registered`` is the live set (read-only: a copy per call is
        O(N)); it is made again only when the epoch or its key changes.
        """
        work = self._work
        if work is None:
            return None
        view = self._view
        if (
            view is None
            or view.epoch != work.epoch
            or (view.public_key is not work.public_key)
        ):
            view = self._view = EpochView(
                work.epoch,
                work.public_key,
                work.registered,
                work.agent,
                self._devices.identities.get(work.agent),
            )
        return view

    def sets(self) -> EpochSets | None:
        """Who the current key epoch's rounds draw from (None without an epoch).

        Built on the first call after a new key epoch or a restore: O(N) once
        per epoch, sorted by id so the order does not depend on string
        hashing. Kept per event afterwards (`device_changed`).
        """
        work = self._work
        if work is None:
            return None
        sets = self._sets
        if sets is None or sets.work is not work:
            online, view = self._presence.online, self._ready.view
            sets = EpochSets(
                work,
                IndexedDevices(sorted(d for d in work.registered if d in view)),
                {d for d in work.members if d in online},
            )
            self._sets = sets
        return sets

    # --- device events --------------------------------------------------------

    def device_changed(self, device: str) -> None:
        """A presence, enrolment or refusal change of `device` (O(1))."""
        self._ready.touch(device)
        self._sets_changed(device)

    def _sets_changed(self, device: str) -> None:
        """Bring `device`'s membership of the `EpochSets` up to date (O(1))."""
        sets = self._sets
        if sets is None or sets.work is not self._work:
            return  # built from scratch at the next `sets`
        work = sets.work
        if device in work.registered and device in self._ready.view:
            sets.eligible.add(device)
        else:
            sets.eligible.discard(device)
        if device in work.members and device in self._presence.online:
            sets.members_online.add(device)
        else:
            sets.members_online.discard(device)

    def left(self, device: str) -> None:
        """`device` went offline: registration no longer waits for it."""
        if self._work is not None:
            self._work.left(device)

    def sit_out(self, device: str, why: str = "") -> None:
        """Leave `device` out of the current key epoch (persisted for a restart)."""
        self._ready.sit_out(device, why)
        self.left(device)
        self._sets_changed(device)

    def revoked(self, stale: dict[str, str]) -> None:
        """Devices forgotten while running: a new key epoch if one held the key.

        A forgotten member of the current key epoch holds its secret key
        (agent or not, it could decrypt the epoch's sums while its broker
        login lives), so the next round waits for a new key epoch without it.
        """
        work = self._work
        holders = sorted(stale.keys() & work.members) if work is not None else []
        if holders and work is not None:
            logger.warning(
                "key epoch %d's key is held by %s: a new key epoch before the "
                "next round",
                work.epoch,
                ", ".join(f"{d} ({stale[d]})" for d in holders),
            )
            self._stages.mark_rekey()

    def register(self, router: Router) -> None:
        """Route the key epoch's messages here."""
        self._sealing.register(router)
        self._verdicts.register(router)
        own = "coordinator"
        router.register(Registration, self._on_registration, owner=own)

    def extend_deadlines(self, seconds: float) -> None:
        """An outage's time back for the agent's nudges (a live phase)."""
        work = self._work
        if work is None:
            return
        work.sealed_at += seconds
        if work.check is not None:
            work.check.sent_at += seconds

    # --- restart --------------------------------------------------------------

    def restore(self, state: RoundState | None) -> None:
        """Reload the sit-outs, the ready set and ``state``'s key epoch."""
        store = self._store.store
        self._ready.restore()
        self._sets = None
        record = store.epoch(state.epoch) if state is not None and state.epoch else None
        if record is None:
            return
        cfg = self._config
        registered = set(record.registered)
        sealing = SealPaging.plan(
            record.recipients,
            record.agent,
            page_size=cfg.seal_page_size,
            done_through=sealed_through(
                store.get_meta(SEAL_PAGES_KEY), record.epoch, cfg.seal_page_size
            ),
        )
        # the boxes of a page completed just before the kill may have died in
        # the outbox: whoever has not registered is sealed for again
        sealing.reopen(d for d in record.recipients if d not in registered)
        work = EpochWork(
            record.epoch,
            record.agent,
            record.recipients,
            record.notice,
            public_key_msg=record.public_key_msg,
            registered=registered,
            registry_sum_msg=record.registry_sum_msg,
            sealing=sealing,
        )
        if record.public_key_msg is not None:
            message = decode(record.public_key_msg)
            assert isinstance(message, AgentPublicKey)
            work.public_key = PaillierPublicKey.from_bytes(message.public_key)
            if record.running_sum is not None:
                work.running_sum = encrypted_vector_from(
                    record.running_sum, work.public_key
                )
        self._work = work

    def republish(self, stage: Stage) -> None:
        """Send again what the restored ``stage`` waits on (answered idempotently)."""
        work = self._work
        if work is None:
            return
        send = self._outgoing.send_raw
        send(work.notice, "key_epoch_start", None)
        if work.public_key_msg is not None:
            send(work.public_key_msg, "agent_public_key", None)
        if work.registry_sum_msg is not None:
            send(work.registry_sum_msg, "registry_sum", None)
        unsealed = work.sealing is not None and not work.sealing.is_complete
        if stage is Stage.KEY_EPOCH or (stage is Stage.REGISTRATION and unsealed):
            self._sealing.request()  # the pages not known complete, again

    # --- the stages -----------------------------------------------------------

    def stage_enrolment(self, now: float) -> None:
        """Enough devices online: FLICKER's balancing first, else a key epoch."""
        cfg = self._config
        first = self._stages.state.epoch == 0
        needed = cfg.min_devices if first else cfg.epoch_quorum()
        if len(self._ready.ready) >= needed:
            if self._flicker is not None and not self._flicker.is_over:
                self._stages.advance(Stage.BALANCING, now, None)
                return
            self.start(now, frozenset())

    def stage_balancing(self, now: float) -> None:
        """FLICKER's run (its own deadlines), then the first key epoch."""
        if self._flicker is None or self._flicker.step(now, self._ready.ready):
            self.start(now, frozenset())

    def start(self, now: float, exclude: frozenset[str]) -> None:
        """Open a new key epoch with a random online agent not in `exclude`."""
        cfg = self._config
        online = sorted(self._ready.ready)
        quorum = (
            cfg.min_devices if self._stages.state.epoch == 0 else cfg.epoch_quorum()
        )
        if len(online) < quorum:  # whatever asked for the epoch
            if self._stages.state.stage is not Stage.ENROLMENT:
                logger.warning(
                    "a new key epoch needs %d devices online (quorum), %d are; "
                    "waiting for the fleet",
                    quorum,
                    len(online),
                )
                self._stages.advance(Stage.ENROLMENT, now, None)
            return
        candidates = [d for d in online if d not in exclude] or online
        if not candidates:
            logger.warning("no online enrolled device can be the agent; waiting")
            if self._stages.state.stage is Stage.KEY_EPOCH:
                self._stages.advance(Stage.KEY_EPOCH, now, cfg.deadlines.key_epoch_s)
            return
        recipients = tuple(online[: cfg.registry.max_parties])
        agent = candidates[int(self._rng.integers(len(candidates)))]
        epoch = self._stages.state.epoch + 1
        registry = cfg.registry
        notice = self._outgoing.sign(
            KeyEpochStart(
                federation=cfg.federation,
                round=self._stages.state.round,
                sender=COORDINATOR,
                epoch=epoch,
                agent=agent,
                agent_keys=device_keys_of(
                    self._devices.identities[agent],
                    self._devices.certificates.get(agent, b""),
                ),
                num_classes=registry.num_classes,
                groups=registry.groups,
                sigma=registry.sigma,
                max_parties=registry.max_parties,
                key_bits=cfg.key_bits,
                methods=cfg.method_names(),
                method_settings=cfg.method_settings(),
                aggregation=self._plugin().aggregation_mode(),
                model_spec=self._plugin().model_spec(),
            )
        )
        payload = self._outgoing.encode(notice)
        self._store.store.add_epoch(epoch, agent, recipients, payload)
        self._work = EpochWork(
            epoch,
            agent,
            recipients,
            payload,
            sealing=SealPaging.plan(recipients, agent, page_size=cfg.seal_page_size),
        )
        self._forget_round()
        self._stages.set(
            advance(
                self._stages.state,
                Stage.KEY_EPOCH,
                epoch=epoch,
                rekey=False,
                deadline_at=now + cfg.deadlines.key_epoch_s,
            )
        )
        logger.info(
            "key epoch %d: agent %s, %d recipients", epoch, agent, len(recipients)
        )
        self._outgoing.send_raw(payload, "key_epoch_start", None)
        self._sealing.request()

    def stage_key_epoch(self, now: float) -> None:
        """The agent's key relayed: registration; an agent silent: another."""
        work = self._work
        if work is None:
            self.start(now, frozenset())
            return
        if work.public_key is not None:
            self._stages.advance(
                Stage.REGISTRATION, now, self._config.deadlines.registration_s
            )
            self.stage_registration(now)
        elif self._stages.deadline_passed(now):
            logger.warning(
                "agent %s silent for key epoch %d; choosing another agent",
                work.agent,
                work.epoch,
            )
            self.start(now, frozenset({work.agent}))

    def stage_registration(self, now: float) -> None:
        """All online recipients registered (or the deadline): checked, summed."""
        work = self._work
        if work is None or work.public_key is None:
            return
        self._sealing.nudge(now)
        if work.pending is None:  # once per epoch (and after a restart)
            online = work.members & self._presence.online
            work.pending = set(online - self._ready.sitting_out() - work.registered)
        if work.check is None:
            all_in = bool(work.registered) and not work.pending
            if not (all_in or self._stages.deadline_passed(now)):
                return
        if work.running_sum is None:
            logger.warning("key epoch %d: nobody registered; new epoch", work.epoch)
            self.start(now, frozenset({work.agent}))
            return
        if not self._verdicts.checked(work, now):
            return
        message = RegistrySum(
            federation=self._config.federation,
            round=self._stages.state.round,
            sender=COORDINATOR,
            epoch=work.epoch,
            registry_sum=work.running_sum.to_bytes(work.public_key),
            num_parties=len(work.registered),
        )
        payload = self._outgoing.encode(message)
        work.registry_sum_msg = payload
        self._store.store.set_registry_sum(work.epoch, payload)
        logger.info(
            "key epoch %d: registry sum of %d devices published (%d missing)",
            work.epoch,
            len(work.registered),
            len(work.members) - len(work.registered),
        )
        self._outgoing.send_raw(payload, "registry_sum", None)
        self._open_round(now)

    def rekey_for_refusal(self, device: str) -> None:
        """`device` refused our identity: key again if the epoch counted it.

        At most ``[key_epochs] refusal_rekeys`` times per device per window;
        beyond that the device sits the epoch out instead (registration stops
        waiting for it; an agent that sits out is replaced at its deadline, as
        a silent one is), so its refusals cost it, not the fleet.
        """
        work = self._work
        keying = self._stages.state.stage in SEALING_STAGES
        if not keying or work is None or device not in work.members:
            return
        if self._ready.sat_out_of(device) == work.epoch:
            return  # not waited for already
        now = self._clock()
        refusals = self._identity_refusals
        if refusals.may_rekey(device, now):
            self._store.store.set_meta(REFUSAL_REKEYS_KEY, refusals.to_json())
            logger.warning("key epoch %d counted %s; keying again", work.epoch, device)
            self.start(now, frozenset({device}))
            return
        limits = self._config.key_epochs
        logger.warning(
            "%s sits key epoch %d out instead of keying again: one device's "
            "refusals start at most %d key epochs per %g s",
            device,
            work.epoch,
            limits.refusal_rekeys,
            limits.refusal_window_s,
        )
        self.sit_out(device, "refused this coordinator's identity too often")

    def arrived(self, device: str) -> None:
        """A recipient back online while registration is open: wait for it again."""
        work = self._work
        if work is None or work.pending is None or device not in work.members:
            return
        if device in work.registered or self._ready.sat_out_of(device) == work.epoch:
            return
        work.pending.add(device)

    # --- handlers -------------------------------------------------------------

    def _current_epoch(self, epoch: int) -> EpochWork:
        work = self._work
        if work is None or epoch != work.epoch:
            current = None if work is None else work.epoch
            raise RejectedError(
                ErrorCode.WRONG_EPOCH, f"key epoch {epoch} is not current ({current})"
            )
        return work

    def _on_registration(self, message: Registration) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._current_epoch(message.epoch)
        if device not in work.members:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not a member of key epoch {work.epoch}"
            )
        if device in work.registered:
            logger.info("duplicate registration of %s ignored", device)
            return
        closed = (
            self._stages.state.stage is not Stage.REGISTRATION or work.check is not None
        )
        if closed or work.public_key is None:
            raise RejectedError(ErrorCode.LATE, "registration is closed")
        stratified = self._config.stratified_draw()
        if stratified != (message.rank_key is not None):
            raise RejectedError(
                ErrorCode.METHOD_MISMATCH,
                "the federation runs Dubhe's "
                f"{'stratified' if stratified else 'paper'} draw; configure the "
                "device's dubhe [[methods]] entry with the same draw",
            )
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
        store = self._store.store
        with store.transaction():
            store.add_registration(
                work.epoch, device, total.to_bytes(work.public_key), message.registry
            )
            self._registered(work.epoch, message)
        work.running_sum = total
        work.registered.add(device)
        self._sets_changed(device)
        if work.pending is not None:
            work.pending.discard(device)
