"""The coordinator's inbox: every message heard, from the wire to its handler.

Admission (`ursa.coordinator.admission`) judges topic, size and rate,
decoding, federation, sender, run and enrolment; the inbox then takes a
site bridge's state to the outage, a status to the presence, and anything
else, unless already seen (message id or natural key, persisted), to its
handler in one store transaction: the router's (the key epoch's, the
selection method's, FLICKER's and the runtime's own: Hello, ErrorReply,
Heartbeat), else in an open round the methods' before-training steps'
(`ursa.coordinator.step_runner`), else the training plugin's. A refused message
is answered (`Rejections`) and marked seen unless the refusal depends on
when it came. After every message the stage loop runs, so a phase that
message completed moves on at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ursa.coordinator.admission import Admission
from ursa.coordinator.balancing import Balancing
from ursa.coordinator.broker_outage import BrokerOutage
from ursa.coordinator.clock import Clock
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.enrolment import enrol_result
from ursa.coordinator.error_replies import ErrorReplies
from ursa.coordinator.identity_refusals import IdentityRefusals
from ursa.coordinator.key_epoch import KeyEpoch
from ursa.coordinator.natural_keys import natural_key
from ursa.coordinator.plugin import RoundPlugin
from ursa.coordinator.presence import Presence
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.rejections import Rejections
from ursa.coordinator.round_cycle import RoundCycle
from ursa.coordinator.round_state import Stage
from ursa.coordinator.selection_method import SelectionMethod
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.stage_machine import StageMachine
from ursa.coordinator.step_runner import StepRunner
from ursa.coordinator.store_slot import StoreSlot
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import (
    BaseMessage,
    ChunkRequest,
    ErrorCode,
    ErrorReply,
    Heartbeat,
    Hello,
    Status,
)
from ursa.protocol.messages.secure_mean import MEAN_REFUSED
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.topics import parse_bridge_state

__all__ = ["TRANSIENT_CODES", "Inbox"]

logger = logging.getLogger("ursa.coordinator")

TRANSIENT_CODES = frozenset(
    {ErrorCode.LATE, ErrorCode.WRONG_ROUND, ErrorCode.WRONG_EPOCH}
)
"""Refusals that depend on when a message came, not on what it says: such a
message is not marked seen, so the device's retransmission is judged afresh."""


class Inbox:
    """Admits, de-duplicates, routes and steps (module docstring).

    Args:
        config: The federation id.
        router: The handlers; the inbox adds the runtime's own.
        admission: Judges each raw message.
        presence: Who is online (statuses, last wills, returns).
        devices: The enrolled devices (Hello, refusals of our identity).
        key_epoch: Told of arrivals, departures, refusals and sit-outs.
        rounds: The open round (the plugin's messages go to it).
        stages: The run's `RoundState`.
        plugin: The training plugin (its messages and failed devices).
        steps: The methods' before-training steps (their messages, refused means).
        selection: The selection method (its answers' natural keys).
        flicker: FLICKER's coordinator half, if the federation runs it.
        outage: Site bridges' states.
        outgoing: The signing point and outbox.
        identity_refusals: Checks a device's signed refusal of our identity.
        rejections: The refusal path.
        refusals: The refusal lines, within limits (error replies).
        clock: Seconds.
        identity: The coordinator's public identity (once started).
        certificate: The coordinator's operator certificate (b"": tofu).
        step: Runs the stage loop.
        store: The runtime's store (seen ids, presence).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        router: Router,
        admission: Admission,
        presence: Presence,
        devices: EnrolledDevices,
        key_epoch: KeyEpoch,
        rounds: RoundCycle,
        stages: StageMachine,
        plugin: RoundPlugin,
        steps: StepRunner,
        selection: SelectionMethod,
        flicker: Balancing | None,
        outage: BrokerOutage,
        outgoing: SigningPoint,
        identity_refusals: IdentityRefusals,
        rejections: Rejections,
        refusals: RefusalLog,
        clock: Clock,
        identity: Callable[[], DevicePublicIdentity],
        certificate: Callable[[], bytes],
        step: Callable[[float], None],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._router = router
        self._admission = admission
        self._presence = presence
        self._devices = devices
        self._key_epoch = key_epoch
        self._rounds = rounds
        self._stages = stages
        self._plugin = plugin
        self._steps = steps
        self._selection = selection
        self._flicker = flicker
        self._outage = outage
        self._outgoing = outgoing
        self._identity_refusals = identity_refusals
        self._reject = rejections.reject
        self._clock = clock
        self._identity = identity
        self._certificate = certificate
        self._step = step
        self._store = store
        own = "coordinator"
        replies = ErrorReplies(
            refusals,
            clock=clock,
            epoch=lambda: stages.state.epoch,
            refused=self._refused_by_reply,
            sit_out=key_epoch.sit_out,
            failed=self._device_failed,
        )
        router.register(Hello, self._on_hello, owner=own)
        router.register(ErrorReply, replies.on_error_reply, owner=own)
        router.register(Heartbeat, lambda m: None, owner=own)

    def admit(
        self, topic: str, payload: bytes, now: float, *, charged: bool = False
    ) -> None:
        """Judge one message (``charged``: its admission token is already taken)."""
        link = parse_bridge_state(topic, payload)
        if link is not None:
            self._outage.site_link(*link, now)
            return
        admitted = self._admission.judge(topic, payload, now, charged=charged)
        if admitted is None:
            return
        device, message, kind = admitted.device, admitted.message, admitted.kind
        if admitted.on_status_topic:
            self._on_status(device, message, now)
            return
        store = self._store.store
        natural = natural_key(message, self._selection)  # its record de-duplicates it
        if store.is_duplicate(message.message_id, natural):
            logger.debug(
                "duplicate %s %s from %s ignored", kind, message.message_id, device
            )
            return
        with store.transaction():  # joins the open batch (group commit)
            if device in self._devices.identities and self._presence.arrived(device):
                store.set_online(device, True)
                self._key_epoch.arrived(device)
            try:
                self._dispatch(message)
            except RejectedError as exc:
                self._reject(device, kind, exc.code, exc.reason, message.message_id)
                if exc.code not in TRANSIENT_CODES:
                    store.mark_seen(message.message_id, now)
            else:
                logger.debug(
                    "%s of round %d from %s admitted", kind, message.round, device
                )
                if natural is None:
                    store.mark_seen(message.message_id, now)
            self._step(now)

    def _dispatch(self, message: BaseMessage) -> None:
        """The router's handler, else the training plugin's (in an open round)."""
        if self._router.dispatch(message) is not Dispatch.UNHANDLED:
            return
        kind = message_kind(message)
        state, work, send = self._stages.state, self._rounds.work, self._outgoing.send
        if isinstance(message, ChunkRequest):  # downloads, in any stage
            if self._flicker is None or not self._flicker.answers(message):
                self._plugin.on_message(state.round, message, send)
        elif state.stage is Stage.TRAINING and work is not None:
            if message.round != work.round:
                raise RejectedError(
                    ErrorCode.WRONG_ROUND, f"round {message.round} not open"
                )
            if not self._steps.dispatch(message):  # the next step opens at the step
                self._plugin.on_message(work.round, message, send)
        else:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"a device may not send {kind} now"
            )

    def _on_status(self, device: str, message: BaseMessage, now: float) -> None:
        if not isinstance(message, Status):
            self._reject(
                device,
                message_kind(message),
                ErrorCode.MALFORMED,
                "only status messages go on the status topic",
                message.message_id,
            )
            return
        if device not in self._devices.identities:
            if message.online:  # its hello may have preceded our subscription
                reason = "device is not enrolled (send hello)"
                code = ErrorCode.UNKNOWN_DEVICE  # a race: its hello is on the way
                self._reject(device, "status", code, reason, None, race=True)
            return
        presence, store = self._presence, self._store.store
        with store.transaction():
            if message.online:
                if not presence.arrived(device):
                    return
                logger.info("%s is online", device)
                store.set_online(device, True)
                self._key_epoch.arrived(device)
            elif presence.left(device, now):
                logger.info("%s is offline", device)
                self.departed({device})
            elif device in presence.held:
                logger.info("%s is offline (held: a possible outage)", device)
                for held in presence.held:  # a burst takes earlier departures back
                    store.set_online(held, True)
                return
            else:
                return
            self._step(now)

    def departed(self, devices: set[str]) -> None:
        """Record departures the presence applied (last wills, or a hold ended)."""
        store = self._store.store
        for device in sorted(devices):
            store.set_online(device, False)
            self._key_epoch.left(device)
            if self._flicker is not None:
                self._flicker.device_left(device)

    def _on_hello(self, message: Hello) -> None:
        device = message.sender  # admission checked it is the topic's device
        decision = self._devices.hello(message)
        state = self._stages.state
        reply = enrol_result(
            decision,
            self._identity(),
            federation=self._config.federation,
            round_index=state.round,
            device_id=device,
            epoch=state.epoch or None,
            certificate=self._certificate(),
        )
        if reply.accepted:
            reply = self._outgoing.sign(reply)
            self._identity_refusals.sent(reply)  # the one it may refuse
        self._outgoing.send(reply, device)

    def _refused_by_reply(self, message: ErrorReply) -> None:
        """A device refused our identity: check its signed reply, count it out."""
        device = message.sender
        self._identity_refusals.check(message, self._devices.identities[device])
        if self._devices.refused_by(device, message.reason):
            self._key_epoch.rekey_for_refusal(device)  # rate-limited per device

    def _device_failed(self, round_index: int, device: str, code: str) -> None:
        """A selected device's work failed: the open round stops waiting for it."""
        work = self._rounds.work
        training = self._stages.state.stage is Stage.TRAINING
        if training and work is not None and round_index == work.round:
            if code == MEAN_REFUSED:  # a step's mean: its result may not come
                self._steps.refused(work.round, device)
            self._plugin.on_device_failed(work.round, device, code)
